"""An append-only state buffer: rows appended per batch, popped by a time bound.

A :class:`StateStore` keeps one row per key and pays a hash lookup and an
upsert for every key a batch touches. Some state never needs that: the
partial aggregates of append-mode windows are only ever *combined* when their
window closes. :class:`AppendBuffer` keeps such rows as they arrive (no key
uniqueness, no index) and hands back, by time, the rows whose window closed;
the operator combines them then, once.

On disk it has the same versions as a store (:mod:`statestore.files`): each
version's changelog is the ordered list of its operations, so replaying it
from the newest snapshot rebuilds exactly the rows, in exactly the order, the
live buffer held (order matters: floating-point sums combine in it):

- ``__op = 0`` rows appended;
- ``__op = 2`` one row whose time column is ``t``: every row with time <= ``t``
  was popped;
- ``__op = 3`` one row: every row was removed (the start of a ``replace``).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from statestore.contract import VersionKeeper
from statestore.exceptions import StateStoreError
from statestore.schema import OP_COLUMN, StateSchema
from statestore.versioned import VersionedState

__all__ = ["AppendBuffer"]

OP_APPEND = 0
OP_POP = 2
OP_RESET = 3


class _Chunk:
    """Rows appended together, with the range of their (non-null) times."""

    __slots__ = ("frame", "high", "low")

    def __init__(self, frame: pl.DataFrame, time_column: str) -> None:
        self.frame = frame
        times = frame.get_column(time_column)
        self.low: int | None = times.min()  # type: ignore[assignment]
        self.high: int | None = times.max()  # type: ignore[assignment]


class AppendBuffer(VersionedState):
    """Rows in arrival order; ``pop_expired(t)`` removes those with time <= ``t``.

    Guarantees: ``pop_expired`` returns the popped rows in arrival order, and
    a buffer rebuilt from disk at version ``v`` holds the same rows in the same
    order as the live buffer did at ``v``. ``commit()`` makes the staged
    operations durable as ``version + 1``; ``abort()`` (or a failed commit)
    discards them and closes this object. Not thread-safe.
    """

    _reload = "provider.load_buffer(version)"

    def __init__(self, provider: VersionKeeper, schema: StateSchema, version: int) -> None:
        if schema.time_column is None:
            raise StateStoreError("an append buffer needs a time_column")
        super().__init__(provider, version)
        self._schema = schema
        self._time = schema.time_column
        self._chunks: list[_Chunk] = []
        self._rows = 0
        self._ops: list[pl.DataFrame] = []
        self._appended = self._popped = 0

    # ----------------------------------------------------------------- reads

    @property
    def num_rows(self) -> int:
        """Rows held, staged operations included."""
        self._check_open()
        return self._rows

    def next_time(self) -> int | None:
        """The earliest time of any row, or ``None`` when empty."""
        self._check_open()
        lows = [c.low for c in self._chunks if c.low is not None]
        return min(lows) if lows else None

    def to_frame(self) -> pl.DataFrame:
        """Every row, in arrival order. O(rows)."""
        self._check_open()
        if not self._chunks:
            return pl.DataFrame(schema=self._schema.polars_schema)
        return pl.concat([c.frame for c in self._chunks], rechunk=False)

    # ------------------------------------------------------------- mutations

    def append(self, rows: pl.DataFrame) -> None:
        """Add ``rows`` (the schema's columns, cast to it). O(len(rows))."""
        self._check_open()
        frame = self._schema.conform(rows, self._schema.columns, "append")
        if frame.height:
            self._append(frame)
            self._ops.append(frame.with_columns(pl.lit(OP_APPEND, pl.Int8).alias(OP_COLUMN)))

    def pop_expired(self, t: int) -> pl.DataFrame:
        """Remove and return the rows whose time is <= ``t``, in arrival order.

        Rows with a null time never expire. Cost: O(rows of the chunks holding
        a popped row), not O(rows held) when time advances with arrival.
        """
        self._check_open()
        threshold = self._schema.time_to_physical(t)
        popped = self._pop(threshold)
        if popped.height:
            self._ops.append(self._marker(OP_POP, threshold))
        return popped

    def replace(self, rows: pl.DataFrame) -> None:
        """Swap the whole content for ``rows`` (a compaction). O(len(rows))."""
        self._check_open()
        self._chunks, self._rows = [], 0
        self._ops.append(self._marker(OP_RESET, None))
        self.append(rows)

    # ------------------------------------------------------------ lifecycle

    def _has_staged(self) -> bool:
        return bool(self._ops)

    def _committed(self) -> None:
        self._ops = []

    @property
    def metrics(self) -> dict[str, Any]:
        """Size and this batch's activity (rows appended and popped)."""
        nbytes = sum(c.frame.estimated_size() for c in self._chunks)
        return {
            "version": self._version,
            "rows": self._rows,
            "bytes": nbytes,
            "bytes_per_row": nbytes / max(self._rows, 1),
            "upserted": self._appended,
            "deleted": self._popped,
            "chunks": len(self._chunks),
            **self._last,
        }

    # ------------------------------------------- called by the provider only

    def begin_batch(self, load_ms: float) -> None:
        """Reset per-batch metrics (the provider, on each load)."""
        super().begin_batch(load_ms)
        self._appended = self._popped = 0

    def load_rows(self, frame: pl.DataFrame) -> None:
        """Bulk-load a snapshot's rows into an empty buffer."""
        if frame.height:
            self._append(frame)

    def apply_changelog(self, frame: pl.DataFrame) -> None:
        """Replay one committed changelog, operation by operation, in order."""
        ops = frame.get_column(OP_COLUMN)
        runs = ops.rle()
        start = 0
        for length, op in zip(runs.struct.field("len"), runs.struct.field("value"), strict=True):
            part = frame.slice(start, length)
            start += length
            if op == OP_APPEND:
                self._append(part.drop(OP_COLUMN))
            elif op == OP_POP:
                for t in part.get_column(self._time):
                    self._pop(int(t))
            elif op == OP_RESET:
                self._chunks, self._rows = [], 0
            else:
                raise StateStoreError(f"changelog of {self._provider.directory} has op {op}")
        self._appended = self._popped = 0

    # ------------------------------------------------------------- internals

    def _append(self, frame: pl.DataFrame) -> None:
        self._chunks.append(_Chunk(frame, self._time))
        self._rows += frame.height
        self._appended += frame.height

    def _pop(self, threshold: int) -> pl.DataFrame:
        popped: list[pl.DataFrame] = []
        kept: list[_Chunk] = []
        is_due = pl.col(self._time) <= threshold
        for chunk in self._chunks:
            if chunk.low is None or chunk.low > threshold:
                kept.append(chunk)
            elif chunk.high is not None and chunk.high <= threshold and chunk.frame.get_column(
                self._time
            ).null_count() == 0:
                popped.append(chunk.frame)
            else:
                popped.append(chunk.frame.filter(is_due))
                rest = chunk.frame.filter(~is_due | is_due.is_null())
                if rest.height:
                    kept.append(_Chunk(rest, self._time))
        self._chunks = kept
        if not popped:
            return pl.DataFrame(schema=self._schema.polars_schema)
        out = pl.concat(popped)
        self._rows -= out.height
        self._popped += out.height
        return out

    def _marker(self, op: int, t: int | None) -> pl.DataFrame:
        schema = {**self._schema.polars_schema, OP_COLUMN: pl.Int8()}
        row: dict[str, Any] = dict.fromkeys(schema)
        row[self._time] = t
        row[OP_COLUMN] = op
        return pl.DataFrame([row], schema=schema)

    def _changelog(self) -> pl.DataFrame:
        if not self._ops:
            return pl.DataFrame(schema={**self._schema.polars_schema, OP_COLUMN: pl.Int8()})
        return pl.concat(self._ops)
