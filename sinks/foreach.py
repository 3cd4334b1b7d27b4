"""Hand each batch to a user function, like Spark's ``foreachBatch``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl

from sinks.base import BatchContext, Sink
from sinks.exceptions import SinkConfigError, SinkError

BatchFunction = Callable[[pl.DataFrame, int], object]


class ForeachBatchSink(Sink):
    """Calls ``fn(df, batch_id)`` once per batch.

    Exactly-once output is the function's job: after a crash the engine calls
    it again with the same ``batch_id`` and the same rows, so ``fn`` should
    write idempotently, keyed by ``batch_id`` (a Delta app transaction, an
    upsert, a manifest of batch ids it has written). This sink only skips an
    id it has already passed to ``fn`` successfully, per query, within the
    life of this sink object; a new process calls ``fn`` again.

    A call that raises is not remembered, so the retried batch calls ``fn``
    again; the error is raised as a :class:`SinkError` naming the batch.
    """

    def __init__(self, fn: BatchFunction) -> None:
        if not callable(fn):
            raise SinkConfigError(
                f"foreach_batch needs a function fn(df, batch_id), got {type(fn).__name__}"
            )
        self.fn = fn
        self._last_done: dict[str, int] = {}

    def is_written(self, batch: BatchContext) -> bool:
        """``fn`` already returned for ``batch_id`` (or a later id) of the query."""
        last = self._last_done.get(batch.query_id)
        return last is not None and batch.batch_id <= last

    def write(self, batch: BatchContext, df: pl.DataFrame) -> None:
        """Call ``fn(df, batch_id)``."""
        batch_id = batch.batch_id
        try:
            self.fn(df, batch_id)
        except Exception as exc:
            raise SinkError(
                f"foreach_batch function {_name(self.fn)} failed on batch {batch_id}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        self._last_done[batch.query_id] = batch_id

    def describe(self) -> dict[str, Any]:
        """The sink kind and the function's qualified name."""
        return {"kind": type(self).__name__, "fn": _name(self.fn)}


def _name(fn: BatchFunction) -> str:
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{qualname}" if module else qualname
