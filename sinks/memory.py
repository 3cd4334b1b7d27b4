"""An in-process table per query name, for tests and notebooks.

Every batch's frame is kept in a process-global registry keyed by table name
and batch id, so a replayed batch id is a no-op and the result survives the
sink object (a restarted query in the same process finds its earlier batches).
The registry is guarded by one lock: queries on other threads may write while
a notebook reads.

The whole history is kept in memory; call :func:`drop_memory_table` to free it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from sinks.base import BatchContext, OutputMode, Sink, SinkContext
from sinks.changelog import CHANGE_TYPE, DELETE, UPDATE_POSTIMAGE, UPDATE_PREIMAGE, is_changelog
from sinks.changes import changelog_rows, table_changes
from sinks.exceptions import SinkConfigError, SinkError

_FIRST_POS = "__microbatch_first_pos__"


class UnknownTableError(SinkError):
    """No memory table of that name exists in this process."""


@dataclass
class _Table:
    query_id: str
    output_mode: OutputMode
    key_columns: tuple[str, ...]
    schema: pl.Schema | None
    batches: dict[int, pl.DataFrame] = field(default_factory=dict)


_LOCK = threading.Lock()
_TABLES: dict[str, _Table] = {}


class MemorySink(Sink):
    """Keeps each batch's frame in memory under ``name``; idempotent per batch id.

    Output modes decide what :func:`memory_table` returns:

    - ``append``: every batch concatenated in batch id order;
    - ``complete``: the frame of the latest batch (the whole result table);
    - ``update``: an upsert by the context's ``key_columns``: for each key the
      row from the latest batch wins (the last row within that batch); rows
      keep the position where their key first appeared. Without key columns,
      ``update`` behaves like ``append``. A batch carrying ``_change_type``
      (a changelog, :mod:`sinks.changelog`) is applied as changes: a key whose
      last change is a ``delete`` leaves the table, preimages are ignored, and
      a key inserted again after a delete takes the position of its new
      insert. Such a batch needs key columns (:class:`SinkConfigError`);
    - ``changelog``: every batch's change rows concatenated, ``_change_type``
      included (a batch without it: all inserts, see
      :func:`sinks.changes.changelog_rows`).

    A query reopening ``name`` with the same query id (a restart on the same
    checkpoint) keeps the stored batches, so its replay of the last batch is a
    no-op; a different query id starts the table afresh.

    Parameters
    ----------
    name
        The table name to read back with :func:`memory_table`.
    schema
        The schema of the output, so that the table has the right columns
        before the first batch arrives. Otherwise it is learnt from the first
        batch.

    Examples
    --------
    >>> sink = MemorySink("doc_example")
    >>> sink.open(SinkContext(query_id="q1"))
    >>> sink.add_batch(0, pl.DataFrame({"a": [1, 2]}))
    >>> sink.add_batch(0, pl.DataFrame({"a": [1, 2]}))  # a replay: no-op
    >>> memory_table("doc_example")["a"].to_list()
    [1, 2]
    >>> drop_memory_table("doc_example")
    """

    def __init__(
        self, name: str, *, schema: pl.Schema | Mapping[str, pl.DataType] | None = None
    ) -> None:
        if not isinstance(name, str) or not name:
            raise SinkConfigError(f"a memory table needs a non-empty name, got {name!r}")
        self.name = name
        self.schema = pl.Schema(schema) if schema is not None else None

    @property
    def label(self) -> str:
        return f"MemorySink({self.name!r})"

    def on_open(self, ctx: SinkContext) -> None:
        """Register the table, keeping its batches if the same query wrote them."""
        with _LOCK:
            table = _TABLES.get(self.name)
            if table is None or table.query_id != ctx.query_id:
                _TABLES[self.name] = self._new_table(ctx)
            else:
                table.output_mode = ctx.output_mode
                table.key_columns = ctx.key_columns
                if self.schema is not None:
                    table.schema = self.schema

    def is_written(self, batch: BatchContext) -> bool:
        """The table holds the batch id (for the same query)."""
        with _LOCK:
            table = _TABLES.get(self.name)
            return table is not None and batch.batch_id in table.batches and (
                table.query_id == batch.query_id
            )

    def write(self, batch: BatchContext, df: pl.DataFrame) -> None:
        """Store ``df`` as batch ``batch.batch_id``."""
        batch_id = batch.batch_id
        where = f"{self.label} batch {batch_id}"
        if batch.output_mode == "changelog":
            df = changelog_rows(df, batch.key_columns, where)
        elif batch.output_mode == "update" and is_changelog(df):
            table_changes(df, batch.key_columns, where)  # refuse bad changes now, not on read
        if batch.output_mode == "update" and df.width:
            # NOTE: a batch without columns (a source without a declared schema
            # whose every record was a dead letter) has no rows to upsert
            missing = [c for c in batch.key_columns if c not in df.columns]
            if missing:
                raise SinkError(
                    f"batch {batch_id} for memory table {self.name!r} lacks the key "
                    f"column(s) {missing} that update mode upserts by; columns are {df.columns}"
                )
        with _LOCK:
            table = _TABLES.get(self.name)
            if table is None:  # dropped while the query runs: start afresh
                table = _TABLES[self.name] = self._new_table(batch.run)
            elif table.query_id != batch.query_id:
                raise SinkError(
                    f"memory table {self.name!r} now belongs to query {table.query_id}; "
                    f"query {batch.query_id} cannot write batch {batch_id} to it. "
                    "Give each running query its own memory table name."
                )
            if batch_id in table.batches:
                return
            table.batches[batch_id] = df.clone()  # clones are cheap: columns are shared
            if table.schema is None:
                table.schema = df.schema

    def describe(self) -> dict[str, Any]:
        """The sink kind and table name."""
        return {"kind": type(self).__name__, "name": self.name}

    def _new_table(self, ctx: SinkContext) -> _Table:
        return _Table(
            query_id=ctx.query_id,
            output_mode=ctx.output_mode,
            key_columns=ctx.key_columns,
            schema=self.schema,
        )


def _get(name: str) -> _Table:
    table = _TABLES.get(name)
    if table is None:
        known = ", ".join(repr(n) for n in sorted(_TABLES)) or "none"
        raise UnknownTableError(
            f"no memory table named {name!r} in this process (known tables: {known}); "
            "start a query with write_memory(name) first"
        )
    return table


def memory_batches(name: str) -> dict[int, pl.DataFrame]:
    """Every stored batch of table ``name``, by batch id in increasing order.

    Raises :class:`UnknownTableError` when there is no such table.
    """
    with _LOCK:
        table = _get(name)
        return {batch_id: df.clone() for batch_id, df in sorted(table.batches.items())}


def memory_table(name: str) -> pl.DataFrame:
    """The current result table ``name`` as its output mode defines it.

    With no batches yet, an empty frame with the table's schema when known.
    Raises :class:`UnknownTableError` when there is no such table.
    """
    with _LOCK:
        table = _get(name)
        frames = [df for _, df in sorted(table.batches.items())]
        mode, keys, schema = table.output_mode, table.key_columns, table.schema
    if not frames:
        if mode == "update" and schema is not None and CHANGE_TYPE in schema:
            schema = pl.Schema({n: t for n, t in schema.items() if n != CHANGE_TYPE})
        return pl.DataFrame(schema=schema)
    if mode == "complete":
        return frames[-1].clone()
    changes = mode == "update" and bool(keys) and any(is_changelog(df) for df in frames)
    if changes:
        # batches of plain upserts among changelog batches: each row an upsert
        frames = [
            df if is_changelog(df) or not df.width
            else df.with_columns(pl.lit(UPDATE_POSTIMAGE).alias(CHANGE_TYPE))
            for df in frames
        ]
    combined = _concat(name, frames)
    if changes:
        return _apply_changes(combined, keys)
    if mode == "update" and keys:
        return (
            combined.with_row_index(_FIRST_POS)
            .with_columns(pl.col(_FIRST_POS).min().over(keys))
            .unique(subset=list(keys), keep="last", maintain_order=True)
            .sort(_FIRST_POS)
            .drop(_FIRST_POS)
        )
    return combined


def _apply_changes(changes: pl.DataFrame, keys: tuple[str, ...]) -> pl.DataFrame:
    """The table left by applying ``changes`` (every batch's, in order) by ``keys``.

    Vectorized over the whole history: each key's last non-preimage change
    decides (a delete: absent); a row sits where its key was first inserted
    after the key's last delete.
    """
    if CHANGE_TYPE not in changes.columns:  # only empty batches without columns
        return changes
    kind = pl.col(CHANGE_TYPE)
    pos = pl.col(_FIRST_POS).cast(pl.Int64)
    last_delete = "__microbatch_last_delete__"
    return (
        changes.with_row_index(_FIRST_POS)
        .filter(kind != UPDATE_PREIMAGE)
        .with_columns(pos.filter(kind == DELETE).max().over(keys).fill_null(-1).alias(last_delete))
        .with_columns(pos.filter(pos > pl.col(last_delete)).min().over(keys).alias(_FIRST_POS))
        .unique(subset=list(keys), keep="last", maintain_order=True)
        .filter(kind != DELETE)
        .sort(_FIRST_POS)
        .drop(_FIRST_POS, last_delete, CHANGE_TYPE)
    )


def drop_memory_table(name: str) -> None:
    """Forget table ``name`` and free its batches; a no-op when it does not exist."""
    with _LOCK:
        _TABLES.pop(name, None)


def _concat(name: str, frames: list[pl.DataFrame]) -> pl.DataFrame:
    # Empty batches (e.g. no-data batches) may carry loosely typed columns:
    # they add no rows, so they do not get a say in the result's schema.
    non_empty = [df for df in frames if df.height > 0]
    if not non_empty:
        return frames[-1].clone()
    try:
        return pl.concat(non_empty, how="vertical_relaxed").clone()  # never the stored frame
    except pl.exceptions.PolarsError as exc:
        raise SinkError(
            f"the batches of memory table {name!r} have incompatible schemas ({exc}); "
            "inspect them with memory_batches(name)"
        ) from exc
