"""Processing time: ``with_processing_time`` and windows over it.

The oracle: every row tagged with the time of the batch it was processed in
(the harness's fake clock), then one-shot Polars windows over that tag. The
stream's union of append output equals it for random splits and random
clock advances; the tags are the timestamps of ``offsets/N``, also on a
re-run after a crash.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracles import tumbling_or_hopping

import microbatch as mb
from microbatch.checkpoint import Checkpoint
from microbatch.engine.faults import InjectedFault
from microbatch.testing import EPOCH, StreamTest

SCHEMA = {"k": pl.Int64, "v": pl.Int64}
MINUTE_MS = 60_000


def windowed(size: str = "1m", slide: str | None = None):
    def build(src: mb.Stream) -> mb.Stream:
        return (
            src.with_processing_time("proc_time")
            .group_by(mb.window("proc_time", size, slide), "k")
            .agg(pl.len().alias("n"), pl.col("v").sum().alias("total"))
        )

    return build


def epoch_ms(df: pl.DataFrame) -> pl.DataFrame:
    return df.select(
        pl.col("window_start").dt.epoch("ms").alias("ws"),
        pl.col("window_end").dt.epoch("ms").alias("we"),
        "k",
        "n",
        "total",
    )


rows_st = st.lists(st.tuples(st.integers(0, 3), st.integers(-50, 50)), min_size=1, max_size=40)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=rows_st,
    cuts=st.lists(st.integers(0, 40), max_size=8),
    gaps=st.lists(st.integers(0, 150_000), min_size=9, max_size=9),
    hopping=st.booleans(),
)
def test_windows_equal_one_shot_over_batch_times(
    rows: list[tuple[int, int]], cuts: list[int], gaps: list[int], hopping: bool, tmp_path_factory
) -> None:
    """Random splits at random clock steps: the closed windows' rows are the
    one-shot windows over each row's batch time; nothing is late; an idle
    batch past the last window's end emits the rest."""
    build = windowed("2m", "1m") if hopping else windowed("1m")
    test = StreamTest(build, schema=SCHEMA, checkpoint=tmp_path_factory.mktemp("chk"))
    bounds = [0, *sorted({min(c, len(rows)) for c in cuts}), len(rows)]
    tagged = []
    for (lo, hi), gap in zip(itertools.pairwise(bounds), gaps, strict=False):
        if hi <= lo:
            continue
        test.advance_clock(gap / 1000)
        part = pl.DataFrame(rows[lo:hi], schema=SCHEMA, orient="row")
        tagged.append(part.with_columns(pl.lit(int(test.now * 1000)).alias("t")))
        test.add(part).process()
    test.advance_clock(3 * 60)  # idle: past the end of every window
    test.process()
    every = pl.concat(tagged).with_columns(
        pl.from_epoch("t", time_unit="ms").dt.replace_time_zone("UTC").alias("t")
    )
    expected = tumbling_or_hopping(
        every,
        time="t",
        keys=["k"],
        size_ms=2 * MINUTE_MS if hopping else MINUTE_MS,
        slide_ms=MINUTE_MS,
        aggs=[pl.len().cast(pl.Int64).alias("n"), pl.col("v").sum().alias("total")],
    ).select("ws", "we", "k", "n", "total")
    got = epoch_ms(test.output)
    assert got.sort("ws", "k").equals(expected.sort("ws", "k"))
    assert test.late_rows.height == 0
    test.close()


def test_the_column_is_the_recorded_timestamp_of_each_batch(tmp_path: Path) -> None:
    """Each batch's rows carry its ``offsets/N`` timestamp, as a UTC ms Datetime."""
    test = StreamTest(lambda s: s.with_processing_time("pt"), schema=SCHEMA, checkpoint=tmp_path)
    for i, step in enumerate((1.5, 0.0, 42.25)):
        test.advance_clock(step).add({"k": [i, i], "v": [1, 2]}).process()
    log = Checkpoint(tmp_path).offsets
    assert test.output.schema["pt"] == pl.Datetime("ms", "UTC")
    for batch_id, df in test.sink.batches.items():
        recorded = log.get(batch_id).timestamp_ms
        assert df["pt"].dt.epoch("ms").to_list() == [recorded] * df.height
    assert [df["pt"][0] for df in test.sink.batches.values()] == [
        EPOCH + timedelta(seconds=s) for s in (1.5, 1.5, 43.75)
    ]
    test.close()


def test_a_rerun_after_a_crash_stamps_the_recorded_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 1 fails after its write-ahead; restarted an hour later, it re-runs with
    the time recorded in ``offsets/1``, and its window closes as it would have."""
    test = StreamTest(windowed(), schema=SCHEMA, checkpoint=tmp_path)
    test.advance_clock(10).add({"k": [1], "v": [5]}).process()
    monkeypatch.setenv("MICROBATCH_FAULT", "after_execute@1")
    monkeypatch.setenv("MICROBATCH_FAULT_ACTION", "raise")
    with pytest.raises(InjectedFault):
        test.advance_clock(20).add({"k": [1], "v": [7]}).process()  # at 00:00:30
    monkeypatch.delenv("MICROBATCH_FAULT")
    assert Checkpoint(tmp_path).offsets.get(1).timestamp_ms == int(test.now * 1000)
    test.advance_clock(3600).restart().process()  # re-runs batch 1, then closes the minute
    test.expect(
        {
            "window_start": [EPOCH],
            "window_end": [EPOCH + timedelta(minutes=1)],
            "k": [1],
            "n": [2],
            "total": [12],
        }
    )
    test.close()


def test_an_idle_stream_runs_a_batch_only_when_a_window_ends(tmp_path: Path) -> None:
    """Trigger ticks that cross no window end run nothing; the first past it runs
    one no-data batch that emits the window; later, one per window end passed."""
    test = StreamTest(windowed(), schema=SCHEMA, checkpoint=tmp_path)
    test.advance_clock(5).add({"k": [1, 2], "v": [1, 1]}).process()
    for _ in range(5):
        assert test.advance_clock(10).process().height == 0  # 00:00:15 .. 00:00:55
    assert test.execution.next_batch_id == 1
    out = test.advance_clock(10).process()  # 00:01:05
    assert test.execution.next_batch_id == 2
    assert sorted(out["k"].to_list()) == [1, 2]
    # idle, nothing open: at most one (empty) no-data batch per window end passed
    assert test.advance_clock(600).process().height == 0  # 00:11:05
    assert test.execution.next_batch_id == 3
    assert test.advance_clock(50).process().height == 0  # 00:11:55: no end passed
    assert test.execution.next_batch_id == 3
    test.close()


def test_a_clock_stepping_back_never_makes_rows_late(tmp_path: Path) -> None:
    """A batch planned before the previous one's time is stamped with that time
    (the watermark in force): its rows join the open window, none is late."""
    test = StreamTest(windowed(), schema=SCHEMA, checkpoint=tmp_path)
    test.advance_clock(59).add({"k": [1], "v": [1]}).process()
    test.advance_clock(-30).add({"k": [1], "v": [2]}).process()
    assert test.sink.batches[1]["n"].len() == 0
    test.advance_clock(40).process()  # 00:01:09
    test.expect({"k": [1], "n": [2], "total": [3]})
    assert test.late_rows.height == 0
    test.close()


def test_processing_time_with_an_interval_trigger_on_a_real_clock(tmp_path: Path) -> None:
    """Through ``start``: the column is close to the wall clock of the run."""
    before = datetime.now(UTC)
    src = mb.read_memory(pl.DataFrame({"k": [1, 2], "v": [3, 4]}))
    query = src.with_processing_time().write_memory("proc_time_wall").start(
        tmp_path, trigger="available-now"
    )
    assert query.await_termination(60)
    got = mb.table("proc_time_wall")
    assert got.columns == ["k", "v", "proc_time"]
    assert got["proc_time"].n_unique() == 1
    stamped = got["proc_time"][0]
    assert before - timedelta(seconds=1) <= stamped <= datetime.now(UTC)


def test_refusals() -> None:
    src = mb.read_memory(schema=SCHEMA)
    with pytest.raises(mb.PlanError, match="already has a column 'v'"):
        src.with_processing_time("v")
    with pytest.raises(mb.PlanError, match="needs a column name"):
        src.with_processing_time("")


def test_explain_shows_the_attribute() -> None:
    stream = mb.read_memory(schema=SCHEMA, name="s").with_processing_time("pt")
    assert stream.explain().splitlines()[0] == "ProcessingTime(pt)"
