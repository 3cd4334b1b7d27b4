"""Discard mode: ``group_by(..., accumulation_mode="discarding")`` emits each
batch's increment of additive aggregates (Beam's discarding fired panes).

The oracle: per batch, the increments equal a one-shot Polars aggregate over
that batch's rows that are not late, with lateness computed here from the
watermark rule (max event time of the earlier batches minus the delay), not
read from the engine; so the sum of a window's increments equals the one-shot
aggregate over every row that was not late.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path

import change_oracle
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracles import windows_of

import microbatch as mb
from microbatch.engine.faults import InjectedFault
from microbatch.plan.windows import WindowSpec
from microbatch.testing import StreamTest

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SCHEMA = {"ts": pl.Datetime("ms", "UTC"), "k": pl.Int64, "v": pl.Int64}
DELAY_MS = 20_000
AGGS = [pl.len().alias("n"), pl.col("v").count().alias("c"), pl.col("v").sum().alias("total")]

events = st.lists(
    st.tuples(
        st.integers(0, 3),
        st.integers(0, 400_000),
        st.one_of(st.none(), st.integers(-50, 50)),
    ),
    min_size=1,
    max_size=60,
)
splits = st.lists(st.integers(0, 60), max_size=8)


def frame(rows: list[tuple[int, int, int | None]]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "ts": [T0 + timedelta(milliseconds=t) for _, t, _ in rows],
            "k": [k for k, _, _ in rows],
            "v": [v for _, _, v in rows],
        },
        schema=SCHEMA,
    )


def batches(rows: list, cuts: list[int]) -> list[pl.DataFrame]:
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(rows)}), len(rows)]
    return [frame(rows[lo:hi]) for lo, hi in itertools.pairwise(bounds)]


def one_shot(batch: pl.DataFrame, wm: int | None, spec: WindowSpec) -> tuple[pl.DataFrame, int]:
    """The batch's increments per (window, k) and its late row count, one-shot.

    A row is late (to the late output) when its oldest window ends at or before
    ``wm - lateness``; only its windows closed by then are dropped: a late
    hopping or cumulating row still counts in its newer windows (Spark's rule, as
    the accumulating aggregation)."""
    cut = None if wm is None else wm - spec.allowed_lateness_ms
    assigned = windows_of(
        spec, batch.with_row_index("__row"), time="ts", keys=["k"], aggs=[], by_row=True
    )
    if cut is None:
        late_rows = 0
        kept = assigned
    else:
        oldest_end = assigned.group_by("__row").agg(pl.col("we").min().alias("oldest"))
        late = oldest_end.filter(pl.col("oldest") <= cut)["__row"]
        late_rows = late.len()
        kept = assigned.filter(pl.col("we") > cut)
    out = kept.group_by("ws", "we", "k").agg(
        pl.len().cast(pl.Int64).alias("n"),
        pl.col("v").count().cast(pl.Int64).alias("c"),
        pl.col("v").sum().alias("total"),
    )
    return out, late_rows


def as_ms(out: pl.DataFrame) -> pl.DataFrame:
    return out.select(
        pl.col("window_start").dt.epoch("ms").alias("ws"),
        pl.col("window_end").dt.epoch("ms").alias("we"),
        "k", "n", "c", "total",
    )


def same(got: pl.DataFrame, want: pl.DataFrame, keys: list[str]) -> None:
    got = got.select(want.columns).sort(keys)
    want = want.sort(keys)
    assert got.equals(want), f"engine:\n{got}\noracle:\n{want}"


WINDOWS = {
    "tumbling": mb.window("ts", "1m"),
    "hopping": mb.window("ts", "1m", slide="20s"),
    "cumulating": mb.cumulate_window("ts", "1m", "20s"),
    "lateness": mb.window("ts", "1m", allowed_lateness="30s"),
}


@pytest.mark.parametrize("name", WINDOWS)
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=events, cuts=splits)
def test_increments_add_up_to_the_one_shot_aggregate(tmp_path_factory, name, rows, cuts) -> None:
    spec = WINDOWS[name]

    def build(src):
        return (src.with_watermark("ts", "20s")
                .group_by(spec, "k", accumulation_mode="discarding").agg(*AGGS))

    test = StreamTest(build, schema=SCHEMA, checkpoint=tmp_path_factory.mktemp("d"))
    assert test.stream.schema == pl.Schema({
        "window_start": SCHEMA["ts"], "window_end": SCHEMA["ts"], "k": pl.Int64,
        "n": pl.Int64, "c": pl.Int64, "total": pl.Int64,
    })
    wm: int | None = None
    max_seen: int | None = None
    wants, late_total = [], 0
    for batch in batches(rows, cuts):
        want, late = one_shot(batch, wm, spec)
        got = test.add(batch).process()
        if got.height:
            # one row per (window, key) per batch, each touched by a row that counts
            assert got.select("window_start", "window_end", "k").is_unique().all()
            assert (got["n"] > 0).all()
        same(as_ms(got) if got.height else want.head(0), want, ["ws", "we", "k"])
        wants.append(want)
        late_total += late
        newest = int(batch["ts"].dt.epoch("ms").max())  # type: ignore[arg-type]
        max_seen = newest if max_seen is None else max(max_seen, newest)
        wm = max_seen - DELAY_MS
    assert test.late_rows.height == late_total
    # the refinement contract: the sum of the increments is the accumulated value
    out = test.output
    window = ["ws", "we", "k"]
    summed = (as_ms(out).group_by(window).agg(pl.col("n", "c", "total").sum())
              if out.height else pl.DataFrame())
    want_all = pl.concat(wants).group_by(window).agg(pl.col("n", "c", "total").sum())
    same(summed if out.height else want_all.head(0), want_all, window)
    test.close()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=events, cuts=splits)
def test_windowless_increments_sum_to_one_shot_group_by(tmp_path_factory, rows, cuts) -> None:
    test = StreamTest(
        lambda s: s.group_by("k", accumulation_mode="discarding").agg(*AGGS),
        schema=SCHEMA, checkpoint=tmp_path_factory.mktemp("w"),
    )
    for batch in batches(rows, cuts):
        got = test.add(batch).process()
        want = batch.group_by("k").agg(
            pl.len().cast(pl.Int64).alias("n"), pl.col("v").count().cast(pl.Int64).alias("c"),
            pl.col("v").sum().alias("total"),
        )
        # emitted in key order
        assert got["k"].to_list() == sorted(got["k"].to_list())
        same(got, want, ["k"])
    summed = test.output.group_by("k").agg(pl.col("n", "c", "total").sum())
    want = frame(rows).group_by("k").agg(
        pl.len().cast(pl.Int64).alias("n"), pl.col("v").count().cast(pl.Int64).alias("c"),
        pl.col("v").sum().alias("total"),
    )
    same(summed, want, ["k"])
    test.close()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=change_oracle.operations, cuts=change_oracle.cuts)
def test_changelog_input_is_sign_weighted(tmp_path_factory, ops, cuts) -> None:
    """Over a changelog, deletes and preimages subtract: the increments per group
    add up to a one-shot group_by of the table the changes leave."""
    test = StreamTest(
        lambda s: s.group_by("g", accumulation_mode="discarding").agg(
            pl.len().alias("n"), pl.col("v").count().alias("c"), pl.col("v").sum().alias("total")),
        schema=change_oracle.SCHEMA, checkpoint=tmp_path_factory.mktemp("c"),
    )
    assert "_change_type" not in test.stream.schema
    frames = change_oracle.change_batches(ops, cuts)
    for changes in frames:
        test.add(changes).process()
    table = change_oracle.oracle(frames)
    want = table.group_by("g").agg(
        pl.len().cast(pl.Int64).alias("n"), pl.col("v").count().cast(pl.Int64).alias("c"),
        pl.col("v").sum().alias("total"),
    )
    out = test.output
    summed = (out.group_by("g").agg(pl.col("n", "c", "total").sum()).filter(pl.col("n") != 0)
              if out.height else want.head(0))
    # a group emptied by deletes adds up to zero (and its sums to zero)
    if out.height:
        emptied = out.group_by("g").agg(pl.col("n", "total").sum()).filter(pl.col("n") == 0)
        assert (emptied["total"] == 0).all()
    same(summed, want, ["g"])
    test.close()


def test_unknown_change_type_is_refused_with_the_values(tmp_path: Path) -> None:
    test = StreamTest(
        lambda s: s.group_by("g", accumulation_mode="discarding").agg(pl.len().alias("n")),
        schema=change_oracle.SCHEMA, checkpoint=tmp_path,
    )
    bad = {"g": ["a"], "k": [1], "v": [1], "note": [""], "_change_type": ["upsert"]}
    unknown = r"with _change_type \['upsert'\]; a changelog's rows are one of"
    with pytest.raises(mb.ChangelogInputError, match=unknown):
        test.add(bad).process()


BUILD_REFUSALS = {
    "mean": (lambda s: s.group_by("k", accumulation_mode="discarding").agg(pl.col("v").mean()),
             r"mean\(v\) as v is not additive.*emit col\.sum\(\) and col\.count\(\)"),
    "min": (lambda s: s.group_by("k", accumulation_mode="discarding").agg(pl.col("v").min()),
            r"min\(v\) as v is not additive"),
    "max": (lambda s: s.group_by("k", accumulation_mode="discarding").agg(pl.col("v").max()),
            r"max\(v\) as v is not additive"),
    "first": (lambda s: s.group_by("k", accumulation_mode="discarding").agg(pl.col("v").first()),
              r"first\(v\) as v is not additive"),
    "last": (lambda s: s.group_by("k", accumulation_mode="discarding").agg(pl.col("v").last()),
             r"last\(v\) as v is not additive"),
    "session": (lambda s: s.with_watermark("ts", "10s").group_by(
        mb.session_window("ts", "30s"), "k", accumulation_mode="discarding"),
        r"refuses mb\.session_window"),
    "ttl": (lambda s: s.group_by("k", ttl="1h", accumulation_mode="discarding"),
            r"takes no ttl="),
    "unknown": (lambda s: s.group_by("k", accumulation_mode="discard"),
                r"use 'accumulating' .* or 'discarding'"),
}


@pytest.mark.parametrize("case", BUILD_REFUSALS)
def test_refused_when_built(case: str) -> None:
    build, message = BUILD_REFUSALS[case]
    with pytest.raises(mb.PlanError, match=message):
        build(mb.read_memory(schema=SCHEMA))


def test_window_over_a_changelog_is_refused_when_built() -> None:
    src = mb.read_memory(schema={**SCHEMA, "_change_type": pl.String})
    with pytest.raises(mb.PlanError, match=r"over a changelog input .* Group without a window"):
        (src.with_watermark("ts", "10s")
         .group_by(mb.window("ts", "1m"), "k", accumulation_mode="discarding")
         .agg(pl.len()))


@pytest.mark.parametrize("mode", ["update", "complete", "changelog"])
def test_only_append_mode(mode: str) -> None:
    stream = (mb.read_memory(schema=SCHEMA)
              .group_by("k", accumulation_mode="discarding").agg(pl.len().alias("n")))
    with pytest.raises(mb.PlanError, match=rf"output_mode='{mode}' cannot carry the increments"):
        stream.write_memory("discard_modes", output_mode=mode)  # type: ignore[arg-type]
    with pytest.raises(mb.PlanError, match="cannot carry the increments"):
        StreamTest(lambda s: s.group_by("k", accumulation_mode="discarding").agg(pl.len()),
                   schema=SCHEMA, output_mode=mode)  # type: ignore[arg-type]


def test_accumulating_is_the_default_and_unchanged() -> None:
    """The default builds the same node as before (checkpoints keep their signature)."""
    from microbatch.plan.nodes import AggregateNode

    src = mb.read_memory(schema=SCHEMA).with_watermark("ts", "10s")
    plain = src.group_by(mb.window("ts", "1m"), "k").agg(pl.len())
    explicit = src.group_by(mb.window("ts", "1m"), "k", accumulation_mode="accumulating").agg(
        pl.len())
    assert type(plain.plan) is type(explicit.plan) is AggregateNode
    assert plain.plan.label() == explicit.plan.label()


ROWS = [(i % 3, i * 7_000 + (i % 4) * 9_000, i) for i in range(60)]


def _windowed(s):
    return (s.with_watermark("ts", "20s")
            .group_by(mb.window("ts", "1m"), "k", accumulation_mode="discarding").agg(*AGGS))


def test_restart_in_the_middle_gives_the_same_increments(tmp_path: Path) -> None:
    cuts = [10, 25, 40]
    straight = StreamTest(_windowed, schema=SCHEMA, checkpoint=tmp_path / "a")
    for batch in batches(ROWS, cuts):
        straight.add(batch).process()
    test = StreamTest(_windowed, schema=SCHEMA, checkpoint=tmp_path / "b")
    parts = batches(ROWS, cuts)
    for batch in parts[:2]:
        test.add(batch).process()
    test.restart()
    for batch in parts[2:]:
        test.add(batch).process()
    assert test.output.height > 0
    assert test.output.equals(straight.output)
    assert test.late_rows.height == straight.late_rows.height
    straight.close()
    test.close()


def test_a_rerun_batch_emits_the_same_increments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash after the sink took batch 2 re-runs it: the same rows, bit for bit."""
    calls: dict[str, list[tuple[int, pl.DataFrame]]] = {"crash": [], "straight": []}

    def start(run: str):
        src = mb.read_memory(frame(ROWS), max_records_per_batch=15)
        return _windowed(src).foreach_batch(lambda df, b: calls[run].append((b, df))).start(
            tmp_path / run, trigger="available-now")

    assert start("straight").await_termination(60)
    monkeypatch.setenv("MICROBATCH_FAULT", "after_sink@2")
    monkeypatch.setenv("MICROBATCH_FAULT_ACTION", "raise")
    query = start("crash")
    with pytest.raises(mb.QueryTerminatedError):
        query.await_termination(60)
    assert isinstance(query.exception, InjectedFault)
    monkeypatch.delenv("MICROBATCH_FAULT")
    assert start("crash").await_termination(60)
    reruns = [df for b, df in calls["crash"] if b == 2]
    assert len(reruns) == 2
    assert reruns[0].height > 0
    assert reruns[0].equals(reruns[1])
    # after the re-run, every batch's increments are those of the run without a crash
    final = dict(calls["crash"])
    straight = dict(calls["straight"])
    assert final.keys() == straight.keys()
    for b, df in straight.items():
        assert final[b].equals(df), b


@pytest.mark.delta
def test_delta_append_sums_to_the_one_shot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ledger: increments appended to Delta, a crash after the Delta commit of
    batch 1 and a restart; the table summed by key is the one-shot group_by."""
    rows = frame([(i % 5, i * 1_000, (i * 37) % 11 - 5) for i in range(200)])
    table, chk = tmp_path / "ledger", tmp_path / "chk"

    def start():
        src = mb.read_memory(rows, max_records_per_batch=30)
        return (src.group_by("k", accumulation_mode="discarding")
                .agg(pl.len().alias("n"), pl.col("v").sum().alias("total"))
                .write_delta(str(table)).start(chk, trigger="available-now"))

    monkeypatch.setenv("MICROBATCH_FAULT", "sink.after_commit@1")
    monkeypatch.setenv("MICROBATCH_FAULT_ACTION", "raise")
    query = start()
    with pytest.raises(mb.QueryTerminatedError):
        query.await_termination(60)
    assert isinstance(query.exception, InjectedFault)
    monkeypatch.delenv("MICROBATCH_FAULT")
    assert start().await_termination(60)
    ledger = pl.read_delta(str(table))
    assert ledger.height == 5 * 7  # 7 batches of 30 (the last 20), every key in each
    got = ledger.group_by("k").agg(pl.col("n", "total").sum()).sort("k")
    want = rows.group_by("k").agg(
        pl.len().cast(pl.Int64).alias("n"), pl.col("v").sum().alias("total")).sort("k")
    assert got.equals(want)
