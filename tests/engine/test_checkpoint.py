"""Checkpoint files: atomic, checksummed, versioned; one query per checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest

import microbatch as mb
from microbatch.checkpoint.batch_log import BatchLog
from microbatch.checkpoint.entries import CommitEntry, OffsetEntry
from microbatch.checkpoint.files import read_json, write_json_atomic


def _run_three_batches(chk: Path, name: str) -> mb.MemoryStream:
    src = mb.read_memory(schema={"x": pl.Int64}, max_records_per_batch=1)
    src.add({"x": [1, 2, 3]})
    src.write_memory(name).start(chk, trigger="available-now").await_termination(30)
    return src


def test_round_trip_and_checksum(tmp_path: Path) -> None:
    path = tmp_path / "f"
    write_json_atomic(path, "offsets", {"batch_id": 1, "a": [1, 2]})
    assert read_json(path, "offsets") == {"batch_id": 1, "a": [1, 2]}
    doc = json.loads(path.read_text())
    doc["body"]["a"] = [1, 3]
    path.write_text(json.dumps(doc))
    with pytest.raises(mb.CheckpointCorruptError, match="checksum"):
        read_json(path, "offsets")


def _commit(batch_id: int) -> CommitEntry:
    return CommitEntry(batch_id=batch_id, next_watermark_ms=batch_id * 1000)


def test_batch_log_refuses_overwrite_and_finds_gaps(tmp_path: Path) -> None:
    log = BatchLog(tmp_path / "commits", CommitEntry)
    assert log.latest() is None  # a log never written is empty, and not created
    assert not (tmp_path / "commits").exists()
    for i in range(4):
        log.add(_commit(i))
    with pytest.raises(mb.CheckpointError, match="already exists"):
        log.add(_commit(2))
    assert log.latest() == _commit(3)
    log.path(1).unlink()
    with pytest.raises(mb.CheckpointCorruptError, match=r"missing entries for batches \[1\]"):
        log.check_contiguous()
    assert log.purge_before(3) == 2
    assert log.batch_ids() == [3]


def test_log_entries_round_trip_and_refuse_edited_fields(tmp_path: Path) -> None:
    log = BatchLog(tmp_path / "offsets", OffsetEntry)
    entry = OffsetEntry(batch_id=0, sources={"0": ({"rows": 0}, {"rows": 5})},
                        watermark_ms=None, timestamp_ms=1_767_225_600_000,
                        identity={"sources": {}}, fingerprint="abc")
    log.add(entry)
    assert log.get(0) == entry
    doc = read_json(log.path(0), "offsets")
    doc["timestamp_ms"] = "yesterday"
    write_json_atomic(log.path(0), "offsets", doc)
    with pytest.raises(mb.CheckpointCorruptError, match="'timestamp_ms' is 'yesterday'"):
        log.get(0)
    del doc["timestamp_ms"]
    write_json_atomic(log.path(0), "offsets", doc)
    with pytest.raises(mb.CheckpointCorruptError, match="has no 'timestamp_ms'"):
        log.get(0)


def test_batch_log_purges_each_batch_without_relisting(tmp_path: Path) -> None:
    """After the first purge, later purges delete exactly the ids below the new bound,
    and a log reopened by a new process (no memory of purges) still finds old strays."""
    log = BatchLog(tmp_path / "commits", CommitEntry)
    for i in range(10):
        log.add(_commit(i))
        log.purge_before(i - 2)
        assert log.batch_ids() == list(range(max(0, i - 2), i + 1))
    assert log.purge_before(5) == 0  # a lower bound than before removes nothing
    reopened = BatchLog(tmp_path / "commits", CommitEntry)
    assert reopened.purge_before(9) == 2
    assert reopened.batch_ids() == [9]


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:20]), "not valid JSON"),
        (lambda p: p.write_text("{}"), "not a microbatch checkpoint file"),
        (
            lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "format": 99})),
            "newer than the format",
        ),
    ],
    ids=["truncated", "foreign", "newer-format"],
)
def test_damaged_offsets_file_stops_query_naming_the_file(
    chk: Path, table_name: str, damage, match: str
) -> None:
    src = _run_three_batches(chk, table_name)
    damage(chk / "offsets" / "2")
    writer = src.write_memory(table_name)
    with pytest.raises(mb.CheckpointError, match=match) as info:
        writer.start(chk, trigger="once")
    assert str(chk / "offsets" / "2") in str(info.value)


def test_corrupt_metadata_is_an_error_not_a_fresh_start(chk: Path, table_name: str) -> None:
    src = _run_three_batches(chk, table_name)
    (chk / "metadata").write_text("garbage")
    with pytest.raises(mb.CheckpointCorruptError, match="metadata"):
        src.write_memory(table_name).start(chk)


def test_missing_offsets_entry_is_detected(chk: Path, table_name: str) -> None:
    src = _run_three_batches(chk, table_name)
    (chk / "offsets" / "1").unlink()
    with pytest.raises(mb.CheckpointCorruptError, match="missing entries"):
        src.write_memory(table_name).start(chk)


def test_offsets_log_truncated_behind_commits_is_detected(chk: Path, table_name: str) -> None:
    src = _run_three_batches(chk, table_name)
    (chk / "offsets" / "2").unlink()
    with pytest.raises(mb.CheckpointCorruptError, match="truncated"):
        src.write_memory(table_name).start(chk)


def test_changed_source_is_refused(chk: Path, table_name: str, tmp_path: Path) -> None:
    _run_three_batches(chk, table_name)
    (tmp_path / "in").mkdir()
    other = mb.read_files(tmp_path / "in", format="parquet")
    with pytest.raises(mb.IncompatibleCheckpointError, match="different sources"):
        other.write_memory(table_name).start(chk)


def test_second_query_in_same_process_is_refused(chk: Path, table_name: str) -> None:
    src = mb.read_memory(schema={"x": pl.Int64})
    q = src.write_memory(table_name).start(chk, trigger="1s")
    try:
        with pytest.raises(mb.CheckpointLockedError, match="in use by another running query"):
            src.write_memory(table_name).start(chk, trigger="1s")
    finally:
        q.stop()
    q2 = src.write_memory(table_name).start(chk, trigger="once")
    assert q2.await_termination(30)


def test_lock_of_killed_process_does_not_block(chk: Path, table_name: str) -> None:
    code = textwrap.dedent(
        f"""
        import os, signal, polars as pl, microbatch as mb
        src = mb.read_memory(schema={{"x": pl.Int64}})
        q = src.write_memory("x").start({str(chk)!r}, trigger="10s")
        print("started", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "started" in proc.stdout
    assert proc.returncode == -9
    assert (chk / "lock").exists()
    src = mb.read_memory(schema={"x": pl.Int64})
    src.add({"x": [1]})
    query = src.write_memory(table_name).start(chk, trigger="once")
    assert query.await_termination(30)
    assert mb.table(table_name)["x"].to_list() == [1]


def test_unwritable_checkpoint_is_a_clear_error(tmp_path: Path, table_name: str) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    src = mb.read_memory(schema={"x": pl.Int64})
    with pytest.raises(mb.CheckpointError, match="cannot write to checkpoint directory"):
        src.write_memory(table_name).start(blocker / "chk")
