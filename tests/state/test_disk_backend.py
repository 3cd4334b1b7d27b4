"""Streaming jobs on the on-disk state backend (``state_backend="disk"``) against
one-shot Polars oracles under random batch splits: a window aggregate in update
mode, drop_duplicates and session windows, with restarts in between; and the
backend recorded in the checkpoint (a restart with the other one converts)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import microbatch as mb
from microbatch.checkpoint.files import read_json
from microbatch.testing import StreamTest

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SCHEMA = {"ts": pl.Datetime("ms", "UTC"), "k": pl.Int64, "v": pl.Int64}

rows_strategy = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 300), st.integers(-20, 20)),
    min_size=1, max_size=40,
)
cuts_strategy = st.lists(st.integers(0, 40), max_size=5)
_settings = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def frame(rows: list[tuple[int, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        {"ts": [T0 + timedelta(seconds=s) for _, s, _ in rows], "k": [k for k, _, _ in rows],
         "v": [v for _, _, v in rows]},
        schema=SCHEMA,
    )


def not_late(data: pl.DataFrame, late: pl.DataFrame) -> pl.DataFrame:
    """``data`` without the late rows (equal rows told apart by their occurrence)."""
    cols = list(SCHEMA)
    nth = pl.int_range(pl.len()).over(cols).alias("nth")
    if not late.height:
        return data
    gone = late.select(cols).with_columns(nth)
    return data.with_columns(nth).join(gone, on=[*cols, "nth"], how="anti").drop("nth")


def run(build, rows, cuts, checkpoint: Path, *, output_mode="append", restart_at=None):
    test = StreamTest(build, schema=SCHEMA, output_mode=output_mode, checkpoint=checkpoint,
                      state_backend="disk")
    data = frame(rows)
    bounds = [0, *sorted({c for c in cuts if c < len(rows)}), len(rows)]
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        if hi > lo:
            test.add(data.slice(lo, hi - lo)).process()
        if i == restart_at:
            test.restart()
    return test, data


@_settings
@given(rows=rows_strategy, cuts=cuts_strategy)
def test_update_mode_window_aggregate_on_disk_equals_oracle(tmp_path_factory, rows, cuts) -> None:
    """No watermark: every row counts; the last update per window and key is the
    one-shot group_by."""
    test, data = run(
        lambda s: s.group_by(mb.window("ts", "1m"), "k").agg(
            pl.len().alias("n"), pl.col("v").sum().alias("total"), pl.col("v").max().alias("hi")
        ),
        rows, cuts, tmp_path_factory.mktemp("w"), output_mode="update", restart_at=1,
    )
    got = (test.output.unique(["window_start", "k"], keep="last", maintain_order=True)
           .sort("window_start", "k"))
    want = (
        data.with_columns(pl.col("ts").dt.truncate("1m").alias("window_start"))
        .group_by("window_start", "k")
        .agg(pl.len().cast(pl.Int64).alias("n"), pl.col("v").sum().alias("total"),
             pl.col("v").max().alias("hi"))
        .sort("window_start", "k")
    )
    assert got.select(want.columns).equals(want)
    test.close()


@_settings
@given(rows=rows_strategy, cuts=cuts_strategy)
def test_dedupe_on_disk_equals_oracle(tmp_path_factory, rows, cuts) -> None:
    test, data = run(
        lambda s: s.with_watermark("ts", "30s").drop_duplicates("k", within="1h"),
        rows, cuts, tmp_path_factory.mktemp("d"), restart_at=0,
    )
    kept = not_late(data, test.late_rows)
    want = kept.unique("k", keep="first", maintain_order=True)
    assert test.output.select(list(SCHEMA)).equals(want)
    test.close()


@_settings
@given(rows=rows_strategy, cuts=cuts_strategy)
def test_sessions_on_disk_equal_oracle(tmp_path_factory, rows, cuts) -> None:
    """Sessions closed by the final watermark equal a one-shot sessionization of
    the rows that were not late."""
    test, data = run(
        lambda s: s.with_watermark("ts", "20s").group_by(mb.session_window("ts", "30s"), "k")
        .agg(pl.len().alias("n"), pl.col("v").sum().alias("total")),
        rows, cuts, tmp_path_factory.mktemp("s"), restart_at=1,
    )
    kept = not_late(data, test.late_rows)
    gap = timedelta(seconds=30)
    ordered = kept.sort("k", "ts")
    sessions = (
        ordered.with_columns(
            (pl.col("ts").diff().over("k").fill_null(gap + gap) > gap).cum_sum().over("k")
            .alias("sid"))
        .group_by("k", "sid")
        .agg(pl.col("ts").min().alias("window_start"),
             (pl.col("ts").max() + gap).alias("window_end"),
             pl.len().cast(pl.Int64).alias("n"), pl.col("v").sum().alias("total"))
    )
    wm = test.watermark_ms
    closed = sessions.filter(
        pl.col("window_end").dt.epoch("ms") <= (wm if wm is not None else -(2**62))
    ).drop("sid")
    cols = ["window_start", "window_end", "k", "n", "total"]
    got = test.output.select(cols) if test.output.height else closed.clear().select(cols)
    assert got.sort(cols).equals(closed.select(cols).sort(cols))
    test.close()


def test_backend_is_recorded_and_a_restart_with_the_other_one_converts(tmp_path: Path) -> None:
    def build(s):
        return s.group_by("k").agg(pl.col("v").sum().alias("total"))

    data = frame([(k % 3, k, k) for k in range(30)])
    test = StreamTest(build, schema=SCHEMA, output_mode="update", checkpoint=tmp_path,
                      state_backend="disk")
    test.add(data.slice(0, 10)).process()
    op_dir = tmp_path / "state" / "agg-0"
    assert read_json(op_dir / "backend.json", "state-backend") == {"backend": "lmdb"}
    assert (op_dir / "lmdb" / "data.mdb").exists()
    test.state_backend = "memory"
    test.restart()
    test.add(data.slice(10, 10)).process()  # memory: rebuilt from the files
    assert read_json(op_dir / "backend.json", "state-backend") == {"backend": "memory"}
    assert not (op_dir / "lmdb").exists()
    test.state_backend = "lmdb"
    test.restart()
    test.add(data.slice(20, 10)).process()
    assert (op_dir / "lmdb" / "data.mdb").exists()
    got = test.output.unique("k", keep="last", maintain_order=True).sort("k")
    want = data.group_by("k").agg(pl.col("v").sum().alias("total")).sort("k")
    assert got.select("k", "total").equals(want)
    test.close()


def test_unknown_backend_is_refused() -> None:
    stream = mb.read_memory(schema=SCHEMA).group_by("k").agg(pl.len())
    with pytest.raises(mb.PlanError, match="state_backend must be one of"):
        stream.write_memory("bad_backend", output_mode="update").start(
            trigger="once", state_backend="rocks"
        )


def test_state_on_disk_does_not_count_toward_the_memory_budget(tmp_path: Path) -> None:
    """The same job and budget: in memory the state outgrows it and the query stops;
    on disk it runs to the end with the right result."""
    data = pl.DataFrame({"ts": [T0] * 3000, "k": range(3000), "v": range(3000)}, schema=SCHEMA)

    def writer(name: str):
        source = mb.read_memory(schema=SCHEMA, max_records_per_batch=1000)
        source.add(data)
        return source.group_by("k").agg(pl.col("v").sum().alias("total")).write_memory(
            name, output_mode="update")

    memory = writer("budget_memory").start(tmp_path / "m", trigger="available-now",
                                           state_memory_budget="16KB")
    with pytest.raises(mb.QueryTerminatedError) as info:
        memory.await_termination(60)
    assert isinstance(info.value.__cause__, mb.StateBudgetExceededError)
    disk = writer("budget_disk").start(tmp_path / "d", trigger="available-now",
                                       state_memory_budget="16KB", state_backend="disk")
    assert disk.await_termination(60)
    got = mb.table("budget_disk").sort("k")
    assert got.select("k", "total").equals(data.select("k", pl.col("v").alias("total")))
    assert disk.last_progress is not None
    state = disk.last_progress["state"]["agg-0"]
    assert state["bytes"] == 0
    assert state["rows"] == 3000
    assert state["disk_bytes"] > 0
