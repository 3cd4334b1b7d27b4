"""Operators emit changelogs (``_change_type``): the changelog oracle.

Every emitted change, applied in order to an empty table by :func:`apply`
(plain Python, strict: a delete or preimage must match the row the table
holds, an insert must find no row, a postimage must follow its preimage),
gives exactly the one-shot Polars result over the rows that were not late,
for random batch splits (hypothesis). Sessions in ``update`` and
``changelog`` modes, tumbling windows with allowed lateness in ``changelog``
mode, ``fire_once(corrections=True)``, append-only queries, and a restart
in the middle that gives the same changes.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracles import sessions, tumbling_or_hopping

import microbatch as mb
from microbatch.testing import CollectSink, StreamTest
from sinks.base import OutputMode

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SCHEMA = {"id": pl.Int64, "ts": pl.Datetime("ms", "UTC"), "k": pl.Int64, "v": pl.Int64}
AGGS = [
    pl.len().alias("n"),
    pl.col("v").sum().alias("total"),
    pl.col("v").max().alias("hi"),
    pl.col("v").mean().alias("avg"),
]
ORACLE_AGGS = [
    pl.len().cast(pl.Int64).alias("n"),
    pl.col("v").sum().alias("total"),
    pl.col("v").max().alias("hi"),
    pl.col("v").mean().alias("avg"),
]
VALUES = ["n", "total", "hi", "avg"]
WINDOW_KEY = ["window_start", "window_end", "k"]

events = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 300_000), st.integers(-20, 20)),
    min_size=1,
    max_size=40,
)
cut_lists = st.lists(st.integers(0, 40), max_size=6)


def apply(changes: list[pl.DataFrame], key: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The table that applying every change in order to an empty table gives.

    Independent of the engine and of ``sinks.changelog``: one row at a time,
    and strict about what each change claims of the table.
    """
    table: dict[tuple[Any, ...], dict[str, Any]] = {}
    pending: tuple[Any, ...] | None = None
    for frame in changes:
        for row in frame.iter_rows(named=True):
            kind = row.pop("_change_type")
            k = tuple(row[c] for c in key)
            if pending is not None:
                assert kind == "update_postimage", (kind, row)
                assert k == pending, (kind, row)
                pending = None
                table[k] = row
                continue
            if kind == "insert":
                assert k not in table, f"insert of a row the table holds: {row}"
                table[k] = row
            elif kind == "delete":
                assert table.get(k) == row, f"delete of {row}, table holds {table.get(k)}"
                del table[k]
            elif kind == "update_preimage":
                assert table.get(k) == row, f"preimage {row}, table holds {table.get(k)}"
                pending = k
            elif kind == "update_postimage":
                raise AssertionError(f"postimage without its preimage: {row}")
            else:
                raise AssertionError(f"unknown _change_type {kind!r}")
    assert pending is None, "a preimage ends the output"
    return table


def as_table(result: pl.DataFrame, key: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {tuple(r[c] for c in key): r for r in result.iter_rows(named=True)}


def frame(rows: list[tuple[int, int, int]], first_id: int = 0) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "id": list(range(first_id, first_id + len(rows))),
            "ts": [T0 + timedelta(milliseconds=t) for _, t, _ in rows],
            "k": [k for k, _, _ in rows],
            "v": [v for _, _, v in rows],
        },
        schema=SCHEMA,
    )


def run_split(
    build, rows, cuts, tmp: Path, mode: OutputMode, *, restart_at: int | None = None
) -> tuple[StreamTest, list[pl.DataFrame]]:
    """Feed ``rows`` in the batches ``cuts`` makes; every batch's output in order."""
    test = StreamTest(build, schema=SCHEMA, output_mode=mode, checkpoint=tmp)
    bounds = [0, *sorted({c for c in cuts if c < len(rows)}), len(rows)]
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        if hi > lo:
            if i == restart_at:
                test.restart()
            test.add(frame(rows[lo:hi], lo)).process()
    return test, [df for _, df in sorted(test.sink.batches.items()) if df.width]


def not_late(all_rows: pl.DataFrame, test: StreamTest) -> pl.DataFrame:
    late = test.late_rows
    return all_rows if late.height == 0 else all_rows.join(late.select("id"), on="id", how="anti")


def to_output(oracle: pl.DataFrame) -> pl.DataFrame:
    dtype = SCHEMA["ts"]
    return oracle.select(
        pl.from_epoch("ws", "ms").cast(dtype).alias("window_start"),
        pl.from_epoch("we", "ms").cast(dtype).alias("window_end"),
        "k",
        *VALUES,
    )


def sessions_query(src: mb.Stream) -> mb.Stream:
    return src.with_watermark("ts", "20s").group_by(mb.session_window("ts", "30s"), "k").agg(*AGGS)


# ------------------------------------------------------------------ sessions


def test_merged_session_retracts_the_rows_it_replaces(tmp_path: Path) -> None:
    """The motivating bug: [01:00, 01:40) n=1 must go when a row bridges it into
    [00:00, 01:40) n=3, or an upserting table keeps it forever."""
    test = StreamTest(
        lambda s: s.group_by(mb.session_window("ts", "40s"), "k").agg(pl.len().alias("n")),
        schema=SCHEMA,
        output_mode="update",
        checkpoint=tmp_path,
    )
    at = test.at
    first = test.add({"id": [0, 1], "ts": [at("00:00:00"), at("00:01:00")], "k": [1, 1],
                      "v": [0, 0]}).process()
    assert first.select("window_start", "window_end", "n", "_change_type").rows() == [
        (at("00:00:00"), at("00:00:40"), 1, "insert"),
        (at("00:01:00"), at("00:01:40"), 1, "insert"),
    ]
    second = test.add({"id": [2], "ts": [at("00:00:30")], "k": [1], "v": [0]}).process()
    assert second.select("window_start", "window_end", "n", "_change_type").rows() == [
        (at("00:00:00"), at("00:00:40"), 1, "delete"),
        (at("00:01:00"), at("00:01:40"), 1, "delete"),
        (at("00:00:00"), at("00:01:40"), 3, "insert"),
    ]
    # a row inside the session changes its values, not its key: an update
    third = test.add({"id": [3], "ts": [at("00:00:10")], "k": [1], "v": [0]}).process()
    assert third.select("window_start", "window_end", "n", "_change_type").rows() == [
        (at("00:00:00"), at("00:01:40"), 3, "update_preimage"),
        (at("00:00:00"), at("00:01:40"), 4, "update_postimage"),
    ]
    test.close()


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=events, cuts=cut_lists, mode=st.sampled_from(["update", "changelog"]))
def test_session_changes_applied_equal_one_shot_sessions(
    tmp_path_factory, rows, cuts, mode
) -> None:
    test, changes = run_split(sessions_query, rows, cuts, tmp_path_factory.mktemp("s"), mode)
    kept = not_late(frame(rows), test)
    want = to_output(sessions(kept, time="ts", keys=["k"], gap_ms=30_000, aggs=ORACLE_AGGS))
    assert apply(changes, WINDOW_KEY) == as_table(want, WINDOW_KEY)
    test.close()


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=events, cuts=cut_lists, at=st.integers(1, 6))
def test_a_restart_in_the_middle_gives_the_same_changes(tmp_path_factory, rows, cuts, at) -> None:
    _, straight = run_split(sessions_query, rows, cuts, tmp_path_factory.mktemp("a"), "update")
    _, restarted = run_split(
        sessions_query, rows, cuts, tmp_path_factory.mktemp("b"), "update", restart_at=at
    )
    assert len(straight) == len(restarted)
    for one, other in zip(straight, restarted, strict=True):
        assert one.equals(other, null_equal=True)


def test_session_state_survives_a_restart_and_still_retracts(tmp_path: Path) -> None:
    def build(s: mb.Stream) -> mb.Stream:
        return s.group_by(mb.session_window("ts", "40s"), "k").agg(pl.len().alias("n"))

    test = StreamTest(build, schema=SCHEMA, output_mode="changelog", checkpoint=tmp_path)
    at = test.at
    test.add({"id": [0, 1], "ts": [at("00:00:00"), at("00:01:00")], "k": [1, 1], "v": [0, 0]})
    test.process()
    again = test.restart()  # a new engine recovered from the checkpoint's state
    got = again.add({"id": [2], "ts": [at("00:00:30")], "k": [1], "v": [0]}).process()
    assert got.select("window_end", "n", "_change_type").rows() == [
        (at("00:00:40"), 1, "delete"),
        (at("00:01:40"), 1, "delete"),
        (at("00:01:40"), 3, "insert"),
    ]
    again.close()


# ------------------------------------------------------- windows with lateness


def late_window_query(src: mb.Stream) -> mb.Stream:
    return (
        src.with_watermark("ts", "10s")
        .group_by(mb.window("ts", "1m", allowed_lateness="2m"), "k")
        .agg(*AGGS)
    )


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=events, cuts=cut_lists)
def test_window_changes_with_allowed_lateness_equal_one_shot(tmp_path_factory, rows, cuts) -> None:
    test, changes = run_split(
        late_window_query, rows, cuts, tmp_path_factory.mktemp("w"), "changelog"
    )
    kept = not_late(frame(rows), test)
    want = to_output(
        tumbling_or_hopping(kept, time="ts", keys=["k"], size_ms=60_000, slide_ms=60_000,
                            aggs=ORACLE_AGGS)
    )
    assert apply(changes, WINDOW_KEY) == as_table(want, WINDOW_KEY)
    test.close()


def test_a_correction_by_a_late_row_is_a_pre_and_post_image(tmp_path: Path) -> None:
    test = StreamTest(late_window_query, schema=SCHEMA, output_mode="changelog",
                      checkpoint=tmp_path)
    at = test.at
    first = test.add({"id": [0], "ts": [at("00:00:10")], "k": [1], "v": [5]}).process()
    assert first.select("n", "total", "_change_type").rows() == [(1, 5, "insert")]
    # the watermark passes the window's end (01:00); a late row inside the allowance
    test.add({"id": [1], "ts": [at("00:01:30")], "k": [2], "v": [1]}).process()
    late = test.add({"id": [2], "ts": [at("00:00:20")], "k": [1], "v": [7]}).process()
    assert test.late_rows.height == 0
    assert late.select("window_start", "n", "total", "_change_type").rows() == [
        (at("00:00:00"), 1, 5, "update_preimage"),
        (at("00:00:00"), 2, 12, "update_postimage"),
    ]
    test.close()


def test_update_mode_windows_stay_plain_upserts(tmp_path: Path) -> None:
    """A window's key never changes: update mode keeps its upsert rows."""
    test = StreamTest(late_window_query, schema=SCHEMA, output_mode="update", checkpoint=tmp_path)
    out = test.add({"id": [0], "ts": [test.at("00:00:10")], "k": [1], "v": [5]}).process()
    assert "_change_type" not in out.columns
    assert out["n"].to_list() == [1]
    test.close()


# ---------------------------------------------------------- other operators


def test_append_only_query_in_changelog_mode_is_all_inserts(tmp_path: Path) -> None:
    test = StreamTest(lambda s: s.filter(pl.col("v") > 0), schema=SCHEMA,
                      output_mode="changelog", checkpoint=tmp_path)
    out = test.add(frame([(1, 0, 3), (1, 1, -3), (2, 2, 4)])).process()
    assert out.select("v", "_change_type").rows() == [(3, "insert"), (4, "insert")]
    test.close()


def test_fire_once_corrections_in_changelog_mode(tmp_path: Path) -> None:
    def build(s: mb.Stream) -> mb.Stream:
        return (
            s.with_watermark("ts", "10s")
            .group_by(mb.window("ts", "1m"), "k")
            .agg(pl.len().alias("n"))
            .fire_once(pl.col("n") >= 2, corrections=True)
        )

    test = StreamTest(build, schema=SCHEMA, output_mode="changelog", checkpoint=tmp_path)
    at = test.at
    assert test.add(frame([(1, 1_000, 0)])).process().height == 0  # n=1: no firing
    fired = test.add({"id": [1], "ts": [at("00:00:02")], "k": [1], "v": [0]}).process()
    assert fired.select("n", "revision", "_change_type").rows() == [(2, 0, "insert")]
    fixed = test.add({"id": [2], "ts": [at("00:00:03")], "k": [1], "v": [0]}).process()
    assert fixed.select("n", "revision", "_change_type").rows() == [
        (2, 0, "update_preimage"),
        (3, 1, "update_postimage"),
    ]
    assert apply([fired, fixed], WINDOW_KEY)[(at("00:00:00"), at("00:01:00"), 1)]["n"] == 3
    test.close()


# ------------------------------------------------------------------ writers


def test_writer_runs_a_changelog_query_end_to_end(tmp_path: Path) -> None:
    src = mb.read_memory(schema=SCHEMA)
    src.add(frame([(1, 0, 1), (1, 60_000, 1)]))
    sink = CollectSink()
    query = (
        src.group_by(mb.session_window("ts", "40s"), "k").agg(pl.len().alias("n"))
        .write_to(sink, output_mode="changelog")
        .start(tmp_path, trigger="available-now")
    )
    assert query.await_termination()
    src.add(frame([(1, 30_000, 1)], 2))
    query = (
        src.group_by(mb.session_window("ts", "40s"), "k").agg(pl.len().alias("n"))
        .write_to(sink, output_mode="changelog")
        .start(tmp_path, trigger="available-now")
    )
    assert query.await_termination()
    changes = [df for _, df in sorted(sink.batches.items()) if df.width]
    assert [r["n"] for r in apply(changes, WINDOW_KEY).values()] == [3]


def test_unknown_output_mode_names_changelog() -> None:
    src = mb.read_memory(schema=SCHEMA)
    with pytest.raises(mb.PlanError, match="'changelog'"):
        src.write_to(CollectSink(), output_mode="upsert")  # type: ignore[arg-type]
