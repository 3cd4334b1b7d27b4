"""The batch lifecycle on memory, file and generator sources, and each trigger."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import polars as pl
import pytest
from input_files import write_parquet_files

import microbatch as mb
from microbatch.checkpoint.files import read_json
from microbatch.engine.trigger_loops import next_tick
from microbatch.sources.generator import GeneratorSource


def test_memory_source_steps_and_process_all_available(chk: Path, table_name: str) -> None:
    src = mb.read_memory(schema={"x": pl.Int64, "tags": pl.List(pl.String)})
    stream = (
        src.filter(pl.col("x") % 2 == 1)
        .with_columns(y=pl.col("x") * 10)
        .rename({"x": "x_in"})
        .explode("tags")
        .drop("y")
        .select("x_in", "tags")
        .map_batches(lambda df: df.with_columns(n=pl.lit(df.height, pl.UInt32)))
    )
    query = stream.write_memory(table_name).start(chk)
    try:
        src.add({"x": [1, 2, 3], "tags": [["a", "b"], ["c"], ["d"]]})
        query.process_all_available(timeout=30)
        src.add({"x": [5], "tags": [["e"]]})
        query.process_all_available(timeout=30)
    finally:
        query.stop()
    got = mb.table(table_name)
    assert got.to_dicts() == [
        {"x_in": 1, "tags": "a", "n": 3},
        {"x_in": 1, "tags": "b", "n": 3},
        {"x_in": 3, "tags": "d", "n": 3},
        {"x_in": 5, "tags": "e", "n": 1},
    ]
    assert [p["batch_id"] for p in query.recent_progress] == [0, 1]
    assert query.last_progress["input_rows"] == 1


def test_write_ahead_and_commit_entries(chk: Path, table_name: str) -> None:
    src = mb.read_memory(schema={"x": pl.Int64}, max_records_per_batch=2)
    src.add({"x": [1, 2, 3, 4, 5]})
    query = src.write_memory(table_name).start(chk, trigger="available-now")
    query.await_termination(30)
    for n, (start, end) in enumerate([(0, 2), (2, 4), (4, 5)]):
        entry = read_json(chk / "offsets" / str(n), "offsets")
        assert entry["sources"]["0"] == {"start": start, "end": end}
        assert entry["batch_id"] == n
        assert "fingerprint" in entry
        assert read_json(chk / "commits" / str(n), "commits")["batch_id"] == n
    assert not (chk / "offsets" / "3").exists()
    assert mb.table(table_name)["x"].to_list() == [1, 2, 3, 4, 5]
    meta = read_json(chk / "metadata", "metadata")
    assert meta["query_id"] == query.id


def test_query_id_is_stable_and_restart_resumes(chk: Path, table_name: str) -> None:
    src = mb.read_memory(schema={"x": pl.Int64})
    writer = src.write_memory(table_name)
    src.add({"x": [1, 2]})
    q1 = writer.start(chk, trigger="once")
    q1.await_termination(30)
    src.add({"x": [3]})
    q2 = writer.start(chk, trigger="once")
    q2.await_termination(30)
    assert q1.id == q2.id
    assert mb.table(table_name)["x"].to_list() == [1, 2, 3]
    assert q2.last_progress["batch_id"] == 1
    assert q2.last_progress["sources"][0]["start_offset"] == 2


def test_once_trigger_ignores_batch_cap(chk: Path, table_name: str) -> None:
    src = mb.read_memory(schema={"x": pl.Int64}, max_records_per_batch=2)
    src.add({"x": list(range(7))})
    query = src.write_memory(table_name).start(chk, trigger="once")
    assert query.await_termination(30)
    assert len(query.recent_progress) == 1
    assert query.last_progress["input_rows"] == 7


def test_available_now_stops_at_data_present_at_start(tmp_path: Path, table_name: str) -> None:
    frames = [pl.DataFrame({"x": [i, i + 100]}) for i in range(6)]
    write_parquet_files(tmp_path / "in", frames)
    stream = mb.read_files(tmp_path / "in", format="parquet", max_files_per_batch=4)
    query = stream.write_memory(table_name).start(tmp_path / "chk", trigger="available-now")
    assert query.await_termination(60)
    assert [p["input_rows"] for p in query.recent_progress] == [8, 4]
    assert sorted(mb.table(table_name)["x"].to_list()) == sorted(pl.concat(frames)["x"].to_list())


def test_files_one_batch_per_file_in_order(tmp_path: Path, table_name: str) -> None:
    frames = [pl.DataFrame({"x": [i]}) for i in range(5)]
    write_parquet_files(tmp_path / "in", frames)
    stream = mb.read_files(tmp_path / "in", max_files_per_batch=1)
    query = stream.write_memory(table_name).start(tmp_path / "chk", trigger="available-now")
    query.await_termination(60)
    assert mb.table(table_name)["x"].to_list() == [0, 1, 2, 3, 4]
    assert len(query.recent_progress) == 5


def test_processing_time_trigger_aligns_and_picks_up_new_files(
    tmp_path: Path, table_name: str
) -> None:
    write_parquet_files(tmp_path / "in", [pl.DataFrame({"x": [1]})])
    stream = mb.read_files(tmp_path / "in")
    query = stream.write_memory(table_name).start(tmp_path / "chk", trigger="200ms")
    try:
        deadline = time.monotonic() + 20
        while mb.table(table_name).height < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        # as read_files asks: written under a hidden name, renamed into place (a file
        # written in place can be listed while still empty, and admitted so)
        pl.DataFrame({"x": [2]}).write_parquet(tmp_path / "in" / ".later.parquet")
        (tmp_path / "in" / ".later.parquet").rename(tmp_path / "in" / "later.parquet")
        while mb.table(table_name).height < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        query.stop()
    assert sorted(mb.table(table_name)["x"].to_list()) == [1, 2]
    assert len(query.recent_progress) == 2


@pytest.mark.parametrize(
    ("started", "interval", "expected"),
    [(10.05, 200, 10.2), (10.2, 200, 10.4), (59.999, 10_000, 60.0), (125.0, 60_000, 180.0)],
)
def test_ticks_are_aligned_to_the_interval(started, interval, expected) -> None:
    """No drift: the next batch starts on the next multiple of the interval."""
    assert next_tick(started, interval) == pytest.approx(expected)


def test_generator_source_end_to_end_equals_one_shot(chk: Path, table_name: str) -> None:
    params = {
        "total_rows": 50_000,
        "rows_per_second": None,
        "seed": 7,
        "cards": 500,
        "max_records_per_batch": 12_345,
        "start": "2026-01-01T00:00:00+00:00",
    }
    stream = mb.generate(**params).filter(pl.col("amount") > 50).select("event_id", "card_id")
    query = stream.write_memory(table_name).start(chk, trigger="available-now")
    query.await_termination(60)
    source = GeneratorSource(**params)
    start = source.initial_offset()
    oracle = (
        source.read(start, source.latest_offset(start, capped=False))
        .data.filter(pl.col("amount") > 50)
        .select("event_id", "card_id")
    )
    assert mb.table(table_name).equals(oracle)
    assert len(query.recent_progress) == 5


def test_stop_from_another_thread_finishes_batch_in_flight(chk: Path, table_name: str) -> None:
    gate = threading.Event()

    def slow(df: pl.DataFrame) -> pl.DataFrame:
        gate.set()
        time.sleep(0.3)
        return df

    src = mb.read_memory(schema={"x": pl.Int64})
    src.add({"x": [1, 2, 3]})
    query = src.map_batches(slow).write_memory(table_name).start(chk)
    gate.wait(10)
    query.stop()
    assert not query.is_active
    assert mb.table(table_name)["x"].to_list() == [1, 2, 3]
    assert (chk / "commits" / "0").exists()


def test_failure_in_batch_surfaces_and_batch_is_not_committed(chk: Path, table_name: str) -> None:
    def boom(df: pl.DataFrame) -> pl.DataFrame:
        raise ValueError("user code failed")

    src = mb.read_memory(schema={"x": pl.Int64})
    src.add({"x": [1]})
    query = src.map_batches(boom).write_memory(table_name).start(chk)
    with pytest.raises(mb.QueryTerminatedError, match="user code failed"):
        query.await_termination(30)
    assert isinstance(query.exception, ValueError)
    assert (chk / "offsets" / "0").exists()
    assert not (chk / "commits" / "0").exists()


def test_progress_records_are_json_and_bounded(chk: Path, table_name: str) -> None:
    src = mb.read_memory(schema={"x": pl.Int64}, max_records_per_batch=1)
    src.add({"x": list(range(8))})
    query = src.write_memory(table_name).start(chk, trigger="available-now", retention=3)
    query.await_termination(30)
    json.dumps(query.recent_progress)
    assert [p["batch_id"] for p in query.recent_progress] == [5, 6, 7]
    assert sorted(int(p.name) for p in (chk / "progress").iterdir()) == [5, 6, 7]
    assert sorted(int(p.name) for p in (chk / "offsets").iterdir()) == [5, 6, 7]
    assert sorted(int(p.name) for p in (chk / "commits").iterdir()) == [5, 6, 7]
    steps = query.last_progress["duration_ms"]
    assert {"plan", "write_ahead", "read", "execute", "sink", "commit", "total"} <= steps.keys()


def test_complete_mode_without_aggregation_is_refused() -> None:
    src = mb.read_memory(schema={"x": pl.Int64})
    with pytest.raises(mb.PlanError, match="needs an aggregation"):
        src.write_memory("never", output_mode="complete")


def test_preview_runs_plan_without_checkpoint() -> None:
    stream = mb.generate(total_rows=1000, rows_per_second=None, seed=3, max_records_per_batch=100)
    out = stream.filter(pl.col("amount") > 0).select("event_id").preview(5)
    assert out["event_id"].to_list() == [0, 1, 2, 3, 4]
