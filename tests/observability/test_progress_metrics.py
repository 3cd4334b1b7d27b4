"""The progress record of each batch, checked against inputs whose figures are known.

Rows, lag (memory, files, generator sources), late and dead-letter rows,
state rows, watermark and its lag, end-to-end latency at the sink, trigger
interval against batch duration, and the JSON log line per batch.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from obs_helpers import EVENT_SCHEMA, ms, windowed_counts

import microbatch as mb
from microbatch.api.stream import stream_of
from microbatch.observability.progress_schema import ProgressRecord, read_progress
from microbatch.observability.status import alarms
from microbatch.sources.base import PartitionLag
from microbatch.sources.memory import MemorySource

STEPS = {"plan", "write_ahead", "read", "execute", "sink", "commit", "total"}


def test_memory_source_rows_lag_and_durations(chk: Path, name: Callable[[], str]) -> None:
    src = mb.read_memory(schema={"x": pl.Int64}, max_records_per_batch=4)
    src.add({"x": list(range(10))})

    query = src.write_memory(name()).start(chk, trigger="available-now")
    query.await_termination(30)

    records = query.recent_progress
    assert [r["input_rows"] for r in records] == [4, 4, 2]
    assert [r["source_lag_records"] for r in records] == [6, 2, 0]
    assert [r["sources"][0]["lag"]["partitions"]["0"]["records"] for r in records] == [6, 2, 0]
    for r in records:
        assert json.loads(json.dumps(r)) == r  # plain JSON, no default= needed
        assert set(r["duration_ms"]) >= STEPS
        total = r["duration_ms"]["total"]
        assert r["processed_rows_per_second"] == round(r["input_rows"] / (total / 1000), 1)
        assert r["trigger_interval_ms"] is None
        assert r["falling_behind"] is False
        assert r["latency_ms"] is None  # no event-time column in the output
        assert r["state"] == {}
        assert r["sink"]["output_rows"] == r["output_rows"] == r["input_rows"]
    assert records[1]["input_rows_per_second"] is not None  # rows / time since batch 0


def test_files_source_lag_is_unread_files_and_their_age(chk: Path, tmp_path: Path,
                                                        name: Callable[[], str]) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    old = time.time() - 100
    for i in range(5):
        lines = [json.dumps({"id": i * 10 + j}) for j in range(2)]
        if i == 2:
            lines.append("this is not json")
        path = landing / f"f{i}.json"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (old + i, old + i))

    src = mb.read_files(landing, format="json", schema={"id": pl.Int64}, max_files_per_batch=2)
    query = src.write_memory(name()).start(chk, trigger="available-now")
    query.await_termination(30)

    records = query.recent_progress
    lags = [r["sources"][0]["lag"] for r in records]
    assert [lag["records"] for lag in lags] == [3, 1, 0]
    assert {lag["unit"] for lag in lags} == {"files"}
    # the oldest unread file after batch 0 is f2, modified ~98 s before the batch
    assert 95 < lags[0]["seconds"] < 160
    assert 95 < lags[1]["seconds"] < 160  # f4
    assert lags[2]["seconds"] == 0.0
    assert [r["input_rows"] for r in records] == [4, 4, 2]
    assert [r["dead_letter_rows"] for r in records] == [0, 1, 0]


def test_generator_lag_per_partition(chk: Path, name: Callable[[], str]) -> None:
    src = mb.generate(rows_per_second=None, total_rows=1000, partitions=4, seed=3,
                      start="2026-01-01T00:00:00+00:00", max_records_per_batch=300)

    query = src.write_memory(name()).start(chk, trigger="available-now")
    query.await_termination(30)

    records = query.recent_progress
    assert [r["input_rows"] for r in records] == [300, 300, 300, 100]
    assert [r["source_lag_records"] for r in records] == [700, 400, 100, 0]
    first = records[0]["sources"][0]["lag"]["partitions"]
    assert {p: v["records"] for p, v in first.items()} == {str(p): 175 for p in range(4)}
    assert all(v["seconds"] >= 0 for v in first.values())
    assert all(v["records"] == 0 for v in records[-1]["sources"][0]["lag"]["partitions"].values())


def test_late_rows_state_watermark_and_sink_latency(chk: Path, t0: datetime,
                                                    name: Callable[[], str]) -> None:
    src = mb.read_memory(schema=EVENT_SCHEMA)
    table = name()
    query = windowed_counts(src).write_memory(table).start(chk)
    try:
        src.add({"ts": [t0 + timedelta(seconds=5)] * 3, "k": [1, 2, 3]})
        query.process_all_available(30)
        src.add({"ts": [t0 + timedelta(minutes=2, seconds=5)], "k": [1]})
        query.process_all_available(30)  # batch 1, then the no-data batch that emits [t0, t0+1m)
        src.add({"ts": [t0 + timedelta(seconds=10)] * 2, "k": [1, 2]})  # closed window: late
        query.process_all_available(30)
    finally:
        query.stop()

    # 0: three rows; 1: no data (the first watermark); 2: one row; 3: no data, emits the
    # window [t0, t0+1m); 4: two late rows
    records = query.recent_progress
    assert [b["input_rows"] for b in records] == [3, 0, 1, 0, 2]
    assert [b["late_rows"] for b in records] == [0, 0, 0, 0, 2]
    assert [b["output_rows"] for b in records] == [0, 0, 0, 3, 0]
    b0, _, b2, emit, late = records
    assert late["state"]["agg-0"]["late_rows"] == 2
    # state: 3 keys in the first window, a 4th row in a later one; the first window evicted
    assert [b["state_rows"] for b in records] == [3, 3, 4, 1, 1]
    assert emit["state"]["agg-0"]["deleted"] == 3
    assert emit["state"]["agg-0"]["eviction"] == "watermark"
    assert emit["state_bytes"] > 0
    assert emit["state"]["agg-0"]["commit_ms"] >= 0
    # watermarks: none for batch 0; max event time seen minus the 10 s delay afterwards
    assert b0["watermark_ms"] is None
    assert b2["watermark_ms"] == ms(t0 + timedelta(seconds=5 - 10))
    assert late["watermark_ms"] == ms(t0 + timedelta(minutes=2, seconds=5 - 10))
    assert late["watermark_lag_ms"] == late["reported_at_ms"] - late["watermark_ms"]
    assert 55 * 60_000 < late["watermark_lag_ms"] < 65 * 60_000
    [part] = late["watermark_partitions"]
    assert part["holding"] is True
    assert part["max_event_time_ms"] == ms(t0 + timedelta(minutes=2, seconds=5))
    # latency: the emitted window ends at t0 + 1m; measured when the sink took it
    latency = emit["latency_ms"]
    assert latency["column"] == "window_end"
    assert latency["rows"] == 3
    expected = emit["reported_at_ms"] - ms(t0 + timedelta(minutes=1))
    assert abs(latency["max_ms"] - expected) < 5_000
    assert latency["median_ms"] == latency["max_ms"]  # one window_end for all three rows
    assert emit["sink"]["latency_ms"] == latency
    assert late["latency_ms"] is None  # nothing emitted
    assert len(mb.table(table)) == 3


def test_stateless_latency_uses_the_event_time_column(chk: Path, name: Callable[[], str]) -> None:
    src = mb.read_memory(schema=EVENT_SCHEMA)
    now = datetime.now().astimezone()
    query = src.with_watermark("ts", "1s").write_memory(name()).start(chk)
    try:
        src.add({"ts": [now - timedelta(seconds=60), now - timedelta(seconds=20),
                        now - timedelta(seconds=10)], "k": [1, 2, 3]})
        query.process_all_available(30)
    finally:
        query.stop()

    latency = query.last_progress["latency_ms"]
    assert latency["column"] == "ts"
    assert 60_000 <= latency["max_ms"] < 65_000
    assert 20_000 <= latency["median_ms"] < 25_000


def test_trigger_interval_and_falling_behind(chk: Path, name: Callable[[], str]) -> None:
    src = mb.read_memory(schema={"x": pl.Int64})

    def slow(df: pl.DataFrame) -> pl.DataFrame:
        time.sleep(0.25)
        return df

    query = src.map_batches(slow).write_memory(name()).start(chk, trigger="100ms")
    try:
        for i in range(2):
            src.add({"x": [i]})
            query.process_all_available(30)
    finally:
        query.stop()

    records = query.recent_progress
    assert len(records) == 2
    for r in records:
        assert r["trigger_interval_ms"] == 100
        assert r["duration_ms"]["execute"] >= 250
        assert r["falling_behind"] is True
    assert [a["code"] for a in alarms(records)] == ["falling_behind"]


def test_one_json_log_line_per_batch(chk: Path, name: Callable[[], str],
                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="microbatch.observability.progress")
    src = mb.read_memory(schema={"x": pl.Int64}, max_records_per_batch=2)
    src.add({"x": [1, 2, 3]})

    query = src.write_memory(name()).start(chk, trigger="available-now")
    query.await_termination(30)

    lines = [r for r in caplog.records if r.name == "microbatch.observability.progress"]
    assert len(lines) == 2
    for line, record in zip(lines, query.recent_progress, strict=True):
        assert "\n" not in line.getMessage()
        assert json.loads(line.getMessage()) == record
        assert line.progress is record  # type: ignore[attr-defined]


def test_watermark_stalled_by_an_idle_partition_is_an_alarm(
    chk: Path, tmp_path: Path, t0: datetime, name: Callable[[], str]
) -> None:
    schema = {"p": pl.String, **EVENT_SCHEMA}

    def run(checkpoint: Path, idle_timeout: str | None) -> list[dict]:
        src = mb.read_memory(schema=schema, partition_column="p")
        stream = (src.with_watermark("ts", "1s", idle_timeout=idle_timeout)
                     .group_by(mb.window("ts", "10s"), "k").agg(pl.len().alias("n")))
        query = stream.write_memory(name()).start(checkpoint)
        try:
            src.add({"p": ["a", "b"], "ts": [t0 + timedelta(seconds=1)] * 2, "k": [1, 2]})
            query.process_all_available(30)
            for i in range(3):  # only partition "a" receives rows from now on
                time.sleep(0.05)
                src.add({"p": ["a"], "ts": [t0 + timedelta(seconds=20 + 10 * i)], "k": [1]})
                query.process_all_available(30)
        finally:
            query.stop()
        return [r for r in query.recent_progress if r["input_rows"]]

    stalled = run(chk, idle_timeout=None)
    assert {r["next_watermark_ms"] for r in stalled} == {ms(t0)}  # held by partition b
    holder = [p for p in stalled[-1]["watermark_partitions"] if p["holding"]]
    assert [p["partition"] for p in holder] == ["b"]
    codes = [a["code"] for a in alarms(stalled)]
    assert "watermark_stalled" in codes
    [alarm] = [a for a in alarms(stalled) if a["code"] == "watermark_stalled"]
    assert "partition b" in alarm["message"]
    assert "idle_timeout" in alarm["message"]

    moving = run(tmp_path / "chk-idle", idle_timeout="10ms")
    assert moving[-1]["next_watermark_ms"] == ms(t0 + timedelta(seconds=39))
    assert "watermark_stalled" not in [a["code"] for a in alarms(moving)]


def test_state_growing_without_eviction_is_an_alarm(chk: Path, name: Callable[[], str]) -> None:
    src = mb.read_memory(schema={"k": pl.Int64})
    query = src.group_by("k").agg(pl.len().alias("n")).write_memory(
        name(), output_mode="update").start(chk)
    try:
        for batch in range(6):
            src.add({"k": [batch * 10 + j for j in range(3)]})  # 3 new keys per batch
            query.process_all_available(30)
    finally:
        query.stop()

    records = query.recent_progress
    assert [r["state_rows"] for r in records] == [3, 6, 9, 12, 15, 18]
    assert records[-1]["state"]["agg-0"]["eviction"] == "none"
    [alarm] = [a for a in alarms(records) if a["code"] == "state_growing"]
    assert "agg-0 grew from 6 to 18 rows" in alarm["message"]


def test_rising_late_rows_alarm_and_steady_late_rows_none() -> None:
    def records(late: list[int]) -> list[ProgressRecord]:
        # only the fields the alarm reads: read as version-0 records, the rest defaults
        return [read_progress({"run_id": "r", "batch_id": i, "timestamp_ms": i * 1000,
                               "input_rows": 100, "late_rows": n}, where=f"batch {i}")
                for i, n in enumerate(late)]

    rising = alarms(records([0, 1, 0, 4, 9, 20]))
    assert [a["code"] for a in rising] == ["late_rows_rising"]
    assert "33 in the last 3 batches (11.0% of their input) against 1" in rising[0]["message"]
    assert alarms(records([5, 5, 5, 5, 5, 5])) == []


class _HookedSource(MemorySource):
    """A source answering the optional ``Source.lag()`` hook itself (as Kafka does)."""

    def lag(self) -> dict[str, int | PartitionLag]:
        return {"t:0": 5, "t:1": {"records": 2, "seconds": 1.5}}


class _BrokenLagSource(MemorySource):
    def lag(self) -> dict[str, int]:
        raise OSError("broker unreachable")


def test_source_lag_hook_is_used_and_a_failing_one_never_fails_the_batch(
    chk: Path, tmp_path: Path, name: Callable[[], str]
) -> None:
    hooked = _HookedSource(schema={"x": pl.Int64})
    hooked.add({"x": [1]})
    query = stream_of(hooked).write_memory(name()).start(chk, trigger="available-now")
    query.await_termination(30)
    lag = query.last_progress["sources"][0]["lag"]
    assert lag == {"unit": "records", "records": 7, "seconds": 1.5, "partitions": {
        "t:0": {"records": 5, "seconds": None}, "t:1": {"records": 2, "seconds": 1.5}}}
    assert query.last_progress["source_lag_records"] == 7

    broken = _BrokenLagSource(schema={"x": pl.Int64})
    broken.add({"x": [1, 2]})
    query = stream_of(broken).write_memory(name()).start(tmp_path / "chk2",
                                                         trigger="available-now")
    query.await_termination(30)  # no error: lag is informational
    assert query.last_progress["input_rows"] == 2
    assert query.last_progress["sources"][0]["lag"] is None
    assert query.last_progress["source_lag_records"] is None
