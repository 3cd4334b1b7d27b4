"""Event-time windows and watermarks against one-shot Polars oracles.

Split invariance: for random events with disorder and late rows, split at
random into batches, the union of the append output equals the one-shot
aggregate of the rows that were not late (lateness judged with the
watermarks the engine recorded), for every window the final watermark closed.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracles import sessions, tumbling_or_hopping, windows_of

import microbatch as mb
from microbatch.checkpoint.files import read_json
from microbatch.plan.windows import WindowSpec
from microbatch.testing import StreamTest

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SCHEMA = {"ts": pl.Datetime("ms", "UTC"), "k": pl.Int64, "v": pl.Int64}
DELAY_MS = 20_000

AGGS = [
    pl.len().alias("n"),
    pl.col("v").sum().alias("total"),
    pl.col("v").min().alias("lo"),
    pl.col("v").max().alias("hi"),
    pl.col("v").mean().alias("avg"),
    pl.col("v").first().alias("first_v"),
    pl.col("v").last().alias("last_v"),
]


def oracle_aggs(time: str = "ts") -> list[pl.Expr]:
    """The same aggregates one-shot; first/last by event time, ties by arrival."""
    return [
        pl.len().cast(pl.Int64).alias("n"),
        pl.col("v").sum().alias("total"),
        pl.col("v").min().alias("lo"),
        pl.col("v").max().alias("hi"),
        pl.col("v").mean().alias("avg"),
        pl.col("v").sort_by(time, maintain_order=True).first().alias("first_v"),
        pl.col("v").sort_by(time, maintain_order=True).last().alias("last_v"),
    ]


events = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 400_000), st.integers(-50, 50)),
    min_size=1,
    max_size=60,
)


def frame(rows: list[tuple[int, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "ts": [T0 + timedelta(milliseconds=t) for _, t, _ in rows],
            "k": [k for k, _, _ in rows],
            "v": [v for _, _, v in rows],
        },
        schema=SCHEMA,
    )


def run_split(build, rows, cuts, tmp: Path) -> StreamTest:
    test = StreamTest(build, schema=SCHEMA, checkpoint=tmp)
    bounds = [0, *sorted(set(cuts)), len(rows)]
    for lo, hi in itertools.pairwise(bounds):
        if hi > lo:
            test.add(frame(rows[lo:hi])).process()
    return test


def not_late(all_rows: pl.DataFrame, test: StreamTest) -> pl.DataFrame:
    """The input minus the rows the engine sent to the late output."""
    late = test.late_rows
    if late.height == 0:
        return all_rows
    key = ["ts", "k", "v"]
    counted = all_rows.with_columns(pl.int_range(pl.len()).over(key).alias("__i"))
    late_i = late.select(key).with_columns(pl.int_range(pl.len()).over(key).alias("__i"))
    return counted.join(late_i, on=[*key, "__i"], how="anti").drop("__i")


def batch_watermarks(test: StreamTest) -> dict[int, int | None]:
    return {p["batch_id"]: p["watermark_ms"] for p in test.progress}


def check_late_rows_were_late(test: StreamTest, oldest_window_end_ms) -> None:
    wm_by_batch = batch_watermarks(test)
    for row in test.late_rows.iter_rows(named=True):
        wm = wm_by_batch[row["batch_id"]]
        assert wm is not None, row
        assert oldest_window_end_ms(row["ts"]) <= wm, row
    assert sum(p["late_rows"] for p in test.progress) == test.late_rows.height


def compare(got: pl.DataFrame, want: pl.DataFrame) -> None:
    cols = ["window_start", "window_end", "k", "n", "total", "lo", "hi", "avg", "first_v", "last_v"]
    got = got.select(cols).sort(cols[:3])
    want = want.select(cols).sort(cols[:3])
    assert got.equals(want), f"engine:\n{got}\noracle:\n{want}"


def to_output(oracle: pl.DataFrame, final_wm: int | None) -> pl.DataFrame:
    closed = oracle.filter(pl.col("we") <= (final_wm if final_wm is not None else -(2**62)))
    return closed.with_columns(
        pl.from_epoch("ws", time_unit="ms")
        .dt.cast_time_unit("ms")
        .dt.replace_time_zone("UTC")
        .alias("window_start"),
        pl.from_epoch("we", time_unit="ms")
        .dt.cast_time_unit("ms")
        .dt.replace_time_zone("UTC")
        .alias("window_end"),
    )


def windows_oracle(spec: WindowSpec, test: StreamTest, kept: pl.DataFrame) -> pl.DataFrame:
    """The one-shot aggregate per (window, k) of the rows that were not late, plus
    each late row in its windows still open in its batch: a late hopping or
    cumulating row still counts in its newer windows (Spark's rule)."""
    late = test.late_rows
    if late.height == 0:
        late = pl.DataFrame(schema={**SCHEMA, "batch_id": pl.Int64})
    wms = batch_watermarks(test)
    late_cut = pl.Series([wms[b] for b in late["batch_id"]], dtype=pl.Int64)
    assigned = [
        windows_of(spec, rows, time="ts", keys=["k"], aggs=[], by_row=True)
        for rows in (
            kept.with_columns(pl.lit(None, pl.Int64).alias("__wm")),
            late.select("ts", "k", "v").with_columns(late_cut.alias("__wm")),
        )
    ]
    still_open = pl.col("we") + spec.allowed_lateness_ms > pl.col("__wm")
    return (
        pl.concat([assigned[0], assigned[1].filter(still_open)])
        .group_by(["ws", "we", "k"], maintain_order=True)
        .agg(oracle_aggs())
    )


def compact_every_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the append buffer combine its partials in place at every batch."""
    from microbatch.operators import window_agg

    monkeypatch.setattr(window_agg, "COMPACT_EVERY", 1)
    monkeypatch.setattr(window_agg, "COMPACT_MIN_ROWS", 1)


@pytest.mark.parametrize("compact", [False, True], ids=["buffer", "compacted"])
@pytest.mark.parametrize(
    "spec",
    [mb.window("ts", "1m"), mb.window("ts", "1m", slide="20s"),
     mb.cumulate_window("ts", "1m", "20s")],
    ids=["tumbling", "hopping", "cumulating"],
)
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=events, cuts=st.lists(st.integers(0, 60), max_size=8))
def test_window_split_invariance(  # noqa: PLR0917
    tmp_path_factory, monkeypatch, compact, spec, rows, cuts
) -> None:
    if compact:
        compact_every_batch(monkeypatch)

    def build(src):
        return src.with_watermark("ts", "20s").group_by(spec, "k").agg(*AGGS)

    test = run_split(build, rows, [c for c in cuts if c < len(rows)], tmp_path_factory.mktemp("w"))
    all_rows = frame(rows)
    kept = not_late(all_rows, test)
    oracle = windows_oracle(spec, test, kept)
    compare(test.output, to_output(oracle, test.watermark_ms))
    oldest_end = lambda ts: (int(ts.timestamp() * 1000) // spec.slide_ms + 1) * spec.slide_ms  # noqa: E731
    check_late_rows_were_late(test, oldest_end)
    # nothing was lost: late rows + kept rows = input
    assert kept.height + test.late_rows.height == all_rows.height
    test.close()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=events, cuts=st.lists(st.integers(0, 60), max_size=8))
def test_session_split_invariance(tmp_path_factory, rows, cuts) -> None:
    def build(src):
        return (
            src.with_watermark("ts", "20s").group_by(mb.session_window("ts", "30s"), "k").agg(*AGGS)
        )

    test = run_split(build, rows, [c for c in cuts if c < len(rows)], tmp_path_factory.mktemp("s"))
    all_rows = frame(rows)
    kept = not_late(all_rows, test)
    oracle = sessions(kept, time="ts", keys=["k"], gap_ms=30_000, aggs=oracle_aggs())
    compare(test.output, to_output(oracle, test.watermark_ms))
    check_late_rows_were_late(test, lambda ts: int(ts.timestamp() * 1000))
    test.close()


def test_tumbling_example_and_late_side_output(tmp_path: Path) -> None:
    test = StreamTest(
        lambda s: (
            s.with_watermark("ts", "10s")
            .group_by(mb.window("ts", "1m"), "k")
            .agg(pl.len().alias("n"), pl.col("v").sum().alias("total"))
        ),
        schema=SCHEMA,
        checkpoint=tmp_path,
    )
    at = test.at
    assert (
        test.add({"ts": [at("00:00:05"), at("00:00:50")], "k": [1, 1], "v": [1, 2]})
        .process()
        .height
        == 0
    )
    # watermark 00:00:40 now; this batch moves it to 00:01:15 -> window [0, 1m) closes
    out = test.add({"ts": [at("00:01:25")], "k": [2], "v": [5]}).process()
    assert out.to_dicts() == [
        {"window_start": at("00:00:00"), "window_end": at("00:01:00"), "k": 1, "n": 2, "total": 3}
    ]
    late = test.add({"ts": [at("00:00:30")], "k": [1], "v": [100]}).process()
    assert late.height == 0
    assert test.late_rows["late_reason"].to_list() == [
        "window ending 2026-01-01T00:01:00.000Z closed by watermark 2026-01-01T00:01:15.000Z"
    ]
    assert test.progress[-1]["late_rows"] == 1
    test.close()


@pytest.mark.parametrize("upgrade", [False, True], ids=["same-engine", "keyed-then-upgrade"])
def test_restart_in_the_middle_gives_identical_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, upgrade: bool
) -> None:
    """With ``upgrade``, the first half runs as engines before the append buffer
    did (a keyed store): after the restart the checkpoint keeps its keyed store
    and gives the same output."""
    from microbatch.operators.window_agg import WindowAggregate

    def build(s):
        return s.with_watermark("ts", "20s").group_by(mb.window("ts", "1m"), "k").agg(*AGGS)

    rows = [(i % 3, i * 7_000, i) for i in range(60)]
    straight = run_split(build, rows, [10, 25, 40], tmp_path / "a")
    with monkeypatch.context() as m:
        if upgrade:
            m.setattr(WindowAggregate, "_can_buffer", lambda self: False)
        test = StreamTest(build, schema=SCHEMA, checkpoint=tmp_path / "b")
        for lo, hi in [(0, 10), (10, 25)]:
            test.add(frame(rows[lo:hi])).process()
        test.restart()
    for lo, hi in [(25, 40), (40, 60)]:
        test.add(frame(rows[lo:hi])).process()
    assert test.output.equals(straight.output)
    assert test.output.height > 0
    layouts = [
        read_json(p, "state-schema").get("layout", "keyed")
        for p in (tmp_path / "b").rglob("schema.json")
    ]
    assert layouts == ["keyed" if upgrade else "append"]
    straight.close()
    test.close()


FLOAT_SCHEMA = {"ts": pl.Datetime("ms", "UTC"), "k": pl.Int64, "v": pl.Float64}


def float_rows(lo: int, hi: int) -> pl.DataFrame:
    """Values whose float sums depend on the order of addition."""
    i = pl.int_range(lo, hi, eager=True)
    return pl.DataFrame({
        "ts": [T0 + timedelta(milliseconds=int(x) * 3_000) for x in i],
        "k": i % 4,
        "v": (i * 0.1 + 1e9 * (i % 3 == 0)).cast(pl.Float64) / 7.0,
    }, schema=FLOAT_SCHEMA)


@pytest.mark.parametrize("compact", [False, True], ids=["buffer", "compacted"])
def test_restart_with_float_sums_is_bit_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compact: bool
) -> None:
    """A restart rebuilds the append buffer from its files (snapshots and
    changelogs): the combined float sums must come out bit for bit the same."""
    if compact:
        compact_every_batch(monkeypatch)

    def build(s):
        return (s.with_watermark("ts", "20s").group_by(mb.window("ts", "10m"), "k")
                .agg(pl.col("v").sum().alias("total"), pl.col("v").mean().alias("avg")))

    cuts = [(0, 40), (40, 90), (90, 150), (150, 230), (230, 400)]
    straight = StreamTest(build, schema=FLOAT_SCHEMA, checkpoint=tmp_path / "a")
    for lo, hi in cuts:
        straight.add(float_rows(lo, hi)).process()
    test = StreamTest(build, schema=FLOAT_SCHEMA, checkpoint=tmp_path / "b")
    for lo, hi in cuts:
        test.add(float_rows(lo, hi)).process()
        test.restart()
    assert test.output.height > 0
    assert test.output.equals(straight.output)
    straight.close()
    test.close()


def test_idle_partition_holds_watermark_unless_idle_timeout(tmp_path: Path) -> None:
    schema = {**SCHEMA, "p": pl.Int32}

    def run(idle):
        test = StreamTest(
            lambda s: (
                s.with_watermark("ts", "10s", idle_timeout=idle)
                .group_by(mb.window("ts", "1m"), "k")
                .agg(pl.len().alias("n"))
            ),
            schema=schema,
            checkpoint=tmp_path / str(idle),
            partition_column="p",
        )
        at = test.at
        test.add({"ts": [at("00:00:01"), at("00:00:02")], "k": [1, 1], "v": [0, 0], "p": [0, 1]})
        test.process()
        for minute in range(1, 5):  # only partition 0 keeps receiving data
            test.advance_clock(60)
            test.add({"ts": [at(f"00:0{minute}:30")], "k": [1], "v": [0], "p": [0]}).process()
        return test

    waiting = run(None)
    assert waiting.watermark_ms == int((waiting.at("00:00:02")).timestamp() * 1000) - 10_000
    assert waiting.output.height == 0
    flowing = run("30s")
    assert flowing.output["n"].to_list()[:1] == [2]
    assert flowing.watermark_ms == int(flowing.at("00:04:20").timestamp() * 1000)
    waiting.close()
    flowing.close()


def test_unmergeable_aggregation_is_refused_when_built() -> None:
    src = mb.read_memory(schema=SCHEMA)
    with pytest.raises(mb.PlanError, match="cannot be computed incrementally"):
        src.group_by("k").agg(pl.col("v").n_unique())


def test_append_window_without_watermark_is_refused() -> None:
    src = mb.read_memory(schema=SCHEMA)
    stream = src.group_by(mb.window("ts", "1m"), "k").agg(pl.len())
    with pytest.raises(mb.PlanError, match=r"needs \.with_watermark"):
        stream.write_memory("x")
    with pytest.raises(mb.PlanError, match="cannot emit a group_by without a window"):
        src.group_by("k").agg(pl.len()).write_memory("y")


def test_update_and_complete_modes(tmp_path: Path) -> None:
    def build(s):
        return s.group_by("k").agg(pl.col("v").sum().alias("total"))

    upd = StreamTest(build, schema=SCHEMA, output_mode="update", checkpoint=tmp_path / "u")
    comp = StreamTest(build, schema=SCHEMA, output_mode="complete", checkpoint=tmp_path / "c")
    for t in (upd, comp):
        first = t.add({"ts": [T0, T0], "k": [1, 2], "v": [1, 2]}).process()
        assert first.sort("k")["total"].to_list() == [1, 2]
        second = t.add({"ts": [T0], "k": [1], "v": [10]}).process()
        t.close()
    assert second.sort("k").to_dicts() == [{"k": 1, "total": 11}, {"k": 2, "total": 2}]  # complete
    assert upd.output.tail(1).to_dicts() == [{"k": 1, "total": 11}]


def test_chained_steps_after_aggregation(tmp_path: Path) -> None:
    test = StreamTest(
        lambda s: (
            s.with_watermark("ts", "0s")
            .group_by(mb.window("ts", "1m"), "k")
            .agg(pl.len().alias("n"))
            .filter(pl.col("n") >= 2)
            .with_columns(alert=pl.lit(True))
        ),
        schema=SCHEMA,
        checkpoint=tmp_path,
    )
    at = test.at
    test.add(
        {"ts": [at("00:00:01"), at("00:00:02"), at("00:00:03")], "k": [1, 1, 2], "v": [0, 0, 0]}
    )
    test.process()
    out = test.add({"ts": [at("00:05:00")], "k": [3], "v": [0]}).process()
    assert out.select("k", "n", "alert").to_dicts() == [{"k": 1, "n": 2, "alert": True}]
    test.close()


def test_changed_aggregation_on_same_checkpoint_is_refused(tmp_path: Path) -> None:
    def one(s):
        return s.with_watermark("ts", "0s").group_by(mb.window("ts", "1m"), "k").agg(pl.len())

    def other(s):
        return (
            s.with_watermark("ts", "0s").group_by(mb.window("ts", "1m"), "k").agg(pl.col("v").sum())
        )

    t = StreamTest(one, schema=SCHEMA, checkpoint=tmp_path)
    t.add({"ts": [T0], "k": [1], "v": [1]}).process()
    t.close()
    with pytest.raises(mb.IncompatibleCheckpointError, match="state"):
        StreamTest(other, schema=SCHEMA, checkpoint=tmp_path)


@pytest.mark.parametrize("kind", ["session", "hopping"])
def test_generated_traffic_at_scale_equals_oracle(tmp_path: Path, kind: str) -> None:
    """Thousands of keys, many batches: state is rewritten, moved and expired a lot."""
    from microbatch.sources.generator import GeneratorSource

    src = GeneratorSource(
        rows_per_second=None,
        total_rows=120_000,
        cards=1_500,
        seed=3,
        late_fraction=0.005,
        start="2026-01-01T00:00:00+00:00",
    )
    o = src.initial_offset()
    data = src.read(o, src.latest_offset(o, capped=False)).data
    spec = (
        mb.session_window("event_time", "30s")
        if kind == "session"
        else mb.window("event_time", "2m", slide="30s")
    )
    test = StreamTest(
        lambda s: (
            s.with_watermark("event_time", "10s")
            .group_by(spec, "card_id")
            .agg(pl.len().alias("n"), pl.col("amount").max().alias("hi"))
        ),
        schema=dict(data.schema),
        checkpoint=tmp_path,
    )
    for i in range(0, data.height, 10_000):
        test.add(data.slice(i, 10_000)).process()
    late_ids = test.late_rows.select("event_id")
    kept = data.join(late_ids, on="event_id", how="anti")
    aggs = [pl.len().cast(pl.Int64).alias("n"), pl.col("amount").max().alias("hi")]
    if kind == "session":
        want = sessions(kept, time="event_time", keys=["card_id"], gap_ms=30_000, aggs=aggs)
    else:
        # a late hopping row still counts in the windows that were open for it
        wms = batch_watermarks(test)
        late = test.late_rows.with_columns(
            pl.col("batch_id").replace_strict(wms, return_dtype=pl.Int64).alias("__wm")
        )
        assigned = pl.concat(
            [
                tumbling_or_hopping(
                    kept.with_columns(pl.lit(None, pl.Int64).alias("__wm")),
                    time="event_time",
                    keys=["card_id"],
                    size_ms=120_000,
                    slide_ms=30_000,
                    aggs=[],
                    by_row=True,
                ),
                tumbling_or_hopping(
                    late.select(*data.columns, "__wm"),
                    time="event_time",
                    keys=["card_id"],
                    size_ms=120_000,
                    slide_ms=30_000,
                    aggs=[],
                    by_row=True,
                ).filter(pl.col("we") > pl.col("__wm")),
            ],
            how="diagonal_relaxed",
        )
        want = (
            assigned.group_by(["ws", "card_id"])
            .agg(aggs)
            .with_columns((pl.col("ws") + 120_000).alias("we"))
        )
    want = want.filter(pl.col("we") <= test.watermark_ms).select("ws", "we", "card_id", "n", "hi")
    got = test.output.select(
        pl.col("window_start").dt.epoch("ms").alias("ws"),
        pl.col("window_end").dt.epoch("ms").alias("we"),
        "card_id",
        "n",
        "hi",
    )
    assert test.late_rows.height > 0
    assert got.height == want.height
    assert got.sort("ws", "card_id").equals(want.sort("ws", "card_id"))
    test.close()


@pytest.mark.parametrize(
    "spec",
    [mb.window("ts", "1m", allowed_lateness="1m"),
     mb.cumulate_window("ts", "1m", "30s", allowed_lateness="1m")],
    ids=["tumbling", "cumulating"],
)
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=events, cuts=st.lists(st.integers(0, 60), max_size=8))
def test_allowed_lateness_last_revision_equals_oracle(tmp_path_factory, spec, rows, cuts) -> None:

    def build(src):
        return src.with_watermark("ts", "20s").group_by(spec, "k").agg(*AGGS)

    test = run_split(build, rows, [c for c in cuts if c < len(rows)], tmp_path_factory.mktemp("l"))
    oracle = windows_oracle(spec, test, not_late(frame(rows), test))
    out = test.output
    window = ["window_start", "window_end", "k"]
    if out.height:
        # revisions of a window are 0, 1, 2... in batch order
        revs = out.group_by(window, maintain_order=True).agg(pl.col("revision"))
        for r in revs["revision"].to_list():
            assert r == list(range(len(r)))
        out = out.group_by(window, maintain_order=True).last()
    compare(out, to_output(oracle, test.watermark_ms))
    wms = batch_watermarks(test)
    step = spec.slide_ms
    for row in test.late_rows.iter_rows(named=True):  # late only past end + lateness
        end = (int(row["ts"].timestamp() * 1000) // step + 1) * step
        assert end + 60_000 <= wms[row["batch_id"]]
    test.close()


def test_allowed_lateness_reemits_corrected_window(tmp_path: Path) -> None:
    test = StreamTest(
        lambda s: (
            s.with_watermark("ts", "10s")
            .group_by(mb.window("ts", "1m", allowed_lateness="2m"), "k")
            .agg(pl.len().alias("n"))
        ),
        schema=SCHEMA,
        checkpoint=tmp_path,
    )
    at = test.at
    test.add({"ts": [at("00:00:05")], "k": [1], "v": [0]}).process()
    first = test.add({"ts": [at("00:01:30")], "k": [2], "v": [0]}).process()
    assert first.select("k", "n", "revision").to_dicts() == [{"k": 1, "n": 1, "revision": 0}]
    again = test.add({"ts": [at("00:00:50")], "k": [1], "v": [0]}).process()  # within 2m
    assert again.select("k", "n", "revision").to_dicts() == [{"k": 1, "n": 2, "revision": 1}]
    test.add({"ts": [at("00:05:00")], "k": [3], "v": [0]}).process()  # wm 4:50: [0,1m) final
    test.add({"ts": [at("00:00:55")], "k": [1], "v": [0]}).process()
    assert test.late_rows.height == 1
    test.close()


def test_one_future_event_does_not_make_everything_late(tmp_path: Path) -> None:
    def run(skew):
        test = StreamTest(
            lambda s: (
                s.with_watermark("ts", "10s", max_future_skew=skew)
                .group_by(mb.window("ts", "1m"), "k")
                .agg(pl.len().alias("n"))
            ),
            schema=SCHEMA,
            checkpoint=tmp_path / str(skew),
        )
        test.advance_clock(60)  # processing time 00:01:00 on the start day
        at = test.at
        test.add({"ts": [at("00:00:10"), at("00:00:20", day=300)], "k": [1, 1], "v": [0, 0]})
        test.process()
        test.add({"ts": [at("00:00:30")], "k": [1], "v": [0]}).process()
        return test

    guarded, unguarded = run("1h"), run(None)
    assert guarded.late_rows.height == 0
    assert guarded.watermark_ms == int(guarded.at("00:00:20").timestamp() * 1000)
    assert unguarded.late_rows.height == 1  # the far-future row pushed the watermark
    guarded.close()
    unguarded.close()


@pytest.mark.parametrize(
    ("size", "step", "words"),
    [("1m", "25s", "not a multiple of step"), ("1m", "0s", "must be positive"),
     ("1m", "soon", "step")],
)
def test_cumulate_window_refuses_bad_sizes(size: str, step: str, words: str) -> None:
    with pytest.raises(mb.PlanError, match=words):
        mb.cumulate_window("ts", size, step)


def test_cumulating_windows_need_window_end_to_join() -> None:
    """The windows of one period share window_start: a per-window join on it
    alone would pair different windows."""
    spec = mb.cumulate_window("ts", "1m", "20s")

    def agg(name: str) -> mb.Stream:
        return (mb.read_memory(schema=SCHEMA).with_watermark("ts", "0s")
                .group_by(spec, "k").agg(pl.len().alias(name)))

    with pytest.raises(mb.PlanError, match="window_end"):
        agg("a").join(agg("b"), on=["window_start", "k"])
    joined = agg("a").join(agg("b"), on=["window_start", "window_end", "k"])
    assert joined.schema.names() == ["window_start", "window_end", "k", "a", "b"]


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=events, cuts=st.lists(st.integers(0, 60), max_size=8))
def test_windowless_first_and_last_are_by_arrival(tmp_path_factory, rows, cuts) -> None:
    """Without a window, ``first``/``last`` are the first and last row to arrive
    per key (Polars' ``first()``/``last()`` over all rows in order), for every
    split into batches; a restart from the checkpoint keeps them."""
    def build(src):
        return src.group_by("k").agg(
            pl.col("v").first().alias("first_v"), pl.col("v").last().alias("last_v"),
            pl.col("ts").first().alias("first_ts"), pl.len().alias("n"),
        )

    test = StreamTest(build, schema=SCHEMA, checkpoint=tmp_path_factory.mktemp("f"),
                      output_mode="complete")
    bounds = [0, *sorted({c for c in cuts if c < len(rows)}), len(rows)]
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        if hi > lo:
            test.add(frame(rows[lo:hi])).process()
        if i == 1:
            test.restart()
    want = frame(rows).group_by("k", maintain_order=True).agg(
        pl.col("v").first().alias("first_v"), pl.col("v").last().alias("last_v"),
        pl.col("ts").first().alias("first_ts"), pl.len().cast(pl.Int64).alias("n"),
    )
    got = test.output.filter(
        pl.col("n") == pl.col("n").max().over("k")
    ).unique(maintain_order=True)
    assert got.sort("k").equals(want.sort("k")), f"{got}\n{want}"
    test.close()
