"""Apache Iceberg tables (PyIceberg), exactly once per batch id.

Every commit of batch ``N`` records ``(query id, N)`` in the snapshot summary
and in a table property, in the same catalog commit as the rows
(:mod:`sinks.iceberg_batches`), so the table itself says which batches it
holds. Protocol for batch ``N`` (NOTE: the order is what makes it
exactly-once)::

    loop (at most max_attempts times):
        1. load the table, or refresh the handle (is_written did, for attempt 1)
        2. if last_committed_batch(table, query id) >= N: return  # a replay: no-op
        3. check the batch's schema against the table's (SinkError before
           anything is written); schema_mode="merge": evolve it by name in
           the transaction below; check the table's writers (sinks.writers:
           this query retired -> RetiredWriterError; not registered yet and
           another active query registered -> OtherWriterError)
        4. ctx.at("sink.before_data", N)
        5. one transaction on the handle of step 2, writing data files and
           manifests (durably on a local warehouse: sinks.iceberg_io):
              append, changelog: append the rows
              update:   one snapshot that rewrites the files holding a key the
                        batch upserts or deletes without those rows and adds
                        the upserts (copy-on-write in Polars:
                        sinks.iceberg_upsert)
              complete: overwrite the table with the rows
           plus the table property microbatch.last-batch.<query id> = N, and,
           when this query is not registered yet and the transaction adds a
           snapshot, its writer entry microbatch.writer.<query id>
        6. ctx.at("sink.before_commit", N)
        7. the catalog commit, with PyIceberg's own retries off (they would
           re-apply the appends on top of the winner). CommitFailedException
           (another writer committed since step 1, e.g. the same query's other
           process that committed N first): go back to 1 -- the reload
           decides, never a blind retry
        8. ctx.at("sink.after_commit", N); the engine then writes commits/N

Why step 7 cannot commit N twice: every snapshot-producing commit carries
the requirement that the branch still points at the snapshot the
transaction started from (PyIceberg's ``AssertRefSnapshotId``); a writer
whose read is stale fails and re-reads in step 2. Files written by an attempt
that failed or crashed before step 7 are referenced by no snapshot: readers
never see them, and orphan-file maintenance removes them.

Why the registration rides in a data commit and not in a properties commit
at open: PyIceberg's ``set_properties`` carries no requirement, and a catalog
applies it on top of whatever metadata is current, so two queries registering
from stale reads would both land. A commit adding a snapshot requires the
branch to be where the transaction read it: of two queries whose first rows
race, the second's commit fails, it reloads, finds the winner's entry and is
refused before any of its rows land. At open the sink only checks (a table
another query is registered on is refused there).

The table (and its namespace) is created on the first batch from the
batch's schema, partitioned as ``partition_by`` says (identity columns and
transforms, :mod:`sinks.iceberg_partitions`), in a commit of its own before
the batch's. A batch without rows commits nothing in
``append``, ``changelog`` and ``update`` mode; in ``complete`` mode an empty
result is a real result and overwrites.

Types are cast as :mod:`sinks.iceberg_types` says (unsigned and small
integers widened, timestamps to microseconds, zoned ones to UTC
``timestamptz``). Catalogs and ``storage_options`` are resolved by
:mod:`sinks.iceberg_catalog` (delta-rs ``AWS_*`` keys accepted).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from sinks.base import BatchContext, OutputMode, Sink, SinkContext
from sinks.changes import changelog_rows, table_changes
from sinks.exceptions import SinkConfigError, SinkError
from sinks.iceberg_batches import batch_summary, last_batch_property, last_committed_batch
from sinks.iceberg_catalog import (
    CatalogSpec,
    catalog_label,
    load_iceberg_table,
    resolve_catalog,
    table_identifier,
)
from sinks.iceberg_partitions import (
    add_partition_fields,
    partition_terms,
    require_transforms,
    table_terms,
)
from sinks.iceberg_types import iceberg_arrow, iceberg_frame
from sinks.iceberg_upsert import stage_upsert
from sinks.schema_check import SchemaMode, column_names, mismatch_message, schema_differences
from sinks.writers import (
    RegistryView,
    WriterEntry,
    check_registry,
    registration_properties,
    writer_of,
)

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table, Transaction

log = logging.getLogger("sinks.iceberg")

MAX_ATTEMPTS = 10
"""How many times a batch is tried after commit conflicts before the sink gives up."""


class IcebergSink(Sink):
    """Writes each batch to an Iceberg table in one catalog commit, exactly once per batch id.

    Parameters
    ----------
    table
        ``"namespace.table"`` (or a tuple of names). Created, with its
        namespace, on the first batch with the batch's schema when missing.
    catalog
        A ``pyiceberg`` ``Catalog``, a mapping of catalog properties, or a
        string (``sqlite:///PATH.db``, ``http(s)://HOST``, a configured
        catalog's name): :func:`sinks.iceberg_catalog.resolve_catalog`.
    partition_by
        The partition spec of a table the sink creates: column names
        (identity) and Iceberg transforms as Spark SQL writes them,
        ``"year(ts)"``, ``"month(ts)"``, ``"day(ts)"``, ``"hour(ts)"``,
        ``"bucket(16, card_id)"``, ``"truncate(4, name)"``
        (:mod:`sinks.iceberg_partitions`; anything else is a
        :class:`SinkConfigError`). Fields get Iceberg's default names
        (``ts_day``, ``card_id_bucket_16``). For an existing table it must be
        the table's spec, transforms included (or ``None``: the table's spec
        is kept, whatever it is).
    merge_keys
        Columns identifying a row for ``update`` mode. Default: the query's
        key columns (window bounds and group keys).
    storage_options
        FileIO properties: delta-rs keys (``AWS_ENDPOINT_URL``, ...) or
        PyIceberg's (``s3.endpoint``, ...). Never shown in ``describe()``.
    schema_mode
        ``None``: a batch whose columns differ from the table's is refused
        with a :class:`SinkError` before anything is written. ``"merge"``:
        new columns are added to the table by name in the batch's own
        commit; columns the batch lacks are written as nulls. Type changes
        are always refused.
    location
        Where a table the sink creates keeps its ``metadata/`` and ``data/``
        (a path or URI; a path is made absolute). Default: the catalog's
        warehouse decides. Pinning it lets readers without the catalog
        (DuckDB's ``iceberg_scan``, PyIceberg's ``StaticTable``,
        ``microbatch diff DIR``) find the table by its directory.
    max_attempts
        Commit attempts per batch (each after a reload) before giving up.
    allow_other_writers
        ``False`` (default): the table belongs to one streaming query. The
        sink registers its query in the table's properties
        (:mod:`sinks.writers`, in the query's first commit that adds rows) and
        refuses a table another active query is registered on
        (:class:`~sinks.exceptions.OtherWriterError`, naming that query's
        checkpoint), at open and before every commit until it is registered:
        two checkpoints appending the same rows would double them. ``True``:
        several queries write the table on purpose (each its own rows).

    Output modes: ``append`` appends; ``changelog`` appends the change rows
    with ``_change_type``; ``update`` removes the rows of every key the
    batch touches (rewriting only the files that hold one) and adds its
    upserts, in one snapshot (a changelog batch's deletes included);
    ``complete`` overwrites.

    Guarantees: a batch id is in the table at most once, whatever the
    crashes, replays and concurrent writers with the same query id; a batch
    is all there or not there (one catalog commit); a schema mismatch never
    writes anything; on a local warehouse every file of a commit is on disk
    before the catalog names it (:mod:`sinks.iceberg_io`); a second query
    writing the table is refused before any of its rows land (unless
    ``allow_other_writers=True``), and so is a query retired from it.
    """

    supported_modes: tuple[OutputMode, ...] = ("append", "update", "complete", "changelog")

    def __init__(
        self,
        table: str | Sequence[str],
        *,
        catalog: CatalogSpec,
        partition_by: str | Sequence[str] | None = None,
        merge_keys: str | Sequence[str] | None = None,
        storage_options: Mapping[str, str] | None = None,
        schema_mode: SchemaMode | None = None,
        location: str | None = None,
        max_attempts: int = MAX_ATTEMPTS,
        allow_other_writers: bool = False,
    ) -> None:
        if schema_mode not in (None, "merge"):
            raise SinkConfigError(
                f"schema_mode must be None or 'merge', got {schema_mode!r}; the Iceberg sink "
                "never replaces a table's schema"
            )
        if max_attempts < 1:
            raise SinkConfigError(f"max_attempts must be at least 1, got {max_attempts}")
        self.ident = table_identifier(table if isinstance(table, str) else tuple(table))
        self.catalog_spec = catalog
        self.partitions = partition_terms(partition_by)
        require_transforms(self.partitions)
        self.partition_by: tuple[str, ...] = tuple(str(t) for t in self.partitions)
        """``partition_by`` as terms in their canonical form (``day(ts)``, ``bucket(16, k)``)."""
        self.merge_keys: tuple[str, ...] = column_names(merge_keys, "merge_keys")
        self.storage_options: dict[str, str] = dict(storage_options or {})
        self.schema_mode: SchemaMode | None = schema_mode
        self.location = _table_location(location)
        self.max_attempts = max_attempts
        self.allow_other_writers = bool(allow_other_writers)
        self.last_commit: dict[str, Any] = {}
        """What the last ``add_batch`` did: ``batch_id``, ``skipped``, ``attempts``,
        ``snapshot_id`` and ``commit_ms``."""
        self._catalog: Catalog | None = None
        self._table: Table | None = None
        self._fresh = False
        """The handle was refreshed by ``is_written`` for the batch being written."""

    # ------------------------------------------------------------------ protocol

    @property
    def name(self) -> str:
        """The table as ``namespace.table``."""
        return ".".join(self.ident)

    @property
    def label(self) -> str:
        return f"IcebergSink({self.name!r})"

    def on_open(self, ctx: SinkContext) -> None:
        """Resolve the catalog; check the keys, an existing table's partitioning
        and its writers (another active query's table is refused here)."""
        if ctx.output_mode == "update" and not (self.merge_keys or ctx.key_columns):
            raise SinkConfigError(
                f"Iceberg table {self.name}: output_mode='update' replaces rows by key, and "
                "this query has no key columns (no aggregation); pass merge_keys=[...] to "
                "write_iceberg, or use output_mode='append'"
            )
        if not ctx.query_id:
            raise SinkConfigError("IcebergSink needs a query id (it records it in every commit)")
        from sinks.iceberg_io import use_durable_io

        self._catalog = resolve_catalog(self.catalog_spec, storage_options=self.storage_options)
        use_durable_io(self._catalog)
        self._table = load_iceberg_table(self._catalog, self.ident)
        self._fresh = False
        if self._table is not None:
            self._check_partitioning(self._table)
            self._check_writers(self._table, opening=True)

    def is_written(self, batch: BatchContext) -> bool:
        """The table records this query's batch ``batch_id`` or a later one."""
        started = time.perf_counter()
        table = self._refresh()
        self._fresh = True
        if not _has_batch(table, batch):
            return False
        self._record(batch.batch_id, skipped=True, attempts=1, started=started)
        return True

    def write(self, batch: BatchContext, df: pl.DataFrame) -> None:
        """Commit ``df`` as batch ``batch_id`` in one catalog commit; on a commit
        conflict reload and decide again (see the module docstring)."""
        batch_id, mode = batch.batch_id, batch.output_mode
        keys = self.merge_keys or batch.key_columns
        where = f"{self.label} batch {batch_id}"
        rows, touched = self._rows(df, mode, keys, where)
        started = time.perf_counter()
        last_error: Exception | None = None
        for attempt in range(1, self.max_attempts + 1):
            table = self._table if self._fresh else self._refresh()
            self._fresh = False
            if attempt > 1 and _has_batch(table, batch):  # a racing writer of ours won
                self._record(batch_id, skipped=True, attempts=attempt, started=started)
                return
            if rows.height == 0 and touched.height == 0 and mode != "complete":
                self._record(batch_id, skipped=False, attempts=attempt, started=started)
                return
            if table is None:
                table = self._create(rows, batch_id)
            # NOTE: before every commit: until this query is registered, the reload
            # after a lost race must find the winner's entry and refuse
            registration = self._check_writers(table, opening=False)
            aligned, evolve = self._align(table, rows, batch_id)
            batch.at("sink.before_data")
            _without_commit_retries(table)
            tx = table.transaction()
            try:
                self._stage(tx, batch, aligned, touched, keys, table=table, evolve=evolve)
            except SinkError:
                raise
            except Exception as exc:
                raise self._write_error(batch_id, exc) from exc
            if registration and _adds_snapshot(tx, table):
                tx.set_properties(registration)
            batch.at("sink.before_commit")
            try:
                tx.commit_transaction()
            except Exception as exc:
                if not _is_conflict(exc):
                    raise self._write_error(batch_id, exc) from exc
                last_error = exc
                log.info("Iceberg table %s: batch %d commit conflict (attempt %d): %s; "
                         "reloading", self.name, batch_id, attempt, exc)
                self._table = None  # reload from scratch: never reuse a handle that lost
                continue
            from sinks.iceberg_io import note_catalog_commit

            note_catalog_commit(self._require_catalog())
            self._record(batch_id, skipped=False, attempts=attempt, started=started)
            batch.at("sink.after_commit")
            return
        raise SinkError(
            f"Iceberg table {self.name}: batch {batch_id} hit a commit conflict on each of "
            f"{self.max_attempts} attempts (last: {last_error}). Another writer is committing "
            "to the table continuously; the batch was not written and is retried on restart."
        )

    def close(self) -> None:
        """Drop the table handle."""
        self._table = None

    def describe(self) -> dict[str, Any]:
        """Kind, table, catalog and options (storage options are left out: secrets)."""
        return {
            "kind": type(self).__name__,
            "table": self.name,
            "catalog": catalog_label(self.catalog_spec),
            "partition_by": list(self.partition_by),
            "merge_keys": list(self.merge_keys),
            "schema_mode": self.schema_mode,
            "location": self.location,
            "allow_other_writers": self.allow_other_writers,
        }

    def metrics(self) -> dict[str, Any]:
        """The last batch's commit (:attr:`last_commit`): ``snapshot_id``,
        ``attempts``, ``skipped``, ``commit_ms``."""
        return dict(self.last_commit)

    # ------------------------------------------------------------------ steps

    def _rows(
        self, df: pl.DataFrame, mode: OutputMode, keys: Sequence[str], where: str
    ) -> tuple[pl.DataFrame, pl.DataFrame]:
        """``(rows to append, keys whose table rows are deleted first)``, typed for Iceberg."""
        if mode == "changelog":
            df = changelog_rows(df, keys, where)
        if mode != "update":
            return iceberg_frame(df, where=where), pl.DataFrame()
        upserts, deletes = table_changes(df, keys, where)
        missing = [k for k in keys if k not in upserts.columns]
        if missing:
            raise SinkError(
                f"{where}: merge key(s) {missing} are not columns of the batch (its columns: "
                f"{upserts.columns}); fix merge_keys"
            )
        if upserts.height and upserts.select(keys).is_duplicated().any():
            raise SinkError(
                f"{where}: several rows have the same merge key (keys {list(keys)}); update "
                "mode needs one row per key: fix merge_keys or aggregate before the sink"
            )
        upserts = iceberg_frame(upserts, where=where)
        touched = pl.concat([upserts.select(keys), iceberg_frame(deletes, where=where)
                             .select(keys)], how="vertical_relaxed")
        return upserts, touched

    def _stage(
        self, tx: Transaction, batch: BatchContext, data: pl.DataFrame, touched: pl.DataFrame,
        keys: Sequence[str], *, table: Table, evolve: bool,
    ) -> None:
        """Step 5: the batch's changes in ``tx`` (files written, nothing committed)."""
        summary = batch_summary(batch.query_id, batch.batch_id, batch.run.role)
        arrow = iceberg_arrow(data)
        if evolve:
            with tx.update_schema() as update:
                update.union_by_name(arrow.schema)
        mode = batch.output_mode
        if mode == "complete":
            with warnings.catch_warnings():  # an empty table has nothing to delete: normal
                warnings.filterwarnings("ignore", "Delete operation did not match")
                tx.overwrite(arrow, snapshot_properties=summary)
        elif mode == "update":
            stage_upsert(tx, table.io, arrow, touched, keys=keys, summary=summary)
        elif data.height:
            tx.append(arrow, snapshot_properties=summary)
        tx.set_properties({last_batch_property(batch.query_id): str(batch.batch_id)})

    @property
    def uri(self) -> str:
        """The table as people name it: ``namespace.table`` in its catalog."""
        return f"{self.name} (catalog {catalog_label(self.catalog_spec)})"

    def replace_where(self, df: pl.DataFrame, predicate: str) -> int:
        """Replace exactly the table's rows matching ``predicate`` (an Iceberg row
        filter in SQL form, e.g. ``"day = '2026-01-03'"``) with ``df``, in one
        commit (an overwrite snapshot; files that hold matching and other rows
        are rewritten copy-on-write); rows not matching it are not touched.
        Every row of ``df`` should match ``predicate``. Returns the new snapshot
        id. Not part of a stream: a restatement of output rows."""
        from pyiceberg.expressions.parser import parse

        catalog = self._catalog or resolve_catalog(self.catalog_spec,
                                                   storage_options=self.storage_options)
        table = load_iceberg_table(catalog, self.ident)
        if table is None:
            raise SinkError(f"cannot restate rows of Iceberg table {self.uri}: it does not exist")
        try:
            row_filter = parse(predicate)
        except Exception as exc:
            raise SinkError(
                f"--replace-where {predicate!r} is not an Iceberg row filter: {_short(exc)}. "
                "Write it as SQL over the table's columns, e.g. \"day = '2026-01-03'\""
            ) from exc
        data, evolve = self._align(table, iceberg_frame(df, where=self.label), batch_id=-1)
        if evolve:
            raise SinkError(f"cannot restate rows of Iceberg table {self.uri}: the rows have "
                            "columns the table lacks; run the job once to add them")
        _without_commit_retries(table)
        try:
            table.overwrite(iceberg_arrow(data), overwrite_filter=row_filter,
                            snapshot_properties={"microbatch.restate": predicate})
        except Exception as exc:
            raise SinkError(
                f"cannot replace the rows where {predicate} in Iceberg table {self.uri}: "
                f"{_short(exc)}. Nothing was committed."
            ) from exc
        from sinks.iceberg_io import note_catalog_commit, write_version_hint

        note_catalog_commit(catalog)
        write_version_hint(table)
        snapshot = table.current_snapshot()
        assert snapshot is not None  # the overwrite made one
        return int(snapshot.snapshot_id)

    def _writer(self) -> WriterEntry:
        return writer_of(self.context, allow_other_writers=self.allow_other_writers)

    def _check_writers(self, table: Table, *, opening: bool) -> dict[str, str]:
        """Refuse a table another query writes, or that retired this query
        (:func:`sinks.writers.check_registry`; the whole check when ``opening``
        or this query is not registered yet, else the retirement only); the
        properties that register this query when it is not (empty when it is)."""
        me = self._writer()
        properties = table.properties
        view = RegistryView(
            table=f"Iceberg table {self.uri}", properties=properties,
            committed=lambda query_id: last_committed_batch(table, query_id),
            opt_in="write_iceberg (IcebergSink)", new_table="a new table",
            new_version="a new version of the output")
        predecessors = self.context.predecessors
        mine = check_registry(view, me=me, opening=opening or me.key not in properties,
                              predecessors=predecessors)
        if mine is not None:
            return {}
        return registration_properties(properties, me=me, predecessors=predecessors)

    def _require_catalog(self) -> Catalog:
        if self._catalog is None:
            raise SinkError(f"{self.label} is not open; the engine opens sinks before a batch")
        return self._catalog

    def _load(self) -> Table | None:
        return load_iceberg_table(self._require_catalog(), self.ident)

    def _refresh(self) -> Table | None:
        """Step 1: the table at its current metadata (``None`` when it does not exist)."""
        if self._table is None:
            self._table = self._load()
            return self._table
        try:
            self._table.refresh()
        except Exception:  # dropped, or the catalog lost it: load decides
            self._table = self._load()
        return self._table

    def _create(self, data: pl.DataFrame, batch_id: int) -> Table:
        """Create the namespace and the table with ``data``'s schema and the
        ``partition_by`` spec (a commit of its own), and load it."""
        from pyiceberg.exceptions import TableAlreadyExistsError

        missing = [t.column for t in self.partitions if t.column not in data.columns]
        if missing:
            raise SinkConfigError(
                f"Iceberg table {self.name}: partition_by names {missing}, which batch "
                f"{batch_id} does not have (its columns: {data.columns})"
            )
        catalog = self._require_catalog()
        try:
            catalog.create_namespace_if_not_exists(self.ident[:-1])
            tx = catalog.create_table_transaction(
                self.ident, schema=iceberg_arrow(data.clear()).schema, location=self.location)
            if self.partitions:
                with tx.update_spec() as spec:
                    add_partition_fields(spec, self.partitions)
            tx.commit_transaction()
        except TableAlreadyExistsError:
            pass  # a concurrent creator won: use its table
        except SinkConfigError:
            raise
        except Exception as exc:
            if not _is_conflict(exc):
                raise SinkError(
                    f"cannot create Iceberg table {self.name} for batch {batch_id}: "
                    f"{_short(exc)}"
                ) from exc
        from sinks.iceberg_io import note_catalog_commit

        note_catalog_commit(catalog)
        table = self._load()
        if table is None:
            raise SinkError(f"Iceberg table {self.name} was created but cannot be loaded")
        self._check_partitioning(table)
        self._table = table
        return table

    def _check_partitioning(self, table: Table) -> None:
        """``partition_by``, when given, is the table's spec: the same columns and
        transforms in the same order (field names may differ)."""
        if not self.partitions:
            return
        existing = table_terms(table)
        if existing != self.partitions:
            raise SinkConfigError(
                f"Iceberg table {self.name} has the partition spec "
                f"{[str(t) for t in existing]}, not partition_by={list(self.partition_by)}; "
                "pass partition_by=None to keep the table's spec, or write to a new table"
            )

    def _align(
        self, table: Table, data: pl.DataFrame, batch_id: int
    ) -> tuple[pl.DataFrame, bool]:
        """Step 3: ``(rows in the table's column order, whether the schema evolves)``.
        A mismatch is refused unless ``schema_mode="merge"`` and it only adds or
        omits columns; omitted ones are then written as nulls."""
        target = pl.DataFrame(table.schema().as_arrow().empty_table()).schema
        problems = schema_differences({n: str(t) for n, t in target.items()},
                                      {n: str(t) for n, t in data.schema.items()})
        type_changes = [p for p in problems if p[0] == "type"]
        if problems and (self.schema_mode != "merge" or type_changes):
            raise SinkError(mismatch_message(
                f"Iceberg table {self.name}", batch_id, problems, self.schema_mode,
                retype="The Iceberg sink", evolve="write_iceberg (new columns are added by "
                "name, columns the batch lacks written as nulls)"))
        if not problems:
            return data.select(target.names()), False
        fill = [pl.lit(None, target[n]).alias(n) for n in target if n not in data.columns]
        extra = [n for n in data.columns if n not in target]
        new_columns = any(kind == "new" for kind, *_ in problems)
        return data.with_columns(fill).select([*target.names(), *extra]), new_columns

    def _record(self, batch_id: int, *, skipped: bool, attempts: int, started: float) -> None:
        from sinks.iceberg_io import write_version_hint

        snapshot = self._table.current_snapshot() if self._table is not None else None
        if self._table is not None:
            write_version_hint(self._table)
        self.last_commit = {
            "batch_id": batch_id,
            "skipped": skipped,
            "attempts": attempts,
            "snapshot_id": None if snapshot is None else snapshot.snapshot_id,
            "commit_ms": round((time.perf_counter() - started) * 1000, 3),
        }

    def _write_error(self, batch_id: int, exc: Exception) -> SinkError:
        return SinkError(
            f"cannot write batch {batch_id} to Iceberg table {self.name}: {_short(exc)}. "
            # NOTE: not "nothing was committed": a lost answer to a commit may have landed
            "The batch is retried on the next start, which commits it only if the table "
            "does not record it yet (its snapshot summary and table property)."
        )


# ---------------------------------------------------------------------- helpers


def _without_commit_retries(table: Table) -> None:
    """Turn off PyIceberg's own commit retries on this handle (not in the table).

    NOTE: on a conflict PyIceberg re-applies the transaction's appends on top
    of the winner's commit. If the winner committed the same batch (the same
    query in another process), that would store the batch twice: the sink
    must see every conflict and decide again from the reloaded table."""
    from pyiceberg.table import TableProperties

    props = table.metadata.properties
    if props.get(TableProperties.COMMIT_NUM_RETRIES) != "0":
        table.metadata = table.metadata.model_copy(
            update={"properties": {**props, TableProperties.COMMIT_NUM_RETRIES: "0"}})


def _adds_snapshot(tx: Transaction, table: Table) -> bool:
    """The transaction adds a snapshot: its commit then requires the branch to be
    where ``table`` has it (PyIceberg's ``AssertRefSnapshotId``), so it fails
    when another commit of rows landed since (a registration race's loser)."""
    return tx.table_metadata.current_snapshot_id != table.metadata.current_snapshot_id


def _is_conflict(exc: BaseException) -> bool:
    from pyiceberg.exceptions import CommitFailedException

    return isinstance(exc, CommitFailedException)


def _has_batch(table: Table | None, batch: BatchContext) -> bool:
    """``table`` records ``batch``'s query at or past its id."""
    if table is None:
        return False
    done = last_committed_batch(table, batch.query_id)
    return done is not None and done >= batch.batch_id


def _short(exc: BaseException, limit: int = 400) -> str:
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    text = text or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _table_location(location: str | None) -> str | None:
    """``location`` as a URI: a local path made absolute (``file:///...``, without
    a trailing slash); a URI with a scheme unchanged."""
    if location is None:
        return None
    if "://" in location:
        return location.rstrip("/")
    return Path(location).expanduser().absolute().as_uri()
