"""One query's result written to several sinks, each exactly once per batch id."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from sinks.base import BatchContext, OutputMode, Sink, SinkContext
from sinks.exceptions import SinkConfigError


class FanOutSink(Sink):
    """Hands every batch to each of ``sinks``, in order.

    Exactly once per sink: each sink is idempotent on the batch id by itself
    (a Delta app transaction, a Kafka transaction marker, a Parquet
    manifest), so when a crash lands between two of them, the replay of the
    batch is a no-op for the sinks that had it and a write for the others.
    The batch is committed by the engine only after every sink took it.
    """

    def __init__(self, sinks: Sequence[Sink]) -> None:
        if not sinks:
            raise SinkConfigError("FanOutSink needs at least one sink")
        self.sinks = tuple(sinks)
        modes = set.intersection(*(set(s.supported_modes) for s in self.sinks))
        self.supported_modes: tuple[OutputMode, ...] = tuple(
            m for m in ("append", "update", "complete") if m in modes
        )

    def on_open(self, ctx: SinkContext) -> None:
        """Open every sink with the same context (the same query id)."""
        for sink in self.sinks:
            sink.open(ctx)

    def write(self, batch: BatchContext, df: pl.DataFrame) -> None:
        """Give ``df`` to every sink (each skips a batch it has); the first failure
        fails the batch."""
        for sink in self.sinks:
            sink.add_batch(batch.batch_id, df)

    def close(self) -> None:
        """Close every sink (all of them, even when one fails)."""
        errors = []
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:  # close the others, then report
                errors.append(exc)
        if errors:
            raise errors[0]

    def metrics(self) -> dict[str, Any]:
        """Each sink's figures of the last batch, by its label (sinks without any
        are left out)."""
        return {sink.label: m for sink in self.sinks if (m := sink.metrics())}

    def describe(self) -> dict[str, Any]:
        """The descriptions of the sinks."""
        return {"kind": type(self).__name__, "sinks": [s.describe() for s in self.sinks]}
