"""``microbatch status`` on running, stopped and failed queries; ``--watch``; the
run command's live line and plain lines with lag and watermark."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from obs_helpers import CLI, EVENT_SCHEMA, run_cli, windowed_counts

import microbatch as mb
from microbatch.cli.display import BatchLines, LiveLine, RunStats
from microbatch.observability.status import status_document


@pytest.fixture
def running_query(chk: Path, name: Callable[[], str]) -> Iterator[mb.StreamingQuery]:
    """A generator query on a 200 ms trigger that has committed two batches."""
    src = mb.generate(rows_per_second=2_000, cards=50, partitions=2, seed=1)
    query = windowed_counts(
        src.select(pl.col("event_time").alias("ts"), pl.col("card_id").alias("k")),
        delay="2s", size="1s",
    ).write_memory(name()).start(chk, trigger="200ms", name="obs-running")
    try:
        deadline = time.monotonic() + 30
        while len(query.recent_progress) < 2:
            assert time.monotonic() < deadline, "no batches"
            time.sleep(0.05)
        yield query
    finally:
        query.stop()


def test_status_of_a_running_then_stopped_query(running_query: mb.StreamingQuery,
                                                chk: Path, tmp_path: Path) -> None:
    doc = status_document(chk)
    assert doc["state"] == "running"
    assert doc["running"] is True
    assert doc["lock_owner"]["pid"] == os.getpid()
    assert doc["last_committed_batch"] >= 1
    assert doc["trigger_interval_ms"] == 200
    assert doc["last_error"] is None
    assert doc["sources"][0]["lag"]["unit"] == "records"
    assert doc["source_lag_records"] is not None
    assert doc["watermark_ms"] is not None
    assert 0 < doc["watermark_lag_ms"] < 60_000
    assert doc["state_operators"]["agg-0"]["rows"] == doc["state_rows"] > 0

    # another process sees the same: the lock is held, the files are readable meanwhile
    seen = json.loads(run_cli("status", chk, "--json", cwd=tmp_path).stdout)
    assert seen["state"] == "running"
    assert seen["lock_owner"]["pid"] == os.getpid()
    text = run_cli("status", chk, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    flat = " ".join(text.stdout.split())
    assert "running (pid" in flat
    assert "watermark lag" in flat
    assert "source lag" in flat
    assert "agg-0" in flat

    running_query.stop()
    stopped = status_document(chk)
    assert stopped["state"] == "stopped"
    assert stopped["running"] is False
    assert stopped["last_committed_batch"] == running_query.last_progress["batch_id"]
    assert stopped["pending_recovery"] is False


def test_status_of_a_failed_query_shows_the_error_until_a_good_start(
    chk: Path, tmp_path: Path, name: Callable[[], str]
) -> None:
    src = mb.read_memory(schema={"x": pl.Int64})
    broken = {"on": True}

    def check(df: pl.DataFrame) -> pl.DataFrame:
        if broken["on"] and df.height and df["x"].max() >= 100:
            raise ValueError("x is out of range")
        return df

    writer = src.map_batches(check).write_memory(name())
    query = writer.start(chk)
    src.add({"x": [1]})
    query.process_all_available(30)
    src.add({"x": [2]})
    query.process_all_available(30)
    src.add({"x": [100]})
    with pytest.raises(mb.QueryTerminatedError):
        query.process_all_available(30)

    doc = status_document(chk)
    assert doc["state"] == "failed"
    assert doc["running"] is False
    error = doc["last_error"]
    assert error["type"] == "ValueError"
    assert error["message"] == "x is out of range"
    assert error["batch_id"] == 2
    assert "Traceback" in error["traceback"]
    assert doc["pending_recovery"] is True
    assert doc["alarms"][0]["code"] == "failed"
    assert "batch 2" in doc["alarms"][0]["message"]
    text = " ".join(run_cli("status", chk, cwd=tmp_path).stdout.split())
    assert "failed" in text
    assert "ValueError: x is out of range" in text

    broken["on"] = False  # the fixed job: same plan, so the same checkpoint
    again = writer.start(chk)
    again.process_all_available(30)
    again.stop()
    doc = status_document(chk)
    assert doc["state"] == "stopped"
    assert doc["last_error"] is None
    assert not (chk / "last_error").exists()
    assert doc["last_committed_batch"] == 2


def test_status_watch_prints_bounded_refreshes_and_ctrl_c_exits_0(
    chk: Path, tmp_path: Path, name: Callable[[], str]
) -> None:
    src = mb.read_memory(schema={"x": pl.Int64})
    src.add({"x": [1, 2, 3]})
    src.write_memory(name()).start(chk, trigger="available-now").await_termination(30)

    watched = run_cli("status", chk, "--json", "--watch", "0.2", "--count", "3", cwd=tmp_path)
    assert watched.returncode == 0, watched.stderr
    docs = [json.loads(line) for line in watched.stdout.splitlines()]
    assert len(docs) == 3
    assert {d["last_committed_batch"] for d in docs} == {0}

    too_fast = run_cli("status", chk, "--watch", "0.01", cwd=tmp_path)
    assert too_fast.returncode == 2

    proc = subprocess.Popen([*CLI, "status", str(chk), "--watch", "0.2"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the first refresh is on its way
        assert first.strip()
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr


def test_run_progress_lines_show_lag_and_watermark(
    chk: Path, t0: datetime, name: Callable[[], str], capsys: pytest.CaptureFixture[str]
) -> None:
    src = mb.read_memory(schema=EVENT_SCHEMA, max_records_per_batch=2)
    src.add({"ts": [t0 + timedelta(seconds=s) for s in (1, 2, 3)], "k": [1, 1, 2]})
    query = windowed_counts(src).write_memory(name()).start(chk, trigger="available-now")
    query.await_termination(30)
    stats = RunStats()
    first = query.recent_progress[0]
    stats.add(first)

    BatchLines().batch(first, stats)  # not a terminal: one plain line per batch
    line = capsys.readouterr().err
    assert "batch 0: 2 rows in" in line
    assert "lag 1 record," in line
    # the watermark after the batch, with its date: newest event time (t0 + 2 s) minus
    # the 10 s delay
    wm = (t0 + timedelta(seconds=2 - 10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert f"watermark {wm} (" in line
    second = query.recent_progress[1]
    stats.add(second)
    BatchLines().batch(second, stats)
    line = capsys.readouterr().err
    assert "lag 0 records" in line

    live = LiveLine("microbatch").render(stats, query)  # a terminal: the redrawn line
    assert "lag 0" in live.plain
    assert "watermark" in live.plain
