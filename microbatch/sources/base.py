"""The protocol every source implements.

A source is a replayable log. It names positions in that log with JSON
values (*offsets*); the engine records the ``[start, end)`` range of every
batch in ``offsets/N`` before reading, and a source must return exactly the
same rows for the same range, every time it is asked.

Lifecycle, driven by the engine::

    open(ctx)                         once per run, before anything else
    initial_offset()                  position before the first record
    latest_offset(start, ...)         end of the next batch (planning)
    read(start, end) -> SourceBatch   exactly the recorded range
    read_splits(start, end, pieces)   optional: the same range as pieces that
                                      other processes read (scale-out)
    commit(end)                       after commits/N (e.g. trim buffers)
    lag(), metrics()                  optional: numbers for the progress record
    close()
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import polars as pl

from microbatch.exceptions import PlanError
from microbatch.types import Offset

DEAD_LETTER_SCHEMA = pl.Schema(
    {
        "source": pl.String,
        "location": pl.String,
        "reason": pl.String,
        "raw": pl.Binary,
    }
)
"""Columns of a dead-letter record: which source, where in it (file and line,
partition and offset), why it was rejected, and the raw bytes (lossless)."""


SCHEMA_MISMATCH = "schema mismatch: "
"""How the reason of a dead letter for a whole input that does not fit the
declared schema begins (a column missing, or of a type that does not convert).
The engine counts these dead letters as ``schema_mismatch`` in the progress
record: the prefix is the contract between a source and that count."""


def empty_dead_letters() -> pl.DataFrame:
    """A dead-letter frame with no rows."""
    return DEAD_LETTER_SCHEMA.to_frame()


def count_schema_mismatches(dead_letters: pl.DataFrame) -> int:
    """How many of ``dead_letters`` are for an input that does not fit the schema."""
    if "reason" not in dead_letters.columns or not dead_letters.height:
        return 0
    return int(dead_letters.get_column("reason").str.starts_with(SCHEMA_MISMATCH).sum())


@dataclass(frozen=True)
class SourceContext:
    """What the engine gives a source when a run starts."""

    source_id: str
    """Stable id of the source within the query ("0", "1", ...)."""
    state_dir: Path | None
    """A directory in the checkpoint owned by this source, for its own logs
    (``None`` when running without a checkpoint, e.g. ``Stream.preview``)."""


@dataclass(frozen=True)
class SourceBatch:
    """What ``read`` returns for one recorded range."""

    data: pl.DataFrame
    dead_letters: pl.DataFrame = field(default_factory=empty_dead_letters)
    partitions: pl.Series | None = None
    """Optional per-row partition id (same length as ``data``) for
    per-partition watermarks; ``None`` means one partition."""


class ReadSplit(ABC):
    """A piece of a recorded range that any process can read by itself.

    Made by :meth:`Source.read_splits` on the driver from the range that
    ``offsets/N`` records, and sent (pickled) to a worker, whose
    :meth:`read` needs nothing of the driver's open state: a split carries
    what it reads (paths, sizes, versions, options). Guarantees: ``read()``
    returns the same rows in the same order on every call, in any process,
    and the splits of one range, read one after the other in list order and
    concatenated, are exactly ``source.read(start, end)`` (rows, order,
    columns and dead letters).
    """

    @abstractmethod
    def read(self) -> SourceBatch:
        """This piece's rows and dead letters (with the source's schema when empty)."""

    @property
    def size_hint(self) -> int:
        """Bytes to read, when known (for reports; 0 when unknown)."""
        return 0


def balanced_runs(sizes: Sequence[int], pieces: int) -> list[tuple[int, int]]:
    """``pieces`` contiguous ``[lo, hi)`` runs over items of ``sizes`` with about
    equal total size each (some may be empty); a function of ``sizes`` and
    ``pieces`` only, so the same range always gives the same runs."""
    if pieces < 1:
        raise ValueError(f"balanced_runs needs at least one piece, got {pieces}")
    if not sizes:
        return [(0, 0)] * pieces
    # NOTE: every item weighs at least 1, so that runs of empty files spread too
    cum = np.cumsum(np.maximum(np.asarray(sizes, dtype=np.int64), 1))
    total = int(cum[-1])
    # the run k ends after the first item whose running total reaches k/pieces of all
    ends = np.searchsorted(cum, total * np.arange(1, pieces) / pieces, side="left") + 1
    edges = [0, *np.minimum(ends, len(sizes)).tolist(), len(sizes)]
    return [(edges[i], edges[i + 1]) for i in range(pieces)]


def check_batch_cap(value: object, *, option: str, reader: str) -> None:
    """Refuse a per-batch cap (``max_files_per_batch``, ``max_records_per_batch``)
    that is not a positive integer or ``None``, naming the reader and option."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
        raise PlanError(f"{reader}: {option} must be a positive integer or None, got {value!r}")


class PartitionLag(TypedDict):
    """How far a query is behind one partition of a source."""

    records: int | None
    """Records (or files, for a files source) available but not yet read."""
    seconds: float | None
    """Age of the oldest record not yet read, when the source can tell."""


class Source(ABC):
    """A replayable log of records that the engine slices into batches."""

    kind: str = "source"

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """A JSON description of the source's identity (kind, path, topic...).

        Stored in the checkpoint: a restart with a source whose description
        differs in ``identity_keys`` is refused.
        """

    def identity(self) -> dict[str, Any]:
        """The part of ``describe()`` that must not change across restarts."""
        return {"kind": self.kind}

    @property
    def schema(self) -> pl.Schema | None:
        """The schema of ``read(...).data`` when known before reading."""
        return None

    def open(self, ctx: SourceContext) -> None:  # noqa: B027 - optional hook
        """Prepare for a run (e.g. load a durable file ledger)."""

    @abstractmethod
    def initial_offset(self) -> Offset:
        """The offset before the first record this query should read."""

    @abstractmethod
    def latest_offset(self, start: Offset, *, capped: bool = True) -> Offset:
        """The end offset of the next batch starting at ``start``.

        With ``capped`` the source applies its own per-batch limit
        (``max_records_per_batch`` / ``max_files_per_batch``); ``start`` is
        returned unchanged when no new data is available.
        """

    def bound(self, end: Offset, limit: Offset) -> Offset:
        """The smaller of two offsets (``available-now`` caps at its target)."""
        return end if self.compare(end, limit) <= 0 else limit

    @abstractmethod
    def compare(self, a: Offset, b: Offset) -> int:
        """-1, 0 or 1 as offset ``a`` is before, equal to or after ``b``."""

    @abstractmethod
    def read(self, start: Offset, end: Offset) -> SourceBatch:
        """Exactly the records in ``[start, end)``; same result on every call."""

    def read_splits(self, start: Offset, end: Offset, pieces: int) -> list[ReadSplit] | None:
        """``[start, end)`` as exactly ``pieces`` splits that workers read by
        themselves (some may be empty), or ``None`` when this source cannot be
        read elsewhere (the default: the driver then reads it with :meth:`read`).

        Called on the driver after the write-ahead, so it must be cheap (no
        rows read) and a function of the recorded range: a re-run of the batch
        plans the same splits. See :class:`ReadSplit` for what they guarantee.
        """
        return None

    def commit(self, end: Offset) -> None:  # noqa: B027 - optional hook
        """Everything before ``end`` is committed; the source may forget it."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; the source may be opened again later."""

    def lag(self) -> Mapping[str, int | PartitionLag] | None:
        """How far the query is behind, per partition id, as of the last plan.

        Optional hook, called by the query thread after each batch's commit,
        possibly while a read-ahead of the next batch is inside :meth:`read`;
        it must be cheap, safe against that, and must not touch the network or
        the disk. A value is either a record count or a :class:`PartitionLag`.
        ``None`` (the default) means the source cannot tell; the engine then
        asks :mod:`microbatch.observability.source_lag`, which knows the built-in sources.
        """
        return None

    def metrics(self) -> dict[str, Any]:
        """Runtime numbers for the progress record (JSON values; optional hook).

        Static facts belong in :meth:`describe`, which is fingerprinted.
        """
        return {}
