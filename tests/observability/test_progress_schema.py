"""The progress record's one schema: every field a batch reports is declared in
:mod:`microbatch.observability.progress_schema`, each record carries its
version (in memory, in ``chk/progress/N`` and in the log line), and records of
another version are read as documented: version 0 (before the field existed)
compatibly, a newer version skipped with a warning, never failing ``status``."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from obs_helpers import EVENT_SCHEMA, windowed_counts

import microbatch as mb
from microbatch.checkpoint.files import read_json, write_json_atomic
from microbatch.exceptions import CheckpointCorruptError
from microbatch.observability.progress import load_progress
from microbatch.observability.progress_schema import (
    PROGRESS_VERSION,
    ProgressRecord,
    ProgressVersionError,
    SinkProgress,
    SourceLag,
    SourceProgress,
    StateProgress,
    StepDurations,
    WatermarkPartition,
    read_progress,
)
from microbatch.observability.status import status_document


def _keys(typed: Any) -> set[str]:
    return set(typed.__required_keys__) | set(typed.__optional_keys__)


def _windowed_query(chk: Path, t0: datetime, table: str) -> list[ProgressRecord]:
    src = mb.read_memory(schema=EVENT_SCHEMA)
    query = windowed_counts(src).write_memory(table).start(chk)
    try:
        src.add({"ts": [t0 + timedelta(seconds=5)] * 3, "k": [1, 2, 3]})
        query.process_all_available(30)
        src.add({"ts": [t0 + timedelta(minutes=2)], "k": [1]})
        query.process_all_available(30)
    finally:
        query.stop()
    return query.recent_progress


def test_every_field_of_a_record_is_in_the_schema(chk: Path, t0: datetime,
                                                  name: Callable[[], str]) -> None:
    records = _windowed_query(chk, t0, name())
    assert records
    for r in records:
        assert set(r) == _keys(ProgressRecord)
        assert r["progress_version"] == PROGRESS_VERSION
        assert set(r["duration_ms"]) <= _keys(StepDurations)
        for p in r["watermark_partitions"]:
            assert set(p) == _keys(WatermarkPartition)
        for s in r["sources"]:
            assert set(s) <= _keys(SourceProgress)
            assert s["lag"] is not None
            assert set(s["lag"]) <= _keys(SourceLag)
        assert set(r["sink"]) == _keys(SinkProgress)
        for figures in r["state"].values():
            # the figures every view reads are there; an operator may add its own
            assert {"rows", "bytes", "version", "commit_ms", "eviction"} <= set(figures)
            assert set(figures) & _keys(StateProgress)


def test_the_version_is_written_to_the_checkpoint_and_the_log(
    chk: Path, name: Callable[[], str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="microbatch.observability.progress")
    src = mb.read_memory(schema={"x": pl.Int64})
    src.add({"x": [1, 2]})
    query = src.write_memory(name()).start(chk, trigger="available-now")
    query.await_termination(30)

    body = read_json(chk / "progress" / "0", "progress")
    assert body["progress_version"] == PROGRESS_VERSION
    assert body == query.last_progress
    [line] = [r for r in caplog.records if r.name == "microbatch.observability.progress"]
    assert json.loads(line.getMessage())["progress_version"] == PROGRESS_VERSION


def _old_and_new_records(chk: Path, t0: datetime, table: str) -> list[ProgressRecord]:
    """A real checkpoint whose first record is rewritten as an engine before the
    version field wrote it (no ``progress_version``, fewer fields)."""
    records = _windowed_query(chk, t0, table)
    old: dict[str, Any] = dict(read_json(chk / "progress" / "0", "progress"))
    for field in ("progress_version", "state_expired_rows", "executor", "reported_at_ms", "sink"):
        old.pop(field)
    write_json_atomic(chk / "progress" / "0", "progress", old)
    return records


def test_a_record_without_a_version_is_read_as_version_0(chk: Path, t0: datetime,
                                                         name: Callable[[], str]) -> None:
    written = _old_and_new_records(chk, t0, name())
    loaded = load_progress(chk / "progress")
    assert [r["batch_id"] for r in loaded] == [r["batch_id"] for r in written]
    old = loaded[0]
    assert old["progress_version"] == 0
    assert old["input_rows"] == written[0]["input_rows"] == 3
    # the fields the old record lacks read as empty, so every reader works on it
    assert old["state_expired_rows"] == 0
    assert old["executor"] is None
    assert old["reported_at_ms"] is None
    assert old["sink"]["output_rows"] == old["output_rows"]
    assert loaded[-1]["progress_version"] == PROGRESS_VERSION

    doc = status_document(chk)
    assert [b["batch_id"] for b in doc["recent_batches"]] == [r["batch_id"] for r in written]
    assert doc["recent_batches"][0]["input_rows"] == 3


def test_a_record_of_a_newer_version_is_skipped_with_a_warning(
    chk: Path, t0: datetime, name: Callable[[], str], caplog: pytest.LogCaptureFixture
) -> None:
    written = _windowed_query(chk, t0, name())
    newest = written[-1]["batch_id"]
    future = {**written[-1], "progress_version": PROGRESS_VERSION + 1}
    write_json_atomic(chk / "progress" / str(newest), "progress", future)

    with pytest.raises(ProgressVersionError, match="upgrade microbatch"):
        read_progress(future, where="progress/N")
    caplog.set_level(logging.WARNING, logger="microbatch.observability.progress")
    loaded = load_progress(chk / "progress")
    assert [r["batch_id"] for r in loaded] == [r["batch_id"] for r in written[:-1]]
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert f"version {PROGRESS_VERSION + 1}" in warning.getMessage()
    assert "newer" in warning.getMessage()
    # status still works: the record is informational
    doc = status_document(chk)
    assert doc["last_committed_batch"] == newest
    assert [b["batch_id"] for b in doc["recent_batches"]] == [r["batch_id"] for r in loaded]


@pytest.mark.parametrize("body", [[1, 2], {"batch_id": "0"}, {"batch_id": 0,
                                                              "progress_version": "1"}])
def test_a_record_that_is_not_one_is_a_corrupt_file(body: Any) -> None:
    with pytest.raises(CheckpointCorruptError):
        read_progress(body, where="progress/0")
