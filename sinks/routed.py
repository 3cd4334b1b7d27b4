"""One query's rows, a different subset to each sink: ``Routed``.

A fraud rule's alerts page a webhook once (the firing row), while the alert
table keeps every correction (upserted by alert id). One query, one rule: a
:class:`~sinks.fanout.FanOutSink` of ``Routed`` sinks gives each sink the rows
matching its ``where``, opened with its own output mode and key columns.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import polars as pl

from sinks.base import BatchContext, OutputMode, Sink, SinkContext
from sinks.exceptions import SinkError

__all__ = ["Routed"]


class Routed(Sink):
    """``sink``, given only the rows where ``where`` holds (all rows when ``None``),
    opened with ``output_mode`` and ``key_columns`` when they are given.

    Idempotency is the wrapped sink's: a replayed batch is filtered the same way
    and the sink skips what it stored.
    """

    def __init__(
        self,
        sink: Sink,
        *,
        where: pl.Expr | None = None,
        output_mode: OutputMode | None = None,
        key_columns: tuple[str, ...] | None = None,
    ) -> None:
        self.sink = sink
        self.where = where
        self.output_mode = output_mode
        self.key_columns = key_columns

    @property
    def label(self) -> str:
        return self.sink.label

    def on_open(self, ctx: SinkContext) -> None:
        """Open the wrapped sink with this route's mode and keys."""
        routed = replace(
            ctx,
            output_mode=self.output_mode or ctx.output_mode,
            key_columns=self.key_columns if self.key_columns is not None else ctx.key_columns,
        )
        self.sink.open(routed)

    def write(self, batch: BatchContext, df: pl.DataFrame) -> None:
        """Hand the matching rows to the wrapped sink (which skips a stored batch)."""
        if self.where is not None and df.width:
            try:
                df = df.filter(self.where)
            except pl.exceptions.PolarsError as exc:
                raise SinkError(
                    f"{self.label}: the route's condition {self.where} cannot be evaluated on "
                    f"batch {batch.batch_id} (columns {df.columns}): {exc}"
                ) from exc
        self.sink.add_batch(batch.batch_id, df)

    def close(self) -> None:
        self.sink.close()

    def metrics(self) -> dict[str, Any]:
        return self.sink.metrics()

    def describe(self) -> dict[str, Any]:
        return {
            "kind": type(self).__name__,
            "where": None if self.where is None else str(self.where),
            "output_mode": self.output_mode,
            "sink": self.sink.describe(),
        }
