"""Measuring this engine: timed available-now queries, their per-step times, and the
machine facts of a report. The generic timing, statistics and formatting live in
:mod:`benchmarks.harness` (re-exported here for the modules that import them from
this one)."""

from __future__ import annotations

import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from benchmarks.harness import fmt_num, median, peak_rss_mb, percentile, spread, timed
from sinks.parquet import ParquetSink

__all__ = [
    "STEPS", "QueryRun", "TimedParquetSink", "fmt_num", "machine_info", "median",
    "peak_rss_mb", "percentile", "run_available_now", "spread", "step_totals", "timed",
]

STEPS = ("plan", "write_ahead", "read", "execute", "sink", "commit")
"""Lifecycle steps timed in every progress record's ``duration_ms``."""


class TimedParquetSink(ParquetSink):
    """A :class:`ParquetSink` that records when each batch finished writing.

    Consecutive stamps give the wall clock of one whole trip round the
    trigger loop (plan to sink, plus commit, report and loop overhead of the
    previous batch), at ``perf_counter`` resolution.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self.stamps: list[float] = []

    def add_batch(self, batch_id: int, df: pl.DataFrame) -> None:
        super().add_batch(batch_id, df)
        self.stamps.append(time.perf_counter())


@dataclass
class QueryRun:
    """What one available-now query did."""

    wall_s: float
    progress: list[dict[str, Any]]
    sink_stamps: list[float]
    started_at: float

    @property
    def input_rows(self) -> int:
        return sum(int(p["input_rows"]) for p in self.progress)

    def to_json(self) -> dict[str, Any]:
        """Numbers kept in the raw results (progress trimmed to what we use)."""
        keep = ("batch_id", "input_rows", "output_rows", "late_rows", "watermark_ms",
                "next_watermark_ms", "duration_ms", "state")
        gaps = [b - a for a, b in zip([self.started_at, *self.sink_stamps], self.sink_stamps,
                                      strict=False)]
        return {
            "wall_s": self.wall_s,
            "input_rows": self.input_rows,
            "batches": len(self.progress),
            "loop_ms": [g * 1000 for g in gaps],
            "progress": [{k: p.get(k) for k in keep} for p in self.progress],
        }


def run_available_now(stream: Any, out: Path, checkpoint: Path, *, batches_hint: int,
                      durability: str = "fsync", pipelined: bool = False) -> QueryRun:
    """Run ``stream`` into a timed Parquet sink until all input is processed."""
    sink = TimedParquetSink(out)
    writer = stream.write_to(sink)
    t0 = time.perf_counter()
    query = writer.start(str(checkpoint), trigger="available-now", retention=batches_hint + 100,
                         durability=durability, pipelined=pipelined)
    query.await_termination()
    wall = time.perf_counter() - t0
    return QueryRun(wall_s=wall, progress=query.recent_progress, sink_stamps=sink.stamps,
                    started_at=t0)














def step_totals(progress: list[dict[str, Any]]) -> dict[str, float]:
    """Milliseconds spent in each lifecycle step over all batches."""
    totals = dict.fromkeys((*STEPS, "total"), 0.0)
    for record in progress:
        for step, ms in record["duration_ms"].items():
            totals[step] = totals.get(step, 0.0) + float(ms)
    return totals


def machine_info() -> dict[str, Any]:
    """nproc, RAM, CPU model, and the versions that matter."""
    import pyarrow

    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram_gib = math.nan
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gib = int(line.split()[1]) / 1024**2
                break
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "ram_gib": round(ram_gib, 1),
        "cpu": cpu,
        "python": platform.python_version(),
        "polars": pl.__version__,
        "pyarrow": pyarrow.__version__,
        "polars_threads": pl.thread_pool_size(),
    }
