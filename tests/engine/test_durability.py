"""``durability="process"``: the query's thread writes without fsyncs (and only
that query's thread), and results are the same as with full durability."""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

import microbatch as mb


def _count_fsyncs(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """fsync calls per thread name (each still reaches the real os.fsync)."""
    calls: Counter[str] = Counter()
    real = os.fsync

    def counted(fd: int) -> None:
        calls[threading.current_thread().name] += 1
        real(fd)

    monkeypatch.setattr(os, "fsync", counted)
    return calls


def _run(tmp: Path, name: str, durability: str) -> pl.DataFrame:
    stream = mb.generate(rows_per_second=None, total_rows=3_000, start="2026-01-01T00:00:00+00:00",
                         seed=5, max_records_per_batch=500, event_rate=50)
    query = (
        stream.with_watermark("event_time", "5s")
        .group_by(mb.window("event_time", "10s"), "card_id")
        .agg(pl.len().alias("n"), pl.col("amount").sum().alias("amount"))
        .write_parquet(tmp / name / "out")
        .start(tmp / name / "chk", trigger="available-now", name=name, durability=durability)
    )
    assert query.await_termination()
    return mb.parquet_table(tmp / name / "out").sort("window_start", "card_id")


def test_process_durability_skips_fsyncs_in_its_thread_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_fsyncs(monkeypatch)
    full = _run(tmp_path, "full", "fsync")
    fast = _run(tmp_path, "fast", "process")
    assert calls["microbatch-full"] > 6 * 5, calls  # checkpoint, state and sink files per batch
    assert calls["microbatch-fast"] == 0, calls
    assert fast.height > 0
    assert fast.equals(full)


def test_unknown_durability_is_refused(tmp_path: Path) -> None:
    writer = mb.generate(rows_per_second=None, total_rows=10).write_memory("nodur")
    with pytest.raises(mb.PlanError, match="durability must be one of 'fsync', 'process'"):
        writer.start(tmp_path / "chk", trigger="once", durability="never")  # type: ignore[arg-type]
