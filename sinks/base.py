"""The protocol every sink implements, and the base class that owns it.

The engine calls ``open`` once per run, then ``add_batch(batch_id, df)`` for
each batch, in increasing batch id order, possibly repeating the last batch
id after a crash, and ``close`` at the end. A repeated call with an id already
stored must be a no-op: that is what turns at-least-once replays into
exactly-once output.

:class:`Sink` owns that protocol (Quix Streams' ``BaseSink`` shape): ``add_batch``
refuses a sink that was not opened and a negative id, builds the
:class:`BatchContext`, asks :meth:`Sink.is_written` (the sink's durable record
of what it stored: a manifest entry, a Delta app transaction, a Kafka marker)
and calls :meth:`Sink.write` only for a batch not stored yet. A sink implements
``write`` and, when it can tell, ``is_written``; ``on_open``/``close`` if it
holds resources.

Distributed writes (a query on Ray workers). A sink whose data are files may
let the workers write them: :meth:`Sink.distributed_writer` gives a picklable
:class:`WriteTask` for a batch (``None``: the driver writes, as above); each
worker calls ``task.write(rows, part)`` for its share of the batch's output
and returns the :class:`WrittenFile` descriptions; the driver gathers them
into a :class:`WrittenBatch` and calls :meth:`Sink.commit_files`, which skips
a batch already stored (:meth:`Sink.is_written`, as ``add_batch`` does) and
otherwise makes the files the batch in one commit (:meth:`Sink.commit_written`).
Files of an attempt that is never committed (a lost worker, a crash before the
commit, a replay of a stored batch) are left unreferenced: invisible to
readers, removed by the sink's maintenance (Delta: a full ``VACUUM``).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import polars as pl

from sinks.exceptions import SinkConfigError, SinkError

__all__ = [
    "BatchContext",
    "OutputMode",
    "Sink",
    "SinkContext",
    "WriteTask",
    "WrittenBatch",
    "WrittenFile",
]

log = logging.getLogger("sinks")

OutputMode = Literal["append", "update", "complete", "changelog"]


@dataclass(frozen=True)
class SinkContext:
    """What the engine tells a sink when a run starts."""

    query_id: str
    """Stable across restarts of the same checkpoint: the idempotency key."""
    output_mode: OutputMode = "append"
    checkpoint_dir: Path | None = None
    """The query's checkpoint directory, or ``None`` without a checkpoint."""
    key_columns: tuple[str, ...] = ()
    """Columns that identify a result row (``update`` mode upserts by them)."""
    fault_point: Callable[[str, int], None] | None = None
    """Called as ``fault_point(name, batch_id)`` at named points inside a
    sink's commit protocol (e.g. ``"sink.after_data"``), so crash tests can
    kill the process there. ``None`` outside tests."""
    role: str = "output"
    """Which output of the query this sink is: ``output``, ``late`` or
    ``dead_letter`` (a table's writer registry records it)."""
    predecessors: Mapping[str, int] = field(default_factory=dict)
    """Query id -> last batch it committed, of the queries this one continues
    (a checkpoint started from their savepoint): a table they write is handed
    over to this query rather than refused as another writer's."""

    def at(self, name: str, batch_id: int) -> None:
        """Signal that the sink reached point ``name`` while writing ``batch_id``."""
        if self.fault_point is not None:
            self.fault_point(name, batch_id)


@dataclass(frozen=True)
class BatchContext:
    """What a sink knows while it stores one batch."""

    run: SinkContext
    batch_id: int

    @property
    def query_id(self) -> str:
        return self.run.query_id

    @property
    def output_mode(self) -> OutputMode:
        return self.run.output_mode

    @property
    def key_columns(self) -> tuple[str, ...]:
        return self.run.key_columns

    def at(self, name: str) -> None:
        """Signal fault point ``name`` of this batch (see :attr:`SinkContext.fault_point`)."""
        self.run.at(name, self.batch_id)


@dataclass(frozen=True)
class WrittenFile:
    """One data file a worker wrote for a batch, not committed yet (plain values:
    it travels from the worker to the driver)."""

    path: str
    """Relative to the sink's root (a table or output directory)."""
    size: int
    """Bytes on storage."""
    rows: int
    partition_values: Mapping[str, str | None] = field(default_factory=dict)
    """Partition column -> its value as the sink's format writes it in paths."""
    stats: str | None = None
    """The file's column statistics as the sink's format records them (Delta's
    ``stats`` JSON: ``numRecords``, ``minValues``, ``maxValues``, ``nullCount``)."""
    schema: Mapping[str, pl.DataType] = field(default_factory=dict)
    """The columns of the rows in the file, partition columns included, as written."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """What else the sink's commit needs of the file (e.g. typed partition values)."""


@dataclass(frozen=True)
class WrittenBatch:
    """Everything the workers wrote for one batch: what :meth:`Sink.commit_files` commits."""

    files: tuple[WrittenFile, ...]
    """In shard order (each shard's files in the order it wrote them)."""
    rows: int
    schema: Mapping[str, pl.DataType] | None
    """The columns of the rows written (``None``: no file was written)."""

    @classmethod
    def gather(cls, files: list[WrittenFile], *, where: str) -> WrittenBatch:
        """The batch made of ``files``; :class:`SinkError` when they disagree on
        the columns (shards of one query write one schema)."""
        schemas = {tuple(f.schema.items()) for f in files}
        if len(schemas) > 1:
            first, *others = sorted(schemas, key=str)
            raise SinkError(
                f"{where}: the workers wrote files with different columns ({dict(first)} "
                f"and {dict(others[0])}); nothing was committed. Cast the query's output "
                "to fixed types (select/cast before the sink)."
            )
        schema = dict(files[0].schema) if files else None
        return cls(files=tuple(files), rows=sum(f.rows for f in files), schema=schema)

    @property
    def height(self) -> int:
        """Rows written, like a frame's ``height``."""
        return self.rows


class WriteTask(ABC):
    """Writes a share of one batch's output rows as data files, on a worker.

    Picklable (sent to every worker); does not commit anything: the driver's
    :meth:`Sink.commit_files` does, once per batch. Calling :meth:`write` twice
    for one share (a re-run after a lost worker) writes new files under new
    names: files are never overwritten."""

    batch_id: int

    @abstractmethod
    def write(self, df: pl.DataFrame, part: int) -> list[WrittenFile]:
        """Write ``df`` (share ``part`` of the batch, e.g. a shard) durably as
        uncommitted files; their descriptions. No rows: no files."""


class Sink(ABC):
    """Receives each batch's result rows; idempotent per batch id.

    Subclasses implement :meth:`write` (and :meth:`is_written` when they keep a
    durable record of stored batches); they do not override :meth:`add_batch`.
    """

    supported_modes: tuple[OutputMode, ...] = ("append", "update", "complete", "changelog")
    mode_advice: str = ""
    """Appended to the error for an unsupported output mode (what to use instead)."""
    _ctx: SinkContext | None = None
    skipped_batches: int = 0
    """Batches that ``add_batch`` found already stored (replays), this run."""

    @property
    def label(self) -> str:
        """How errors name this sink, e.g. ``ParquetSink('out/')``."""
        return type(self).__name__

    @property
    def context(self) -> SinkContext:
        """The run's context; raises when the sink was not opened."""
        if self._ctx is None:
            raise SinkError(f"{self.label} is not open; the engine opens sinks before a batch")
        return self._ctx

    def open(self, ctx: SinkContext) -> None:
        """Bind to a query before the first ``add_batch`` of a run."""
        if ctx.output_mode not in self.supported_modes:
            raise SinkConfigError(
                f"{self.label} does not support output_mode={ctx.output_mode!r}; it supports "
                f"{', '.join(self.supported_modes)}. {self.mode_advice}".rstrip()
            )
        self._ctx = ctx
        self.skipped_batches = 0
        self.on_open(ctx)

    def on_open(self, ctx: SinkContext) -> None:  # noqa: B027 - optional hook
        """Acquire resources and check the destination (called by :meth:`open`)."""

    def add_batch(self, batch_id: int, df: pl.DataFrame) -> None:
        """Store ``df`` as the output of ``batch_id``; a no-op if already stored."""
        if self._ctx is None:
            raise SinkError(
                f"{self.label}.add_batch({batch_id}) before open(ctx); "
                "the engine opens sinks before the first batch"
            )
        if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
            raise SinkError(f"{self.label}: batch ids are integers >= 0, got {batch_id!r}")
        batch = BatchContext(self._ctx, batch_id)
        if self.is_written(batch):
            self.skipped_batches += 1
            log.info("%s: batch %d is already stored; skipped", self.label, batch_id)
            return
        self.write(batch, df)

    def is_written(self, batch: BatchContext) -> bool:
        """True when ``batch`` is already stored (checked before each :meth:`write`).

        The default, ``False``, suits a sink whose :meth:`write` is idempotent
        by itself or that cannot know (an external system without a record)."""
        return False

    @abstractmethod
    def write(self, batch: BatchContext, df: pl.DataFrame) -> None:
        """Store ``df`` as ``batch``: durably, or raise (the batch is then re-run)."""

    def distributed_writer(self, batch_id: int) -> WriteTask | None:
        """A task that lets workers write ``batch_id``'s data files, or ``None``
        (the default): the rows come to the driver and go through :meth:`add_batch`.

        Must not do I/O: the engine may ask while another batch is being committed."""
        return None

    def commit_files(self, batch_id: int, written: WrittenBatch) -> None:
        """Commit the files the workers wrote for ``batch_id`` as that batch, once:
        a no-op (files left unreferenced) if the batch is already stored."""
        if self._ctx is None:
            raise SinkError(
                f"{self.label}.commit_files({batch_id}) before open(ctx); "
                "the engine opens sinks before the first batch"
            )
        batch = BatchContext(self._ctx, batch_id)
        if self.is_written(batch):
            self.skipped_batches += 1
            log.info("%s: batch %d is already stored; skipped (its %d new files are left "
                     "unreferenced)", self.label, batch_id, len(written.files))
            return
        self.commit_written(batch, written)

    def commit_written(self, batch: BatchContext, written: WrittenBatch) -> None:
        """Make ``written`` the stored output of ``batch`` in one commit (a sink
        whose :meth:`distributed_writer` gives tasks implements it)."""
        raise SinkError(
            f"{self.label} gave no distributed writer, so it cannot commit files written "
            f"by workers (batch {batch.batch_id}); this is a bug in the sink"
        )

    def close(self) -> None:  # noqa: B027 - optional hook
        """Flush and release resources."""

    def describe(self) -> dict[str, Any]:
        """A JSON description for plans, status and fingerprints."""
        return {"kind": type(self).__name__}

    def metrics(self) -> dict[str, Any]:
        """Figures of the last batch for its progress record (JSON values);
        ``{}`` when the sink has none."""
        return {}
