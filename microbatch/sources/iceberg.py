"""An Iceberg table's snapshots as a replayable log.

The snapshot lineage is the log: the current snapshot, its parent, its
parent's parent... back to the table's first snapshot. A snapshot's manifest
list never changes once written, so the data files a snapshot added name the
same rows forever. An offset is a position in that lineage::

    {"snapshot_id": S, "sequence_number": n, "timestamp_ms": t, "index": i}

- ``index`` ``None``: every data file added by ``S`` and its ancestors has
  been read (``S`` ``None``: nothing yet, before the table's first snapshot);
- ``index`` an integer: the ancestors of ``S`` and the first ``i`` data files
  that ``S`` added (in manifest order) have been read.

``sequence_number`` and ``timestamp_ms`` are ``S``'s, so offsets compare
without loading the table. So

- a batch reads exactly the data files ADDED by the snapshots in its recorded
  range ``(start, end]``, in manifest order, and a replay reads the same rows;
- ``max_files_per_batch`` can cut a large snapshot into several batches;
- new snapshots are picked up by later batches (the table's metadata is
  reloaded from the catalog each time the engine plans).

What each kind of snapshot does to the stream (its ``operation``):

- ``append``: its added data files are read;
- ``replace`` (compaction, ``rewrite_data_files``: the same rows in other
  files): skipped;
- ``overwrite`` and ``delete`` (rows removed or rewritten) stop the query with
  a :class:`SourceError` naming the snapshot and the operation: a stream of
  appended rows cannot express "these rows are gone". Snapshots before it are
  processed first, and the failing batch is recorded, so restarting the same
  checkpoint with ``skip_change_commits=True`` (drop such snapshots: right for
  deletes and copy-on-write rewrites, whose added files repeat surviving rows)
  or ``ignore_changes=True`` (read their added files: rewritten rows are
  emitted again, as Spark's ``ignoreChanges``) goes on from exactly there.

Rows are read with PyIceberg's Arrow reader, projected on the table schema
of the range's last snapshot by field id: a column added later is null in
older files, a renamed column keeps its values under the new name, and a
replay gives the same columns too.

Departure from Spark: without ``starting_snapshot``/``starting_timestamp`` the
stream starts before the first snapshot and replays the whole history (as
``read_delta`` does). A table whose oldest snapshots were expired cannot be
replayed from the start: pass ``starting_snapshot`` (a retained snapshot id,
or ``"latest"``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Literal

import polars as pl

from microbatch.exceptions import PlanError, SourceError
from microbatch.sources.base import (
    ReadSplit,
    Source,
    SourceBatch,
    SourceContext,
    balanced_runs,
    check_batch_cap,
)
from microbatch.sources.delta import _instant_ms
from microbatch.sources.iceberg_files import (
    BEFORE_FIRST,
    IcebergFile,
    IcebergSplit,
    Position,
    added_files,
    after,
    before,
    parse_position,
    polars_schema,
    read_data_files,
)

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.table.snapshots import Snapshot

StartingSnapshot = int | Literal["earliest", "latest"]
"""A snapshot id (read from that snapshot on, inclusive), ``"earliest"`` (the
whole history) or ``"latest"`` (only snapshots committed after the start)."""

APPEND: Final = "append"
REPLACE: Final = "replace"


# --------------------------------------------------------------------------- source


@dataclass(frozen=True)
class Backlog:
    """How much a range of the lineage holds: snapshots with data, files and rows."""

    snapshots: int
    files: int
    rows: int


class IcebergSource(Source):
    """The data files appended to an Iceberg table, snapshot by snapshot.

    Parameters
    ----------
    table
        ``"namespace.table"`` in ``catalog``.
    catalog
        A catalog spec as :func:`sinks.iceberg_catalog.resolve_catalog` takes it.
    starting_snapshot
        A snapshot id of the current lineage (read from it on, inclusive),
        ``"earliest"`` (the default: the whole history) or ``"latest"``.
    starting_timestamp
        Start at the first snapshot committed at or after this instant (a
        ``datetime``, naive meaning UTC, or an ISO-8601 string); a time after
        the latest snapshot reads only new ones.
    max_files_per_batch
        At most this many data files per batch (``None``: all new files).
    ignore_changes
        Read the added files of ``overwrite``/``delete`` snapshots instead of
        stopping (rewritten rows are emitted again).
    skip_change_commits
        Skip ``overwrite``/``delete`` snapshots (their added files are not read).
    storage_options
        delta-rs keys (``AWS_ENDPOINT_URL``, ...) or PyIceberg FileIO properties
        for the data files (:func:`sinks.iceberg_catalog.fileio_properties`).

    Guarantees: ``read(a, b)`` returns the same rows, with the same columns,
    every time, as long as the snapshots of that range and their files are
    kept (``expire_snapshots`` removes them: a replay then fails with a clear
    error naming the snapshot, never silently reads something else).
    """

    kind = "iceberg"

    def __init__(
        self,
        table: str,
        *,
        catalog: Any,
        starting_snapshot: StartingSnapshot | None = None,
        starting_timestamp: datetime | str | None = None,
        max_files_per_batch: int | None = None,
        ignore_changes: bool = False,
        skip_change_commits: bool = False,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        from sinks.exceptions import SinkConfigError
        from sinks.iceberg_catalog import catalog_label, table_identifier

        try:
            self.ident = table_identifier(table)
        except SinkConfigError as exc:
            raise PlanError(f"read_iceberg: {exc}") from None
        self.name = ".".join(self.ident)
        if starting_snapshot is not None and starting_timestamp is not None:
            raise PlanError("read_iceberg: pass starting_snapshot or starting_timestamp, not both")
        if starting_snapshot is not None and starting_snapshot not in ("earliest", "latest") and (
            isinstance(starting_snapshot, bool) or not isinstance(starting_snapshot, int)
        ):
            raise PlanError(
                "read_iceberg: starting_snapshot must be a snapshot id, 'earliest' or 'latest', "
                f"got {starting_snapshot!r}"
            )
        check_batch_cap(max_files_per_batch, option="max_files_per_batch", reader="read_iceberg")
        if ignore_changes and skip_change_commits:
            raise PlanError(
                "read_iceberg: ignore_changes=True reads the files of overwrite/delete "
                "snapshots, skip_change_commits=True skips them: pass one of them"
            )
        self.catalog = catalog
        self.catalog_label = catalog_label(catalog)
        self.starting_snapshot = starting_snapshot
        self.starting_timestamp_ms = (
            None if starting_timestamp is None
            else _instant_ms(starting_timestamp, reader="read_iceberg")
        )
        self.max_files_per_batch = max_files_per_batch
        self.ignore_changes = ignore_changes
        self.skip_change_commits = skip_change_commits
        self.storage_options = dict(storage_options or {})
        self._table: Table | None = None
        self._files: dict[int, tuple[IcebergFile, ...]] = {}
        self._current_schema: pl.Schema | None = None

    def clone(self) -> IcebergSource:
        """A new source over the same table with the same options (its own caches)."""
        copy = IcebergSource(
            self.name, catalog=self.catalog, starting_snapshot=self.starting_snapshot,
            max_files_per_batch=self.max_files_per_batch, ignore_changes=self.ignore_changes,
            skip_change_commits=self.skip_change_commits, storage_options=self.storage_options,
        )
        copy.starting_timestamp_ms = self.starting_timestamp_ms
        return copy

    def __getstate__(self) -> dict[str, Any]:
        # the loaded table holds a catalog connection: a copy sent elsewhere reloads it
        return {**self.__dict__, "_table": None}

    # -- identity ---------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """Kind, catalog, table and options (storage options are left out: secrets)."""
        return {
            "kind": self.kind,
            "catalog": self.catalog_label,
            "table": self.name,
            "starting_snapshot": self.starting_snapshot,
            "starting_timestamp_ms": self.starting_timestamp_ms,
            "max_files_per_batch": self.max_files_per_batch,
            "ignore_changes": self.ignore_changes,
            "skip_change_commits": self.skip_change_commits,
        }

    def identity(self) -> dict[str, Any]:
        """Kind, catalog and table: offsets are positions in that table's lineage."""
        return {"kind": self.kind, "catalog": self.catalog_label, "table": self.name}

    @property
    def schema(self) -> pl.Schema | None:
        """The table's current schema when first asked (for planning and for batches
        without rows)."""
        if self._current_schema is None:
            if self._table is None:
                self._table = self._load()
            if self._table is None:  # not created yet: open() says so
                return None
            self._current_schema = polars_schema(self._table.metadata, None)
        return self._current_schema

    # -- lifecycle --------------------------------------------------------------

    def table(self, *, refresh: bool = False) -> Table:
        """The PyIceberg table, loaded on first use; ``refresh`` reloads its metadata
        from the catalog (new snapshots)."""
        if self._table is None:
            self._table = self._load()
            if self._table is None:
                raise SourceError(
                    f"read_iceberg: catalog {self.catalog_label} has no Iceberg table "
                    f"{self.name}; create the table first, or fix the name (namespace.table) "
                    "or the catalog"
                )
        elif refresh:
            try:
                self._table = self._table.refresh()
            except Exception as exc:
                raise SourceError(
                    f"read_iceberg: cannot reload Iceberg table {self.name} from catalog "
                    f"{self.catalog_label}: {str(exc).splitlines()[0] if str(exc) else exc!r}"
                ) from exc
        return self._table

    def _load(self) -> Table | None:
        """The table from the catalog, ``None`` when the catalog has no such table;
        a catalog that cannot be opened raises :class:`SourceError`."""
        from sinks.exceptions import SinkConfigError
        from sinks.iceberg_catalog import load_iceberg_table, resolve_catalog

        try:
            catalog = resolve_catalog(self.catalog, storage_options=self.storage_options)
            return load_iceberg_table(catalog, self.ident)
        except SinkConfigError as exc:
            raise SourceError(f"read_iceberg: {exc}") from None

    def open(self, ctx: SourceContext) -> None:
        """Load the table (refused with a clear error when it does not exist)."""
        self.table(refresh=True)

    def initial_offset(self) -> dict[str, Any]:
        """Before the first snapshot (``"earliest"``), after the current one
        (``"latest"``), or before the given / timestamp's snapshot."""
        table = self.table(refresh=True)
        current = table.current_snapshot()
        lineage = self._lineage(table.metadata, current)
        if self.starting_timestamp_ms is not None:
            at = next((s for s in lineage if s.timestamp_ms >= self.starting_timestamp_ms), None)
            return (before(at) if at is not None else self._after(current)).to_offset()
        if self.starting_snapshot == "latest":
            return self._after(current).to_offset()
        if isinstance(self.starting_snapshot, int):
            found = next((s for s in lineage if s.snapshot_id == self.starting_snapshot), None)
            if found is None:
                retained = ", ".join(str(s.snapshot_id) for s in lineage[-5:]) or "none"
                raise SourceError(
                    f"read_iceberg({self.name!r}): starting_snapshot={self.starting_snapshot} "
                    "is not a snapshot of the table's current lineage (expired, rolled back, "
                    f"or of another table); the newest ones are {retained}: pass one of them, "
                    "'earliest' or 'latest'"
                )
            return before(found).to_offset()
        if lineage and _history_expired(lineage[0]):
            raise self._history_error(lineage[0])
        return BEFORE_FIRST.to_offset()

    def _history_error(self, first: Snapshot) -> SourceError:
        return SourceError(
            f"read_iceberg({self.name!r}): the table's snapshots before {first.snapshot_id} "
            "were expired, so its whole history cannot be replayed. Pass "
            f"starting_snapshot={first.snapshot_id} (on a new checkpoint) to read the rows "
            "appended from that snapshot on (rows already in the table before it are not "
            "read), or starting_snapshot='latest' for new snapshots only."
        )

    @staticmethod
    def _after(current: Snapshot | None) -> Position:
        return BEFORE_FIRST if current is None else after(current)

    @staticmethod
    def _lineage(metadata: TableMetadata, current: Snapshot | None) -> list[Snapshot]:
        """The retained ancestors of ``current`` and itself, oldest first."""
        out: list[Snapshot] = []
        snap = current
        while snap is not None:
            out.append(snap)
            parent = snap.parent_snapshot_id
            snap = metadata.snapshot_by_id(parent) if parent is not None else None
        out.reverse()
        return out

    def latest_offset(self, start: Any, *, capped: bool = True) -> dict[str, Any]:
        """The end of the next batch: up to ``max_files_per_batch`` new data files.

        Walks the snapshots after ``start`` (reloading the table's metadata),
        skipping those without new rows. Unless ``ignore_changes`` or
        ``skip_change_commits``, an overwrite/delete snapshot ends a capped batch
        before it; when it is the first snapshot to read (or the batch is
        uncapped) the range takes it whole and stops there, and :meth:`read`
        refuses that range with a :class:`SourceError` (planning itself never
        fails on it: the engine may plan speculatively). Returns ``start`` when
        there is nothing new.
        """
        pos = parse_position(start, self.name)
        table = self.table(refresh=True)
        current = table.current_snapshot()
        if current is None or (current.snapshot_id == pos.snapshot_id and pos.index is None):
            return pos.to_offset()
        cap = self.max_files_per_batch if capped else None
        taken = 0
        end = pos
        for snap in self._range(table.metadata, pos, after(current)):
            kind = self._kind(snap)
            if kind == "refuse":
                if taken and capped:
                    break
                end, taken = after(snap), taken + 1
                break
            files = self._added(snap) if kind == APPEND else ()
            lo = (pos.index or 0) if snap.snapshot_id == pos.snapshot_id else 0
            remaining = len(files) - lo
            if cap is not None and taken + remaining > cap:
                end = Position(snap.snapshot_id, snap.sequence_number or 0, snap.timestamp_ms,
                               lo + cap - taken)
                taken = cap
                break
            taken += remaining
            end = after(snap)
            if cap is not None and taken >= cap:
                break
        return (pos if taken == 0 else end).to_offset()

    def compare(self, a: Any, b: Any) -> int:
        """Order of two positions of one lineage."""
        x, y = parse_position(a, self.name).key, parse_position(b, self.name).key
        return (x > y) - (x < y)

    def read(self, start: Any, end: Any) -> SourceBatch:
        """The rows of exactly the data files in ``(start, end]``."""
        files, schema_id = self.files_between(start, end)
        table = self.table()
        schema = polars_schema(table.metadata, schema_id)
        return SourceBatch(read_data_files(table.metadata, table.io, files, schema_id, schema))

    def read_splits(self, start: Any, end: Any, pieces: int) -> list[ReadSplit] | None:
        """The data files of ``(start, end]`` (from the manifests, no rows read) as
        ``pieces`` contiguous runs of about equal bytes (:class:`IcebergSplit`),
        each read from the table's immutable metadata file, as :meth:`read`."""
        files, schema_id = self.files_between(start, end)
        table = self.table()
        schema = polars_schema(table.metadata, schema_id)
        return [
            IcebergSplit(table.metadata_location, dict(table.io.properties),
                         tuple(files[lo:hi]), schema_id, schema)
            for lo, hi in balanced_runs([f.size for f in files], pieces)
        ]

    # -- the lineage ------------------------------------------------------------

    def _kind(self, snap: Snapshot) -> Literal["append", "skip", "refuse"]:
        """What a snapshot gives the stream: its added files, nothing, or an error."""
        operation = _operation(snap)
        if operation == APPEND:
            return APPEND
        if operation == REPLACE:
            return "skip"
        if self.ignore_changes:
            return APPEND
        return "skip" if self.skip_change_commits else "refuse"

    def _added(self, snap: Snapshot) -> tuple[IcebergFile, ...]:
        cached = self._files.get(snap.snapshot_id)
        if cached is None:
            try:
                cached = added_files(snap, self.table().io)
            except FileNotFoundError as exc:
                raise SourceError(
                    f"Iceberg table {self.name}: a manifest of snapshot {snap.snapshot_id} is "
                    f"gone ({exc}); restore it, or start the query on a new checkpoint"
                ) from exc
            self._files[snap.snapshot_id] = cached
        return cached

    def _range(self, metadata: TableMetadata, start: Position, end: Position) -> list[Snapshot]:
        """The snapshots of ``(start, end]``, oldest first: ``end``'s snapshot and its
        ancestors after ``start`` (``start``'s own snapshot when it is partly read).

        Raises :class:`SourceError` when a snapshot between them is gone
        (expired), or ``start`` is not an ancestor of ``end`` (a rollback)."""
        out: list[Snapshot] = []
        sid = end.snapshot_id
        if sid is None or (sid == start.snapshot_id and start.index is None):
            return out
        while True:
            snap = metadata.snapshot_by_id(sid)
            if snap is None:
                raise self._expired(sid, start, end)
            out.append(snap)
            parent = snap.parent_snapshot_id
            if sid == start.snapshot_id:  # partly read: the rest of it is in the range
                break
            if parent is not None and parent == start.snapshot_id and start.index is None:
                break
            if parent is None:
                if start.snapshot_id is None:
                    if _history_expired(snap):
                        raise self._history_error(snap)
                    break
                raise SourceError(
                    f"Iceberg table {self.name}: snapshot {start.snapshot_id}, where the query "
                    f"stands, is no longer an ancestor of snapshot {end.snapshot_id}: it was "
                    "expired (expire_snapshots) before the query read past it, or the table "
                    "was rolled back or replaced. Keep snapshots longer than the query lags, "
                    "and start the query on a new checkpoint (starting_snapshot='latest' or a "
                    "retained snapshot id)."
                )
            sid = parent
        out.reverse()
        return out

    def _expired(self, missing: int, start: Position, end: Position) -> SourceError:
        return SourceError(
            f"Iceberg table {self.name}: snapshot {missing}, between the query's position "
            f"(snapshot {start.snapshot_id}) and snapshot {end.snapshot_id}, is no longer in "
            "the table (expired by expire_snapshots before the query read it?). A recorded "
            "batch cannot be read without it: keep snapshots longer than the query lags, and "
            "start the query on a new checkpoint with starting_snapshot='latest' or a "
            "retained snapshot id."
        )

    def files_between(
        self, start: Any, end: Any, *, strict: bool = True
    ) -> tuple[list[IcebergFile], int | None]:
        """The data files of ``(start, end]`` in lineage and manifest order, and the
        schema id of ``end``'s snapshot (the schema the batch is read with).

        An overwrite/delete snapshot raises :class:`SourceError` (unless
        ``ignore_changes`` or ``skip_change_commits``); with ``strict=False`` it
        adds no files instead."""
        pieces, schema_id = self._pieces(start, end, strict=strict)
        return [f for _, files in pieces for f in files], schema_id

    backlog_unit = "snapshots"
    """What :meth:`progress_items` counts files by (``microbatch backfill``)."""

    def progress_items(self, start: Any, end: Any) -> list[tuple[int, int | None]]:
        """``(snapshot id, rows)`` of every data file in ``(start, end]``, in lineage
        order (rows from the manifest)."""
        pieces, _ = self._pieces(start, end, strict=False)
        return [(sid, f.rows) for sid, files in pieces for f in files]

    def backlog(self, start: Any, end: Any) -> Backlog:
        """Snapshots with data, files and rows in ``(start, end]`` (for progress)."""
        pieces, _ = self._pieces(start, end, strict=False)
        return Backlog(snapshots=sum(1 for _, files in pieces if files),
                       files=sum(len(files) for _, files in pieces),
                       rows=sum(f.rows for _, files in pieces for f in files))

    def _pieces(
        self, start: Any, end: Any, *, strict: bool
    ) -> tuple[list[tuple[int, tuple[IcebergFile, ...]]], int | None]:
        """``(snapshot id, its files in the range)`` for each snapshot of
        ``(start, end]`` that adds rows to the stream, and ``end``'s schema id."""
        a, b = parse_position(start, self.name), parse_position(end, self.name)
        table = self.table()
        if b.snapshot_id is not None and table.metadata.snapshot_by_id(b.snapshot_id) is None:
            table = self.table(refresh=True)  # planned by another process, or just now
        out: list[tuple[int, tuple[IcebergFile, ...]]] = []
        schema_id: int | None = None
        for snap in self._range(table.metadata, a, b):
            schema_id = snap.schema_id
            kind = self._kind(snap)
            if kind == "refuse" and strict:
                raise self._change_error(snap)
            if kind != APPEND:
                continue
            files = self._added(snap)
            lo = (a.index or 0) if snap.snapshot_id == a.snapshot_id else 0
            hi = b.index if snap.snapshot_id == b.snapshot_id and b.index is not None \
                else len(files)
            if hi > len(files):
                raise SourceError(
                    f"Iceberg table {self.name}: a recorded batch ends at file {hi} of snapshot "
                    f"{snap.snapshot_id}, which added only {len(files)} data files; the "
                    "checkpoint belongs to another table"
                )
            out.append((snap.snapshot_id, files[lo:hi]))
        return out, schema_id

    def _change_error(self, snap: Snapshot) -> SourceError:
        summary = snap.summary.additional_properties if snap.summary is not None else {}
        removed = summary.get("deleted-data-files", "?")
        return SourceError(
            f"Iceberg table {self.name}: snapshot {snap.snapshot_id} ({_operation(snap)}) "
            f"removes or rewrites data ({removed} data file(s) removed, "
            f"{summary.get('deleted-records', '?')} row(s) deleted), which a stream of "
            "appended rows cannot follow; the stream stops here (earlier snapshots were "
            "read). To go on, restart with skip_change_commits=True passed to read_iceberg "
            "(such snapshots are skipped: right for deletes), or ignore_changes=True (their "
            "added files are read: the surviving rows of rewritten files appear twice "
            "downstream), or start a new checkpoint with starting_snapshot='latest'."
        )


def _history_expired(root: Snapshot) -> bool:
    """True when the oldest retained snapshot of a lineage had ancestors: its parent
    is named (Java's expiry keeps the id), or the table held data files it did not
    add (PyIceberg's expiry clears the parent id)."""
    if root.parent_snapshot_id is not None:
        return True
    summary = root.summary.additional_properties if root.summary is not None else {}
    try:
        total = int(summary.get("total-data-files", 0))
        added = int(summary.get("added-data-files", 0))
    except ValueError:
        return False
    return total > added


def _operation(snap: Snapshot) -> str:
    """The snapshot's ``operation`` (``append``, ``replace``, ``overwrite``, ``delete``)."""
    if snap.summary is None:
        return APPEND  # format v1 snapshots may lack a summary: treated as appends
    return str(snap.summary.operation.value)
