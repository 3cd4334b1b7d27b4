"""A Delta table's Change Data Feed as a replayable changelog source.

``read_delta(path, changes=True)`` emits, version by version, what each commit
changed: rows with Delta CDF's columns ``_change_type`` (``insert``,
``update_preimage``, ``update_postimage``, ``delete``), ``_commit_version``
(Int64) and ``_commit_timestamp`` (Datetime ms UTC, the commit's time), after
the table's own columns. Applying the changes in order to an empty table
gives the table (:mod:`sinks.changelog`).

The log is the same as :mod:`microbatch.sources.delta`'s, and so are the
offsets (``{"version": v, "index": 0}``), but a batch always holds whole
versions: a version's changes are one unit. What each commit gives, as
Delta's CDF defines it:

- a commit with ``cdc`` actions: the rows of its ``_change_data/`` files,
  which carry ``_change_type`` (MERGE, UPDATE, DELETE written with the
  table property ``delta.enableChangeDataFeed=true``);
- otherwise, its removed files' rows as ``delete`` then its added files'
  rows as ``insert`` (an append; or a commit that removes whole files with
  the property on, such as a DELETE of a whole partition or an overwrite);
- compaction and metadata-only commits: nothing.

A commit that removes data without ``cdc`` files while the property is off at
that version has no change feed: reading it raises
:class:`~microbatch.exceptions.ChangeDataFeedError` naming the version and how
to turn the feed on. Versions before it are processed first (planning never
fails), as the append-only source does for a rewrite.

Order: versions in order; within a version, deletes, then preimages, then
postimages, then inserts (a version changes each row once, so this order
applies correctly to a keyed table even when a key is deleted and inserted by
one commit). Delta does not record which preimage goes with which postimage:
a consumer pairs them by the table's key (``split_changes`` drops preimages).

Findings about deltalake 1.x (checked here): ``DeltaTable.load_cdf`` reads
MERGE/UPDATE/DELETE/overwrite correctly, but refuses every version written
while the property was off (appends included) and returns a version's rows in
no fixed order, so this source reads the log and the files itself (the tests
compare it with ``load_cdf``).
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any, Literal

import polars as pl

from microbatch.exceptions import ChangeDataFeedError, PlanError, SourceError
from microbatch.sources.base import SourceBatch
from microbatch.sources.delta import DeltaCommit, DeltaFile, DeltaSource, _check_offset
from sinks.changelog import CHANGE_TYPE, DELETE, INSERT, UPDATE_POSTIMAGE, UPDATE_PREIMAGE

COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
CHANGE_COLUMNS = pl.Schema(
    [(CHANGE_TYPE, pl.String), (COMMIT_VERSION, pl.Int64),
     (COMMIT_TIMESTAMP, pl.Datetime("ms", "UTC"))]
)
"""The columns Delta's Change Data Feed adds after the table's own."""

_ORDER = pl.Enum([DELETE, UPDATE_PREIMAGE, UPDATE_POSTIMAGE, INSERT])

Kind = Literal["cdc", "delete", "insert"]


class DeltaChangesSource(DeltaSource):
    """The Change Data Feed of a Delta table, whole versions per batch.

    Same options as :class:`~microbatch.sources.delta.DeltaSource` except
    ``ignore_changes`` (changes are the point); ``max_files_per_batch`` caps a
    batch at whole versions holding at most that many files (a larger
    version is a batch of its own).

    Guarantees: ``read(a, b)`` returns the same change rows, in the same
    order, every time, as long as the log, the data files and the
    ``_change_data/`` files of those versions are kept (``vacuum`` removes
    them: a replay then fails with a clear error).
    """

    kind = "delta-changes"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        starting_version: int | None = None,
        starting_timestamp: datetime | str | None = None,
        max_files_per_batch: int | None = None,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        super().__init__(
            path, starting_version=starting_version, starting_timestamp=starting_timestamp,
            max_files_per_batch=max_files_per_batch, storage_options=storage_options,
        )
        self._feed_on: dict[int, bool] = {}

    def clone(self) -> DeltaChangesSource:
        """A new source over the same table with the same options (its own caches)."""
        copy = DeltaChangesSource(
            self.uri, starting_version=self.starting_version,
            max_files_per_batch=self.max_files_per_batch, storage_options=self.storage_options,
        )
        copy.starting_timestamp_ms = self.starting_timestamp_ms
        return copy

    def describe(self) -> dict[str, Any]:
        """Kind, table URI and options (storage options are left out: secrets)."""
        described = super().describe()
        del described["ignore_changes"]
        return described

    @property
    def schema(self) -> pl.Schema | None:
        """The table's schema at its latest version, then the three CDF columns."""
        table = super().schema
        return None if table is None else _with_change_columns(table)

    # -- planning ---------------------------------------------------------------

    def latest_offset(self, start: Any, *, capped: bool = True) -> dict[str, int]:
        """The end of the next batch: whole versions, up to ``max_files_per_batch``
        files (at least one version).

        A version without a change feed ends a capped batch before it; when it
        is the first version to read (or the batch is uncapped, so that an
        available-now run reaches it) the range takes it and stops there, and
        :meth:`read` refuses it. Returns ``start`` when no version after it changes rows.
        """
        version = self._version_of(start)
        latest = self.latest_version()
        cap = self.max_files_per_batch if capped else None
        taken, pos = 0, version
        while latest is not None and pos <= latest:
            commit = self.log_commit(pos)
            if not self._has_feed(commit):
                if not (taken and capped):
                    pos, taken = pos + 1, taken + 1
                break
            n = len(_entries(commit))
            if cap is not None and taken and taken + n > cap:
                break
            taken, pos = taken + n, pos + 1
            if cap is not None and taken >= cap:
                break
        return {"version": pos if taken else version, "index": 0}

    # -- reading ----------------------------------------------------------------

    def read(self, start: Any, end: Any) -> SourceBatch:
        """The change rows of exactly the versions in ``[start, end)``, in order."""
        entries = self.changes_between(start, end)
        last = max((v for v, _, _ in entries), default=self._version_of(start))
        table = self._schema_at(max(last, 0))
        with_type = pl.Schema([*table.items(), (CHANGE_TYPE, pl.String)])
        frames = []
        for version, file, kind in entries:
            frame = self._read_file(version, file, with_type)
            if kind != "cdc":
                frame = frame.with_columns(pl.lit(kind, pl.String).alias(CHANGE_TYPE))
            stamp = self.log_commit(version).timestamp_ms
            frames.append(frame.with_columns(
                pl.lit(version, pl.Int64).alias(COMMIT_VERSION),
                pl.lit(stamp, pl.Int64).cast(pl.Datetime("ms")).dt.replace_time_zone("UTC")
                .alias(COMMIT_TIMESTAMP),
            ))
        schema = _with_change_columns(table)
        if not frames:
            return SourceBatch(schema.to_frame())
        data = pl.concat(frames, how="vertical")
        unknown = data.filter(
            pl.col(CHANGE_TYPE).is_in(list(_ORDER.categories)).fill_null(False).not_()
        )
        if unknown.height:
            raise SourceError(
                f"Delta table {self.uri}: version {unknown[COMMIT_VERSION][0]} has a change "
                f"row with _change_type {unknown[CHANGE_TYPE][0]!r}, not one of "
                f"{list(_ORDER.categories)}; the _change_data/ files are not Delta CDF files"
            )
        # NOTE: a stable sort: files keep log order and rows file order within a kind
        return SourceBatch(
            data.sort(COMMIT_VERSION, pl.col(CHANGE_TYPE).cast(_ORDER), maintain_order=True)
            .select(list(schema))
        )

    def changes_between(
        self, start: Any, end: Any, *, strict: bool = True
    ) -> list[tuple[int, DeltaFile, Kind]]:
        """``(version, file, kind)`` for every file of the feed in ``[start, end)``.

        A version without a change feed raises
        :class:`~microbatch.exceptions.ChangeDataFeedError`; with
        ``strict=False`` it adds no files instead.
        """
        v0, v1 = self._version_of(start), self._version_of(end)
        out: list[tuple[int, DeltaFile, Kind]] = []
        for version in range(v0, v1):
            commit = self.log_commit(version)
            if not self._has_feed(commit):
                if strict:
                    raise self._no_feed_error(commit)
                continue
            out.extend((version, file, kind) for file, kind in _entries(commit))
        return out

    def files_between(
        self, start: Any, end: Any, *, strict: bool = True
    ) -> list[tuple[int, DeltaFile]]:
        """``(version, file)`` for every file of the feed in ``[start, end)``
        (what :meth:`backlog` and the backfill display count)."""
        return [(v, f) for v, f, _ in self.changes_between(start, end, strict=strict)]

    # -- the feed ---------------------------------------------------------------

    def _version_of(self, offset: Any) -> int:
        version, index = _check_offset(offset, self.uri)
        if index:
            raise SourceError(
                f"Delta change feed {self.uri}: offset {offset!r} cuts a version into "
                "files, which a change feed never records; was the checkpoint written by "
                "read_delta without changes=True?"
            )
        return version

    def _has_feed(self, commit: DeltaCommit) -> bool:
        """Whether Delta's CDF defines the changes of ``commit``."""
        if commit.change_files or not commit.rewrites:
            return True
        try:
            return self._feed_on_at(commit.version)
        except SourceError:
            return False

    def _feed_on_at(self, version: int) -> bool:
        """``delta.enableChangeDataFeed`` in force at ``version``: the newest
        ``metaData`` at or before it, else delta-rs's view (it reads checkpoints)."""
        walked: list[int] = []
        value: bool | None = None
        v = version
        while v >= 0:
            if v in self._feed_on:
                value = self._feed_on[v]
                break
            commit = self._load_commit(v)
            if commit is None:
                break
            if commit.change_data_feed is not None:
                value = commit.change_data_feed
                break
            walked.append(v)
            v -= 1
        if value is None:
            value = self._load_feed_flag(version) if v >= 0 else False
        for w in [*walked, version]:
            self._feed_on[w] = value
        return value

    def _load_feed_flag(self, version: int) -> bool:
        from deltalake import DeltaTable

        try:
            table = DeltaTable(self.uri, version=version,
                               storage_options=self.storage_options or None)
        except Exception as exc:
            raise SourceError(
                f"Delta table {self.uri}: cannot load version {version} to read its "
                f"table properties: {exc}"
            ) from exc
        flag = table.metadata().configuration.get("delta.enableChangeDataFeed", "false")
        return str(flag).lower() == "true"

    def _no_feed_error(self, commit: DeltaCommit) -> ChangeDataFeedError:
        return ChangeDataFeedError(
            f"Delta table {self.uri}: version {commit.version} ({commit.operation}) removes "
            f"or rewrites data ({commit.removed} file(s) removed) but has no change data "
            "feed: delta.enableChangeDataFeed was off when it was written, so what it "
            "changed is not recorded. Turn the feed on for the versions to come "
            "(SQL: ALTER TABLE ... SET TBLPROPERTIES (delta.enableChangeDataFeed = true); "
            "deltalake: DeltaTable(path).alter.set_table_properties("
            "{'delta.enableChangeDataFeed': 'true'})) and start a new checkpoint with "
            f"starting_version after the version that turns it on (> {commit.version})."
        )


def _entries(commit: DeltaCommit) -> list[tuple[DeltaFile, Kind]]:
    """The files that make ``commit``'s change feed, with how to read each."""
    if commit.change_files:
        return [(f, "cdc") for f in commit.change_files]
    return [*((f, "delete") for f in commit.removed_files),
            *((f, "insert") for f in commit.files)]


def _with_change_columns(table: pl.Schema) -> pl.Schema:
    clash = [name for name in CHANGE_COLUMNS if name in table]
    if clash:
        raise PlanError(
            f"read_delta(changes=True): the table has columns {clash}, which Delta's change "
            "data feed reserves; rename them in the table"
        )
    return pl.Schema([*table.items(), *CHANGE_COLUMNS.items()])
