"""End-to-end latency at the sink: how old the emitted rows are when written.

:class:`LatencyProbe` wraps a query's sink. After the sink accepted a batch it
measures ``now - event time`` over the batch's rows (vectorized, one Polars
expression) and keeps the maximum and the median for the progress record.
The event time of an output row is the first of the query's watermark
columns present in the output, else ``window_end`` (for window aggregates
that is the newest event time the row can include: the figure is then the
time from a window's end to its result landing). Without such a column the
latency is unknown (``None``).

The probe is transparent: it delegates ``open``, ``close``, ``describe``
(so the job's fingerprint does not change) and every other attribute.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from microbatch.exceptions import PlanError
from microbatch.plan.event_time import event_time_ms
from microbatch.plan.nodes import PlanNode, WatermarkNode
from microbatch.types import OutputMode
from sinks.base import BatchContext, Sink, SinkContext, WriteTask, WrittenBatch

WINDOW_END = "window_end"


def latency_columns(plan: PlanNode) -> tuple[str, ...]:
    """Candidate event-time columns of the output, in order of preference."""
    marks = [n.spec.column for n in plan.walk() if isinstance(n, WatermarkNode)]
    return (*dict.fromkeys(marks), WINDOW_END)


def measure_latency(df: pl.DataFrame, columns: Sequence[str], now_ms: int) -> dict[str, Any] | None:
    """``{"column", "rows", "max_ms", "median_ms"}`` of ``now - event time``, or ``None``."""
    if df.height == 0:
        return None
    for column in columns:
        if column not in df.columns:
            continue
        try:
            expr = event_time_ms(column, df.schema)
        except PlanError:  # not a time column: try the next candidate
            continue
        ages = df.select((pl.lit(now_ms, pl.Int64) - expr).alias("age")).get_column("age")
        ages = ages.drop_nulls()
        if ages.len() == 0:
            continue
        ms = ages.to_numpy()
        return {
            "column": column,
            "rows": ages.len(),
            "max_ms": int(ms.max()),
            "median_ms": round(float(np.median(ms)), 1),
        }
    return None


class LatencyProbe(Sink):
    """A sink that forwards to ``inner`` and measures each batch's latency."""

    def __init__(self, inner: Sink, columns: Sequence[str]) -> None:
        self.inner = inner
        self.columns = tuple(columns)
        self.supported_modes: tuple[OutputMode, ...] = inner.supported_modes
        self._last: tuple[int, dict[str, Any] | None] | None = None

    def on_open(self, ctx: SinkContext) -> None:
        """Open the wrapped sink."""
        self.inner.open(ctx)

    def write(self, batch: BatchContext, df: pl.DataFrame) -> None:
        """Write through (the wrapped sink skips a stored batch), then measure
        (rows count as delivered once written)."""
        self.inner.add_batch(batch.batch_id, df)
        self._last = (
            batch.batch_id,
            measure_latency(df, self.columns, int(time.time() * 1000)),
        )

    def distributed_writer(self, batch_id: int) -> WriteTask | None:
        """The wrapped sink's (workers write its files)."""
        return self.inner.distributed_writer(batch_id)

    def commit_written(self, batch: BatchContext, written: WrittenBatch) -> None:
        """Commit through the wrapped sink; no latency (the rows stayed on the workers)."""
        self.inner.commit_files(batch.batch_id, written)
        self._last = (batch.batch_id, None)

    def latency(self, batch_id: int) -> dict[str, Any] | None:
        """The latency measured for ``batch_id`` (``None`` if not this batch's)."""
        if self._last is None or self._last[0] != batch_id:
            return None
        return self._last[1]

    def close(self) -> None:
        """Close the wrapped sink."""
        self.inner.close()

    def describe(self) -> dict[str, Any]:
        """The wrapped sink's description (the fingerprint must not change)."""
        return self.inner.describe()

    def metrics(self) -> dict[str, Any]:
        """The wrapped sink's figures of the last batch."""
        return self.inner.metrics()

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (e.g. during unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)
