"""Delta Lake tables, exactly once per batch id through Delta app transactions.

Every commit the sink makes carries the app transaction ``(app_id, batch_id)``
(``app_id`` is the query id), in the same Delta commit as the data, so the
table itself records which batches it holds. Protocol for batch ``N``
(NOTE: the order is what makes it exactly-once)::

    loop (at most max_attempts times):
        1. load the table, or refresh the handle kept from the last batch
           (update_incremental: a stale handle cannot commit)
        2. if table.transaction_version(app_id) >= N: return   # a replay: no-op
        3. check the batch's schema against the table's (SinkError before
           anything is written when they differ)
        4. ctx.at("sink.before_commit", N)
        5. commit the data with Transaction(app_id, N), through the same
           handle that read the version in step 2
              append:   write_deltalake(mode="append")
              update:   MERGE (upsert) on the key columns; a changelog batch:
                        one MERGE that deletes, updates and inserts
              changelog: write_deltalake(mode="append") of the change rows
              complete: write_deltalake(mode="overwrite")
           a CommitFailedError (a concurrent commit, e.g. another writer with
           the same app id that committed N first): go back to 1 -- the
           reload decides, never a blind retry
        6. local tables: fsync the new version's files and log entry (delta-rs
           never fsyncs; the engine's durable commits/N follows this return)
        7. ctx.at("sink.after_commit", N)
        8. every `optimize_every` batches: compact small files (made durable too)

Why step 5 must use the handle of step 2: delta-rs records app transactions
but never refuses a repeated ``(app_id, version)`` by itself. What it does
refuse is a commit whose read snapshot is older than a winning commit that
carries the same app id. Committing through the handle that read the
transaction version therefore turns "two writers both saw N missing" into
one commit and one conflict, and the loser's reload finds N in step 2.

The table is created on the first batch (a ``CREATE TABLE`` commit with the
batch's schema, before the batch's own commit): delta-rs does not check app
transactions when the very first commit creates the table, so creation is
kept apart from the data commits that do.

A batch without rows commits nothing in ``append`` and ``update`` mode, so
no-data batches (watermark ticks) do not add empty versions to the history;
in ``complete`` mode an empty result is a real result and overwrites. In
``update`` mode a changelog batch whose MERGE changes no row (it only deletes
keys the table does not hold) commits nothing either: delta-rs makes no
commit for such a MERGE. Its replay is a no-op all the same, since it finds
the table as it was.

Small files: each batch adds at least one file per partition. Pass
``optimize_every=N`` to run ``DeltaTable.optimize.compact()`` after every
N-th batch (a ``dataChange=false`` commit that readers and the Delta source
skip). Compaction leaves the replaced files on storage for time travel;
reclaim them with ``DeltaTable(path).vacuum(retention_hours=168,
dry_run=False)`` from a maintenance job (never with a retention shorter than
the longest-running reader or replay, which would lose files it needs).

Object storage: ``s3://`` (and other delta-rs) URIs work with
``storage_options`` passed through unchanged. delta-rs 1.x commits to S3
with conditional PUTs (``If-None-Match``), which S3 and S3-compatible
stores honour, so concurrent writers are safe without a lock table;
``AWS_S3_ALLOW_UNSAFE_RENAME`` only matters for stores without conditional
writes, where concurrent writers are then unsafe.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import polars as pl

from sinks.base import BatchContext, OutputMode, Sink, SinkContext, WriteTask, WrittenBatch
from sinks.changelog import CHANGE_TYPE, is_changelog
from sinks.changes import changelog_rows, table_changes
from sinks.delta_durability import local_root, persist_versions
from sinks.delta_files import (
    DEFAULT_INDEXED_COLUMNS,
    DeltaWriteTask,
    add_actions,
    delta_frame,
    indexed_columns_of,
    partitions_supported,
)
from sinks.delta_writers import WriterEntry, check_writers, register_writer
from sinks.exceptions import SinkConfigError, SinkError
from sinks.schema_check import Difference, SchemaMode, column_names, mismatch_message
from sinks.schema_check import schema_differences as column_differences
from sinks.writers import registration_properties, writer_of

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable, Schema

log = logging.getLogger("sinks.delta")

MAX_ATTEMPTS = 10
"""How many times a batch is tried after commit conflicts before the sink gives up."""

_SOURCE, _TARGET = "s", "t"
_CDF = "delta.enableChangeDataFeed"
_CDF_COLUMNS = (CHANGE_TYPE, "_commit_version", "_commit_timestamp")
"""Columns a change feed reader adds: a table with the feed must not have them."""
_DELETED = "__microbatch_deleted__"
"""The MERGE source's column marking a key to delete (never written to the table)."""


class DeltaSink(Sink):
    """Writes each batch to a Delta table in one commit, exactly once per batch id.

    Parameters
    ----------
    path
        The table: a local directory or a URI (``s3://bucket/table``, ...).
        Created on the first batch with the batch's schema when missing.
    partition_by
        Partition columns of a table the sink creates. For an existing table
        they must be the table's (or ``None``: the table's are used).
    merge_keys
        Columns identifying a row for ``update`` mode's MERGE. Default: the
        query's key columns (``window_start``, ``window_end`` and the group
        keys of the aggregation), which the engine passes in the context.
    storage_options
        Passed unchanged to delta-rs (credentials, endpoint, ...). Never
        shown in ``describe()``.
    schema_mode
        ``None``: a batch whose schema differs from the table's is refused
        with a :class:`SinkError` before anything is written. ``"merge"``:
        additive evolution -- new columns are added to the table, columns
        the batch lacks are written as nulls. Type changes are always refused.
    optimize_every
        Compact small files after every N-th batch (by batch id).
    max_attempts
        Commit attempts per batch (each after a reload) before giving up.
    change_data_feed
        Create the table with ``delta.enableChangeDataFeed=true``, so that
        every commit also records its row changes (MERGE: ``_change_data``
        files with pre/post images and deletes) for ``read_delta(path,
        changes=True)`` and other CDF readers. An existing table must already
        have it (:class:`SinkConfigError` otherwise, naming the fix). Not with
        ``output_mode="changelog"``: that table holds a ``_change_type``
        column, a name Delta's change feed reserves.
    allow_other_writers
        ``False`` (default): the table belongs to one streaming query. The
        sink registers its query in the table's properties
        (:mod:`sinks.delta_writers`) and refuses, at open, a table another
        active query writes (:class:`~sinks.delta_writers.OtherWriterError`,
        naming that query's checkpoint): two checkpoints appending the same
        rows would double them. ``True``: several queries write the table on
        purpose (each its own rows).

    Output modes: ``append`` appends; ``complete`` overwrites; ``update``
    MERGEs by ``merge_keys`` -- a batch carrying ``_change_type`` (a
    changelog, :mod:`sinks.changelog`) is applied in the same single MERGE
    (a key whose last change in the batch is a ``delete`` is deleted, the
    others upserted, preimages ignored); ``changelog`` appends the change
    rows themselves, ``_change_type`` included (see
    :func:`sinks.changes.changelog_rows` for a batch without it).

    Guarantees: a batch id is in the table at most once, whatever the
    crashes, replays and concurrent writers with the same query id; a batch
    is all there or not there (one Delta commit); a schema mismatch never
    writes anything; a second query writing the table is refused before it
    writes (unless ``allow_other_writers=True``), and so is a query that
    ``microbatch promote`` retired from it.
    """

    supported_modes: tuple[OutputMode, ...] = ("append", "update", "complete", "changelog")

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        partition_by: str | Sequence[str] | None = None,
        merge_keys: str | Sequence[str] | None = None,
        storage_options: Mapping[str, str] | None = None,
        schema_mode: SchemaMode | None = None,
        optimize_every: int | None = None,
        max_attempts: int = MAX_ATTEMPTS,
        change_data_feed: bool = False,
        allow_other_writers: bool = False,
    ) -> None:
        if schema_mode not in (None, "merge"):
            raise SinkConfigError(
                f"schema_mode must be None or 'merge', got {schema_mode!r}; a Delta sink "
                "never overwrites a table's schema"
            )
        if optimize_every is not None and (
            isinstance(optimize_every, bool) or not isinstance(optimize_every, int)
            or optimize_every < 1
        ):
            raise SinkConfigError(
                "optimize_every must be a positive number of batches or None, "
                f"got {optimize_every!r}"
            )
        if max_attempts < 1:
            raise SinkConfigError(f"max_attempts must be at least 1, got {max_attempts}")
        self.uri = table_uri(path)
        self.partition_by: tuple[str, ...] = column_names(partition_by, "partition_by")
        self.merge_keys: tuple[str, ...] = column_names(merge_keys, "merge_keys")
        self.storage_options: dict[str, str] = dict(storage_options or {})
        self.schema_mode: SchemaMode | None = schema_mode
        self.optimize_every = optimize_every
        self.max_attempts = max_attempts
        self.change_data_feed = bool(change_data_feed)
        self.allow_other_writers = bool(allow_other_writers)
        self.last_commit: dict[str, Any] = {}
        """What the last ``add_batch`` did: ``batch_id``, ``skipped``, ``attempts``,
        ``version`` (the table version it committed) and ``commit_ms``."""
        self._table: DeltaTable | None = None
        self._fresh = False
        """The handle was refreshed by ``is_written`` for the batch being written."""
        self._steps: dict[str, float] = {}
        """Milliseconds of the steps of the batch being written (see :meth:`metrics`)."""
        self._partitions_ok = not self.partition_by
        """Workers can write the table's partition values (known once the table is)."""
        self._indexed: int | None = DEFAULT_INDEXED_COLUMNS
        """Columns with statistics in files workers write (the table's setting);
        ``None``: a setting they do not follow, the driver writes."""

    # ------------------------------------------------------------------ protocol

    @property
    def label(self) -> str:
        return f"DeltaSink({self.uri!r})"

    def on_open(self, ctx: SinkContext) -> None:
        """Check the keys and an existing table's layout."""
        if ctx.output_mode == "update" and not (self.merge_keys or ctx.key_columns):
            raise SinkConfigError(
                f"Delta table {self.uri}: output_mode='update' upserts rows by key, and this "
                "query has no key columns (no aggregation); pass merge_keys=[...] to "
                "write_delta, or use output_mode='append'"
            )
        if not ctx.query_id:
            raise SinkConfigError("DeltaSink needs a query id (the app id of its transactions)")
        if self.change_data_feed and ctx.output_mode == "changelog":
            raise SinkConfigError(
                f"Delta table {self.uri}: change_data_feed=True with output_mode='changelog': "
                f"the table would hold a {CHANGE_TYPE!r} column, a name Delta's change feed "
                "reserves (its readers fail on it). The changelog table is itself the change "
                "feed: drop change_data_feed, or write output_mode='update' to a CDF table"
            )
        self._table = self._load()
        self._fresh = False
        if self._table is not None:
            self._check_partitioning(self._table)
            self._check_change_feed(self._table)
            self._register(self._table)
            self._indexed = indexed_columns_of(dict(self._table.metadata().configuration))
            if _writes_need_delta_rs(self._table):
                self._indexed = None

    def _writer(self) -> WriterEntry:
        return writer_of(self.context, allow_other_writers=self.allow_other_writers)

    def _register(self, table: DeltaTable) -> None:
        """Refuse a table another query writes; register this query on it."""
        self._table = register_writer(table, uri=self.uri, me=self._writer(), reload=self._load,
                                      predecessors=self.context.predecessors)

    def is_written(self, batch: BatchContext) -> bool:
        """The table's app transaction of this query is at or past the batch id."""
        started = time.perf_counter()
        table = self._refresh()
        self._fresh = True
        self._steps = {"refresh_ms": _ms_since(started)}
        if not _has_batch(table, batch):
            return False
        self._record(batch.batch_id, skipped=True, attempts=1, started=started)
        return True

    def write(self, batch: BatchContext, df: pl.DataFrame) -> None:
        """Commit ``df`` as one table version carrying the app transaction
        ``(query id, batch id)``; on a commit conflict reload and try again."""
        batch_id, mode = batch.batch_id, batch.output_mode
        keys = self.merge_keys or batch.key_columns
        where = f"{self.label} batch {batch_id}"
        deleted: pl.Series | None = None  # update mode with a changelog: the delete rows
        if mode == "changelog":
            df = changelog_rows(df, keys, where)
        elif mode == "update" and is_changelog(df):
            _check_keys(df, keys, batch_id, self.uri, unique=False)
            upserts, deletes = table_changes(df, keys, where)
            df = pl.concat([upserts, deletes], how="vertical_relaxed")
            deleted = pl.Series(_DELETED, [False] * upserts.height + [True] * deletes.height)
        data = delta_frame(df, batch_id=batch_id, uri=self.uri)
        if mode == "update":
            _check_keys(data, keys, batch_id, self.uri)
        started = time.perf_counter()
        last_error: Exception | None = None
        for attempt in range(1, self.max_attempts + 1):
            # NOTE: is_written() just refreshed the handle for the first attempt
            table = self._table if self._fresh else self._refresh()
            self._fresh = False
            if table is None:
                table = self._create(data, batch_id)
            else:  # NOTE: before every commit: a promote may have retired this query
                check_writers(table, uri=self.uri, me=self._writer(), opening=False)
            if attempt > 1 and _has_batch(table, batch):  # a racing writer of ours won
                self._record(batch_id, skipped=True, attempts=attempt, started=started)
                return
            if data.height == 0 and mode != "complete":
                self._record(batch_id, skipped=False, attempts=attempt, started=started)
                return
            aligned = self._align(table, data, batch_id)
            batch.at("sink.before_commit")
            read_version = table.version()
            step = time.perf_counter()
            try:
                self._commit(table, aligned, batch_id, mode, keys, deleted=deleted)
            except Exception as exc:
                if not _is_conflict(exc):
                    raise self._write_error(batch_id, exc) from exc
                last_error = exc
                log.info("Delta table %s: batch %d commit conflict (attempt %d): %s; "
                         "reloading", self.uri, batch_id, attempt, exc)
                self._table = None  # reload from scratch: never reuse a handle that lost
                continue
            self._steps["write_ms"] = _ms_since(step)
            step = time.perf_counter()
            self._persist(read_version + 1)
            self._steps["fsync_ms"] = _ms_since(step)
            self._record(batch_id, skipped=False, attempts=attempt, started=started)
            batch.at("sink.after_commit")
            self._maybe_optimize(batch_id)
            return
        raise SinkError(
            f"Delta table {self.uri}: batch {batch_id} hit a commit conflict on each of "
            f"{self.max_attempts} attempts (last: {last_error}). Another writer is committing "
            "to the table continuously; the batch was not written and is retried on restart."
        )

    def distributed_writer(self, batch_id: int) -> WriteTask | None:
        """Workers write the data files of an ``append``, ``changelog`` or
        ``complete`` batch to a local (or shared-filesystem) table, the driver
        commits them (:meth:`commit_written`). ``None`` (the driver writes, as in
        one process) for ``update`` (a MERGE reads the table: one writer),
        ``schema_mode="merge"`` (the driver evolves the schema as it aligns the
        rows), object stores, a partitioned table that does not exist yet (the
        driver's first batch creates it) or whose partition columns are not
        strings, integers, booleans, dates or timestamps, and a table with
        column mapping, CHECK constraints, invariants, generated or identity
        columns (delta-rs applies them as it writes)."""
        ctx = self.context
        if (ctx.output_mode == "update" or not self._partitions_ok
                or self.schema_mode is not None or self._indexed is None):
            return None
        root = local_root(self.uri)
        if root is None:
            return None
        return DeltaWriteTask(batch_id=batch_id, root=str(root), output_mode=ctx.output_mode,
                              key_columns=self.merge_keys or ctx.key_columns,
                              indexed_columns=self._indexed, partition_by=self.partition_by)

    def commit_written(self, batch: BatchContext, written: WrittenBatch) -> None:
        """Commit the files workers wrote for ``batch`` as one table version carrying
        the app transaction, as :meth:`write` commits rows: the handle that reads
        the transaction version commits; a conflict reloads and decides again; a
        schema that differs from the table's is refused before the commit (the
        files stay unreferenced). ``complete``: the version overwrites the
        table (an empty result empties it). A batch without rows commits nothing
        in the other modes, and in ``complete`` mode before the table exists."""
        from deltalake import CommitProperties, Transaction

        batch_id, ctx = batch.batch_id, self.context
        started = time.perf_counter()
        schema = pl.DataFrame(schema=dict(written.schema or {}))
        last_error: Exception | None = None
        for attempt in range(1, self.max_attempts + 1):
            table = self._table if self._fresh else self._refresh()
            self._fresh = False
            if attempt > 1 and _has_batch(table, batch):  # a racing writer of ours won
                self._record(batch_id, skipped=True, attempts=attempt, started=started)
                return
            overwrite = ctx.output_mode == "complete"
            if not written.files and (not overwrite or table is None):
                self._record(batch_id, skipped=False, attempts=attempt, started=started)
                return
            if table is None:
                table = self._create(schema, batch_id)
            else:  # NOTE: before every commit: a promote may have retired this query
                check_writers(table, uri=self.uri, me=self._writer(), opening=False)
            problems = [] if written.schema is None else schema_differences(
                table.schema(), _delta_schema(schema, batch_id, self.uri))
            if problems:
                raise SinkError(_mismatch_message(self.uri, batch_id, problems, None)
                                .replace("Nothing was written.", "Nothing was committed."))
            batch.at("sink.before_commit")
            read_version = table.version()
            step = time.perf_counter()
            try:
                table.create_write_transaction(
                    add_actions(written.files), mode="overwrite" if overwrite else "append",
                    schema=table.schema(), partition_by=list(self.partition_by) or None,
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(ctx.query_id, batch_id)],
                        custom_metadata={"microbatch.query_id": ctx.query_id,
                                         "microbatch.role": ctx.role,
                                         "microbatch.written_by": "workers"},
                    ),
                )
            except Exception as exc:
                if not _is_conflict(exc):
                    raise self._write_error(batch_id, exc) from exc
                last_error = exc
                log.info("Delta table %s: batch %d commit conflict (attempt %d): %s; "
                         "reloading", self.uri, batch_id, attempt, exc)
                self._table = None
                continue
            self._steps["write_ms"] = _ms_since(step)
            step = time.perf_counter()
            self._persist(read_version + 1)
            self._steps["fsync_ms"] = _ms_since(step)
            self._record(batch_id, skipped=False, attempts=attempt, started=started)
            self.last_commit["files"] = len(written.files)
            batch.at("sink.after_commit")
            self._maybe_optimize(batch_id)
            return
        raise SinkError(
            f"Delta table {self.uri}: batch {batch_id} hit a commit conflict on each of "
            f"{self.max_attempts} attempts (last: {last_error}). Another writer is committing "
            "to the table continuously; the batch was not committed and is retried on restart."
        )

    def close(self) -> None:
        """Drop the table handle."""
        self._table = None

    def describe(self) -> dict[str, Any]:
        """Kind, table URI and options (storage options are left out: they hold secrets)."""
        described: dict[str, Any] = {
            "kind": type(self).__name__,
            "path": self.uri,
            "partition_by": list(self.partition_by),
            "merge_keys": list(self.merge_keys),
            "schema_mode": self.schema_mode,
            "optimize_every": self.optimize_every,
        }
        if self.change_data_feed:  # only when set: older checkpoints keep their description
            described["change_data_feed"] = True
        if self.allow_other_writers:  # the same
            described["allow_other_writers"] = True
        return described

    # ------------------------------------------------------------------ steps

    def _load(self) -> DeltaTable | None:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.uri, storage_options=self.storage_options or None)
        except TableNotFoundError:
            return None
        except Exception as exc:
            raise SinkError(f"cannot open Delta table {self.uri}: {_short(exc)}") from exc

    def _refresh(self) -> DeltaTable | None:
        """Step 1: the table at its latest version (``None`` when it does not exist)."""
        if self._table is None:
            self._table = self._load()
        else:
            try:
                self._table.update_incremental()
            except Exception as exc:
                raise SinkError(
                    f"cannot refresh Delta table {self.uri}: {_short(exc)}"
                ) from exc
        return self._table

    def _create(self, data: pl.DataFrame, batch_id: int) -> DeltaTable:
        """Create the table with ``data``'s schema (a metadata-only commit) and load it."""
        from deltalake import DeltaTable

        reserved = [c for c in _CDF_COLUMNS if c in data.columns]
        if self.change_data_feed and reserved:
            raise SinkConfigError(
                f"Delta table {self.uri}: change_data_feed=True, and batch {batch_id} has the "
                f"column(s) {reserved}, names Delta's change feed reserves; rename them, or "
                "drop change_data_feed"
            )
        missing = [c for c in self.partition_by if c not in data.columns]
        if missing:
            raise SinkConfigError(
                f"Delta table {self.uri}: partition_by names {missing}, which batch "
                f"{batch_id} does not have (its columns: {data.columns})"
            )
        try:
            DeltaTable.create(
                self.uri,
                _arrow(data).schema,
                mode="ignore",
                partition_by=list(self.partition_by) or None,
                configuration=self._create_configuration(),
                storage_options=self.storage_options or None,
                raise_if_key_not_exists=False,  # our writer registry's key
            )
        except Exception as exc:
            if not _is_conflict(exc):  # a concurrent creator won: use its table
                raise SinkError(
                    f"cannot create Delta table {self.uri} for batch {batch_id}: {_short(exc)}"
                ) from exc
        table = self._load()
        if table is None:
            raise SinkError(f"Delta table {self.uri} was created but cannot be loaded")
        self._table = table
        self._check_partitioning(table)
        self._check_change_feed(table)  # a concurrent creator may have made it without
        self._register(table)  # a concurrent creator may be another query
        self._persist(0)
        assert self._table is not None
        return self._table

    def _create_configuration(self) -> dict[str, str | None]:
        """The new table's properties: its change feed, and this query as its writer
        (registered in the creating commit: no extra version)."""
        config: dict[str, str | None] = dict(registration_properties({}, me=self._writer()))
        if self.change_data_feed:
            config[_CDF] = "true"
        return config

    def _check_change_feed(self, table: DeltaTable) -> None:
        config = table.metadata().configuration
        if self.change_data_feed and config.get(_CDF, "false").lower() != "true":
            raise SinkConfigError(
                f"Delta table {self.uri} exists without {_CDF}=true, and the sink was asked "
                "for change_data_feed=True (it only sets it on a table it creates). Enable it "
                f"once with DeltaTable({self.uri!r}).alter.set_table_properties({{{_CDF!r}: "
                "'true'}), or write to a new table"
            )

    def _check_partitioning(self, table: DeltaTable) -> None:
        existing = tuple(table.metadata().partition_columns)
        if self.partition_by and existing != self.partition_by:
            raise SinkConfigError(
                f"Delta table {self.uri} is partitioned by {list(existing)}, not "
                f"{list(self.partition_by)}; keep the table's partitioning (or pass "
                "partition_by=None), or write to a new table"
            )
        self.partition_by = existing
        import pyarrow as pa

        columns = pl.DataFrame(pa.schema(table.schema().to_arrow()).empty_table()).schema
        self._partitions_ok = partitions_supported(columns, existing)

    def _align(self, table: DeltaTable, data: pl.DataFrame, batch_id: int) -> pl.DataFrame:
        """Step 3: refuse a schema mismatch; with ``schema_mode="merge"`` add the
        table's columns that the batch lacks as nulls, in the table's order."""
        import pyarrow as pa

        target = pa.schema(table.schema().to_arrow())
        problems = schema_differences(table.schema(), _delta_schema(data, batch_id, self.uri))
        type_changes = [p for p in problems if p[0] == "type"]
        if problems and (self.schema_mode != "merge" or type_changes):
            raise SinkError(_mismatch_message(self.uri, batch_id, problems, self.schema_mode))
        if not problems:
            return data.select(target.names)
        table_types = pl.DataFrame(target.empty_table()).schema
        fill = [
            pl.lit(None, table_types[n]).alias(n) for n in target.names if n not in data.columns
        ]
        extra = [n for n in data.columns if n not in target.names]
        return data.with_columns(fill).select([*target.names, *extra])

    def _commit(
        self, table: DeltaTable, data: pl.DataFrame, batch_id: int, mode: OutputMode,
        keys: Sequence[str], *, deleted: pl.Series | None = None,
    ) -> None:
        """Step 5: one Delta commit holding the data and the app transaction.

        ``deleted`` (update mode with a changelog) marks the rows whose key is
        deleted: one MERGE then deletes the matched ones, updates the other
        matched keys and inserts the other unmatched keys."""
        from deltalake import CommitProperties, Transaction, write_deltalake

        ctx = self.context
        props = CommitProperties(
            app_transactions=[Transaction(ctx.query_id, batch_id)],
            custom_metadata={"microbatch.query_id": ctx.query_id, "microbatch.role": ctx.role},
        )
        evolve = self.schema_mode == "merge"
        if mode == "update":
            source = data if deleted is None else data.with_columns(deleted)
            merger = table.merge(
                _arrow(source),
                predicate=merge_predicate(data, keys),
                source_alias=_SOURCE,
                target_alias=_TARGET,
                merge_schema=evolve,
                commit_properties=props,
            )
            if deleted is None:
                merger.when_matched_update_all().when_not_matched_insert_all().execute()
                return
            flag, hidden = f"{_SOURCE}.{_quote(_DELETED)}", [_DELETED]
            # NOTE: the first matching clause wins, so the delete clause comes first
            merger.when_matched_delete(predicate=flag).when_matched_update_all(
                except_cols=hidden
            ).when_not_matched_insert_all(predicate=f"NOT {flag}", except_cols=hidden).execute()
            return
        arrow = _arrow(data)
        write_deltalake(
            table,
            arrow,
            mode="overwrite" if mode == "complete" else "append",
            partition_by=list(self.partition_by) or None,
            schema_mode="merge" if evolve else None,
            commit_properties=props,
        )

    def replace_where(self, df: pl.DataFrame, predicate: str) -> int:
        """Replace exactly the rows of the table matching ``predicate`` (a Delta SQL
        predicate, e.g. ``"day = '2026-01-03'"``) with ``df``, in one commit (Delta's
        replaceWhere); rows not matching it are not touched. Every row of ``df``
        must match ``predicate`` (Delta refuses the commit otherwise). Returns the
        new table version. Not part of a stream: a restatement of output rows."""
        from deltalake import CommitProperties, write_deltalake

        table = self._load()
        if table is None:
            raise SinkError(f"cannot restate rows of {self.uri}: there is no Delta table there")
        data = self._align(table, delta_frame(df, batch_id=-1, uri=self.uri), batch_id=-1)
        try:
            write_deltalake(
                table,
                _arrow(data),
                mode="overwrite",
                predicate=predicate,
                commit_properties=CommitProperties(
                    custom_metadata={"microbatch.restate": predicate}
                ),
            )
        except Exception as exc:
            raise SinkError(
                f"cannot replace the rows where {predicate} in Delta table {self.uri}: "
                f"{_short(exc)}. Nothing was committed."
            ) from exc
        table.update_incremental()
        root = local_root(self.uri)
        if root is not None:
            persist_versions(root, table.version(), table.version())
        return int(table.version())

    def _maybe_optimize(self, batch_id: int) -> None:
        """Step 7: compaction; a failure is logged, never fails the committed batch."""
        every = self.optimize_every
        if every is None or (batch_id + 1) % every != 0 or self._table is None:
            return
        try:
            self._table.update_incremental()
            before = self._table.version()
            metrics = self._table.optimize.compact()
            self._persist(before + 1)
            self.last_commit["optimize"] = {
                "files_added": metrics.get("numFilesAdded"),
                "files_removed": metrics.get("numFilesRemoved"),
            }
        except Exception as exc:
            log.warning("Delta table %s: compaction after batch %d failed (%s); the next "
                        "one will try again", self.uri, batch_id, _short(exc))
            self._table = None

    def _persist(self, first: int) -> None:
        """Step 6: make versions ``first``.. of a local table durable (a no-op on
        object stores, where a PUT is durable when it returns)."""
        root = local_root(self.uri)
        if root is None or self._table is None:
            return
        if self._table.version() < first:  # a commit through the handle moves it already
            self._table.update_incremental()
        persist_versions(root, first, self._table.version())

    def _record(self, batch_id: int, *, skipped: bool, attempts: int, started: float) -> None:
        self.last_commit = {
            "batch_id": batch_id,
            "skipped": skipped,
            "attempts": attempts,
            "version": self._table.version() if self._table is not None else None,
            "commit_ms": _ms_since(started),
            **self._steps,
        }
        self._steps = {}

    def metrics(self) -> dict[str, Any]:
        """The last batch's commit (:attr:`last_commit`): ``version``, ``attempts``,
        ``skipped``, ``commit_ms`` (from the refresh to the durable commit) and its
        steps: ``refresh_ms`` (the handle brought to the latest version and the app
        transaction read), ``write_ms`` (delta-rs's write or MERGE and its commit),
        ``fsync_ms`` (a local table's new files made durable); ``optimize`` after a
        compaction."""
        return dict(self.last_commit)

    def _write_error(self, batch_id: int, exc: Exception) -> SinkError:
        return SinkError(
            f"cannot write batch {batch_id} to Delta table {self.uri}: {_short(exc)}. "
            # NOTE: not "nothing was committed": when the store's answer to the commit
            # was lost (a connection cut mid-request) the commit may have landed
            "The batch is retried on the next start, which commits it only if the table "
            "does not hold it yet (its app transaction)."
        )


# ---------------------------------------------------------------------- helpers


def table_uri(path: str | os.PathLike[str]) -> str:
    """A table location as delta-rs takes it: URIs unchanged, local paths absolute."""
    text = os.fspath(path)
    if "://" in text:
        return text.rstrip("/")
    return os.path.abspath(os.path.expanduser(text))


def _arrow(data: pl.DataFrame) -> pa.Table:
    return data.to_arrow()


def _delta_schema(data: pl.DataFrame, batch_id: int, uri: str) -> Schema:
    from deltalake import Schema

    try:
        return Schema.from_arrow(_arrow(data.clear()).schema)
    except Exception as exc:
        raise SinkError(
            f"Delta table {uri}: batch {batch_id} has a schema Delta cannot store "
            f"({_short(exc)}); cast the column before write_delta"
        ) from exc


def type_text(dtype: Any) -> str:
    """A Delta type as text (``long``, ``array<string>``, ``struct<a: long>``)."""
    kind = type(dtype).__name__
    if kind == "ArrayType":
        return f"array<{type_text(dtype.element_type)}>"
    if kind == "MapType":
        return f"map<{type_text(dtype.key_type)}, {type_text(dtype.value_type)}>"
    if kind == "StructType":
        return "struct<" + ", ".join(f"{f.name}: {type_text(f.type)}" for f in dtype.fields) + ">"
    return str(getattr(dtype, "type", dtype))


def schema_differences(table: Schema, batch: Schema) -> list[Difference]:
    """``(kind, column, table type, batch type)`` for each difference (see
    :func:`sinks.schema_check.schema_differences`)."""
    return column_differences({f.name: type_text(f.type) for f in table.fields},
                              {f.name: type_text(f.type) for f in batch.fields})


def _mismatch_message(
    uri: str, batch_id: int, problems: list[Difference], schema_mode: str | None
) -> str:
    return mismatch_message(
        f"Delta table {uri}", batch_id, problems, schema_mode, retype="Delta",
        evolve="write_delta (new columns are added, missing ones written as nulls)")


def merge_predicate(data: pl.DataFrame, keys: Sequence[str]) -> str:
    """The MERGE condition on ``keys``: ``=`` where the batch's keys have no nulls
    (lets delta-rs prune files), ``IS NOT DISTINCT FROM`` where they do."""
    parts = []
    for key in keys:
        col = _quote(key)
        op = "IS NOT DISTINCT FROM" if data[key].null_count() else "="
        parts.append(f"({_TARGET}.{col} {op} {_SOURCE}.{col})")
    return " AND ".join(parts)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _check_keys(
    data: pl.DataFrame, keys: Sequence[str], batch_id: int, uri: str, *, unique: bool = True
) -> None:
    missing = [k for k in keys if k not in data.columns]
    if missing:
        raise SinkError(
            f"Delta table {uri}: merge key(s) {missing} are not columns of batch {batch_id} "
            f"(its columns: {data.columns}); fix merge_keys"
        )
    if unique and data.height and data.select(keys).is_duplicated().any():
        dupes = data.select(keys).filter(data.select(keys).is_duplicated()).unique().height
        raise SinkError(
            f"Delta table {uri}: batch {batch_id} has {dupes} merge key value(s) on several "
            f"rows (keys {list(keys)}); a MERGE needs one row per key: fix merge_keys or "
            "aggregate before the sink"
        )


def _is_conflict(exc: BaseException) -> bool:
    from deltalake.exceptions import CommitFailedError

    return isinstance(exc, CommitFailedError)


def _short(exc: BaseException, limit: int = 400) -> str:
    """The first lines of a delta-rs error, without its Rust backtrace."""
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    kept: list[str] = []
    for line in lines:
        if line.lstrip()[:1].isdigit() and ":" in line:  # backtrace frames
            break
        kept.append(line.strip())
    text = " ".join(kept) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def _writes_need_delta_rs(table: DeltaTable) -> bool:
    """The table has features delta-rs applies as it writes rows (column mapping's
    physical names, CHECK constraints, invariants, generated or identity
    columns): files written apart from it could break them, so the driver writes."""
    config = table.metadata().configuration
    if config.get("delta.columnMapping.mode", "none") not in (None, "none"):
        return True
    if any(key.startswith("delta.constraints.") for key in config):
        return True
    markers = ("delta.invariants", "delta.generationExpression", "delta.identity")
    return any(key.startswith(markers) for f in table.schema().fields for key in f.metadata)


def _has_batch(table: DeltaTable | None, batch: BatchContext) -> bool:
    """``table`` carries the app transaction of ``batch``'s query at or past its id."""
    if table is None:
        return False
    done = table.transaction_version(batch.query_id)
    return done is not None and done >= batch.batch_id
