"""Sinks: where a streaming query's result rows go, exactly once per batch id.

The engine calls ``sink.open(ctx)``, then ``sink.add_batch(batch_id, df)`` for
each batch, possibly repeating the last id after a crash; every sink here makes
that repeat a no-op (see :mod:`sinks.base`). This package never imports the
engine, so the sinks can be used and tested on their own.

- :class:`ParquetSink`: files plus a manifest of committed batches (append);
  read back with :func:`read_parquet_output`.
- :class:`MemorySink`: an in-process table for tests and notebooks
  (append, update, complete); read back with :func:`memory_table`.
- :class:`ConsoleSink`: prints each batch.
- :class:`ForeachBatchSink`: calls ``fn(df, batch_id)``; idempotency is ``fn``'s job.
- :class:`DeltaSink`: a Delta table, one commit per batch carrying the app
  transaction ``(query_id, batch_id)`` (append, update by MERGE, complete).
- :class:`IcebergSink`: an Iceberg table (PyIceberg), one catalog commit per
  batch recording ``(query id, batch id)`` in its snapshot summary (append,
  update by delete + append, complete, changelog).
- :class:`KafkaSink`: a Kafka topic, one transaction per batch (or dedupe headers).
- :class:`WebhookSink`: an HTTP POST per row (or JSON array) with an
  ``Idempotency-Key``: at least once per key, one body per key.
- :class:`FanOutSink`: several sinks, each exactly once per batch id;
  :class:`Routed` gives one of them a subset of the rows, with its own mode.

Changelogs (a ``_change_type`` column, :mod:`sinks.changelog`): in ``update``
mode the memory, Delta and Kafka sinks apply deletes as well as upserts; in
``changelog`` mode sinks append the change rows (:mod:`sinks.changes`).
"""

from __future__ import annotations

from sinks.base import BatchContext, OutputMode, Sink, SinkContext
from sinks.console import ConsoleSink
from sinks.delta import DeltaSink
from sinks.exceptions import (
    OtherWriterError,
    PromoteUnfinishedError,
    RetiredWriterError,
    SinkConfigError,
    SinkError,
)
from sinks.fanout import FanOutSink
from sinks.foreach import ForeachBatchSink
from sinks.iceberg import IcebergSink
from sinks.kafka import KafkaSink
from sinks.memory import (
    MemorySink,
    UnknownTableError,
    drop_memory_table,
    memory_batches,
    memory_table,
)
from sinks.parquet import ParquetSink, committed_files, read_parquet_output
from sinks.routed import Routed
from sinks.webhook import WebhookSink

__all__ = [
    "BatchContext",
    "ConsoleSink",
    "DeltaSink",
    "FanOutSink",
    "ForeachBatchSink",
    "IcebergSink",
    "KafkaSink",
    "MemorySink",
    "OtherWriterError",
    "OutputMode",
    "ParquetSink",
    "PromoteUnfinishedError",
    "RetiredWriterError",
    "Routed",
    "Sink",
    "SinkConfigError",
    "SinkContext",
    "SinkError",
    "UnknownTableError",
    "WebhookSink",
    "committed_files",
    "drop_memory_table",
    "memory_batches",
    "memory_table",
    "read_parquet_output",
]
