"""Helpers of the observability tests: small queries whose figures are known."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl

import microbatch as mb

CLI = [sys.executable, "-m", "microbatch.cli"]
EVENT_SCHEMA = {"ts": pl.Datetime("ms", "UTC"), "k": pl.Int64}


def run_cli(*args: str | Path, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The CLI as a real subprocess, stdout a pipe (plain output, no live display)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROBATCH_FAULT")}
    return subprocess.run([*CLI, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)


def ms(when: datetime) -> int:
    """Epoch milliseconds of ``when``."""
    return int(when.timestamp() * 1000)


def windowed_counts(src: mb.Stream, *, delay: str = "10s", size: str = "1m") -> mb.Stream:
    """Per key and tumbling window of ``ts``: the row count ``n``."""
    return (src.with_watermark("ts", delay)
               .group_by(mb.window("ts", size), "k").agg(pl.len().alias("n")))


def report_checkpoint(chk: Path, t0: datetime, name: str) -> Path:
    """A checkpoint whose batches have rows, one late row and evicted state."""
    src = mb.read_memory(schema=EVENT_SCHEMA)
    query = windowed_counts(src).write_memory(name).start(chk, trigger="50ms")
    try:
        for minute in range(4):
            src.add({"ts": [t0 + timedelta(minutes=minute, seconds=s) for s in (1, 2, 3)],
                     "k": [1, 2, 3]})
            query.process_all_available(30)
        src.add({"ts": [t0 + timedelta(seconds=30)], "k": [9]})  # late
        query.process_all_available(30)
    finally:
        query.stop()
    return chk
