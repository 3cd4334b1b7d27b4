"""One query's result written to several sinks, each exactly once per batch id."""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import polars as pl

from sinks.base import BatchContext, OutputMode, Sink, SinkContext
from sinks.exceptions import SinkConfigError


class FanOutSink(Sink):
    """Hands every batch to each of ``sinks``: in order, or all at once with
    ``concurrent=True``.

    Exactly once per sink: each sink is idempotent on the batch id by itself
    (a Delta app transaction, a Kafka transaction marker, a Parquet
    manifest, a webhook's ledger), so when a crash lands between two of them,
    or in the middle of several, the replay of the batch is a no-op for the
    sinks that had it and a write for the others. The batch is committed by
    the engine only after every sink took it.

    ``concurrent=True`` runs each sink's ``add_batch`` on its own thread (the
    first on the caller's), so a batch's sink step costs its slowest sink
    instead of their sum: a webhook's POSTs, a Delta MERGE (delta-rs) and a
    Kafka transaction (librdkafka) wait on I/O with the GIL released. Use it
    when no sink depends on another having written first (e.g. a
    ``foreach_batch`` reading the table another sink writes).

    NOTE: ``write`` returns, or raises the first sink's error, only after
    every sink has finished: a failed batch never leaves a sink writing in
    the background while the engine re-runs it, and the engine's
    ``commits/N`` follows every sink's write.
    """

    def __init__(self, sinks: Sequence[Sink], *, concurrent: bool = False) -> None:
        if not sinks:
            raise SinkConfigError("FanOutSink needs at least one sink")
        self.sinks = tuple(sinks)
        self.concurrent = bool(concurrent)
        modes = set.intersection(*(set(s.supported_modes) for s in self.sinks))
        self.supported_modes: tuple[OutputMode, ...] = tuple(
            m for m in ("append", "update", "complete") if m in modes
        )
        self._pool: ThreadPoolExecutor | None = None
        self._ms: list[float | None] = [None] * len(self.sinks)

    def on_open(self, ctx: SinkContext) -> None:
        """Open every sink with the same context (the same query id)."""
        for sink in self.sinks:
            sink.open(ctx)
        if self.concurrent and len(self.sinks) > 1 and self._pool is None:
            self._pool = ThreadPoolExecutor(len(self.sinks) - 1,
                                            thread_name_prefix="microbatch-fanout")

    def write(self, batch: BatchContext, df: pl.DataFrame) -> None:
        """Give ``df`` to every sink (each skips a batch it has); the first failure
        fails the batch, once every sink has finished."""
        self._ms = [None] * len(self.sinks)
        if self._pool is None:
            for i in range(len(self.sinks)):
                self._add(i, batch.batch_id, df)
            return
        futures = [self._pool.submit(self._add, i, batch.batch_id, df)
                   for i in range(1, len(self.sinks))]
        errors: list[BaseException] = []
        try:
            self._add(0, batch.batch_id, df)
        except BaseException as exc:  # NOTE: wait for the others before raising
            errors.append(exc)
        for future in futures:
            if (error := future.exception()) is not None:
                errors.append(error)
        if errors:
            raise errors[0]

    def _add(self, i: int, batch_id: int, df: pl.DataFrame) -> None:
        started = time.perf_counter()
        self.sinks[i].add_batch(batch_id, df)
        self._ms[i] = round((time.perf_counter() - started) * 1000, 3)

    def close(self) -> None:
        """Close every sink (all of them, even when one fails)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        errors = []
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:  # close the others, then report
                errors.append(exc)
        if errors:
            raise errors[0]

    def metrics(self) -> dict[str, Any]:
        """Each sink's figures of the last batch, by its label, with ``ms``: the
        wall time of its ``add_batch`` (a sink that did not finish has none)."""
        out: dict[str, Any] = {}
        for sink, ms in zip(self.sinks, self._ms, strict=True):
            figures = sink.metrics()
            if ms is not None:
                figures = {**figures, "ms": ms}
            if figures:
                out[sink.label] = figures
        return out

    def describe(self) -> dict[str, Any]:
        """The descriptions of the sinks (and ``concurrent`` when set)."""
        described: dict[str, Any] = {"kind": type(self).__name__,
                                     "sinks": [s.describe() for s in self.sinks]}
        if self.concurrent:  # only when set: older checkpoints keep their description
            described["concurrent"] = True
        return described
