"""Measuring helpers: timed queries, statistics, memory and machine facts."""

from __future__ import annotations

import math
import os
import platform
import resource
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from sinks.parquet import ParquetSink

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
                      durability: str = "fsync") -> QueryRun:
    """Run ``stream`` into a timed Parquet sink until all input is processed."""
    sink = TimedParquetSink(out)
    writer = stream.write_to(sink)
    t0 = time.perf_counter()
    query = writer.start(str(checkpoint), trigger="available-now", retention=batches_hint + 100,
                         durability=durability)
    query.await_termination()
    wall = time.perf_counter() - t0
    return QueryRun(wall_s=wall, progress=query.recent_progress, sink_stamps=sink.stamps,
                    started_at=t0)


def timed(fn: Any) -> float:
    """Seconds taken by ``fn()``."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    """Median, NaN when empty."""
    return statistics.median(values) if values else math.nan


def spread(values: Sequence[float]) -> str:
    """``min-max`` of repeated measurements, as a short string."""
    if len(values) < 2:
        return "1 run"
    return f"{len(values)} runs, {fmt_num(min(values))}-{fmt_num(max(values))}"


def fmt_num(x: float) -> str:
    """Human-friendly rate/count: 1.23M, 456k, 12.3."""
    if math.isnan(x):
        return "n/a"
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= size:
            return f"{x / size:.2f}{suffix}"
    return f"{x:.3g}"


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
