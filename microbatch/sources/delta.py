"""A Delta table's versions as a replayable log (lakehouse replay).

The table's commits are the log. A commit file ``_delta_log/<version>.json``
never changes once written, so a position in it names the same rows
forever. An offset is ``{"version": v, "index": i}``: every data file added
by versions before ``v``, plus the first ``i`` data files that version ``v``
added (in the order of the ``add`` actions in its commit file). So

- a batch reads exactly the files that its recorded ``[start, end)`` names,
  and a replay reads the same rows;
- ``max_files_per_batch`` can cut a large version into several batches;
- new commits are picked up by later batches (the log is probed for the
  next version file each time the engine plans).

What each kind of commit does to the stream:

- appends (``add`` actions with ``dataChange=true``, no ``remove`` with
  ``dataChange=true``): their files are read;
- compaction (``OPTIMIZE``: ``dataChange=false``) and metadata-only commits
  add no rows: skipped;
- a version that removes or rewrites data (``DELETE``, ``UPDATE``,
  ``MERGE``, overwrite) stops the query with a :class:`SourceError` naming
  the version and the operation: a stream of appended rows cannot express
  "these rows are gone". Files before that version are processed first
  (with ``trigger="once"``, whose one batch takes everything, they are not);
  the failing batch is recorded, so restarting the same checkpoint with
  ``ignore_changes=True`` goes on from exactly there.
  With ``ignore_changes=True`` such a version's added files are read
  instead, so every row of a rewritten file is emitted again (duplicates of
  the unchanged rows, as Spark's ``ignoreChanges``); removals are ignored.
  To follow such versions as changes, read the table's Change Data Feed
  (``read_delta(path, changes=True)``, :mod:`microbatch.sources.delta_changes`).

Rows are read from the data files with Polars, partition columns restored
from the ``add`` action's ``partitionValues`` with the table's types, and
conformed to the table's schema as of the last version in the batch (columns
a file lacks are null), so a replay gives the same columns too.

Departure from Spark: without ``starting_version``/``starting_timestamp``
the stream starts at version 0 and replays the whole history (Spark first
reads a snapshot of the latest version). A table whose log before some
version was cleaned up cannot be replayed from 0: pass ``starting_version``.

Limits: local paths, ``file://`` and ``s3://`` URIs; tables with deletion
vectors or column mapping are refused with a clear error.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

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

log = logging.getLogger("microbatch.sources.delta")

LOG_DIR = "_delta_log"
SCHEMA_WALK_LIMIT = 100
"""How many commits back the source looks for the schema in force at a version
before it asks delta-rs to load that version (checkpoints make that cheaper)."""


# --------------------------------------------------------------------------- the log


@dataclass(frozen=True)
class DeltaFile:
    """One data file added by a commit."""

    path: str
    """The file's path relative to the table (decoded), or an absolute URI."""
    partition_values: tuple[tuple[str, str | None], ...]
    size: int
    rows: int | None
    """``numRecords`` from the file's statistics, when the writer recorded it."""


@dataclass(frozen=True)
class DeltaCommit:
    """What one version did, as far as a stream of appended rows is concerned."""

    version: int
    operation: str
    timestamp_ms: int | None
    files: tuple[DeltaFile, ...]
    """Added files with ``dataChange=true``, in log order."""
    removed: int
    """Removed files with ``dataChange=true`` (a delete, update, merge or overwrite)."""
    schema: pl.Schema | None
    """The table schema set by this commit's ``metaData`` action, if it has one."""
    removed_files: tuple[DeltaFile, ...] = ()
    """Removed files with ``dataChange=true``, in log order (their rows are a
    change feed's deletes when the commit wrote no ``cdc`` files)."""
    change_files: tuple[DeltaFile, ...] = ()
    """The ``cdc`` actions' files (``_change_data/``), in log order: when present,
    they are the version's change feed."""
    change_data_feed: bool | None = None
    """``delta.enableChangeDataFeed`` as set by this commit's ``metaData``
    action (``None``: the commit has no ``metaData``)."""

    @property
    def rewrites(self) -> bool:
        """True when the commit removes or rewrites data."""
        return self.removed > 0


def parse_commit(version: int, raw: bytes, *, where: str) -> DeltaCommit:
    """Parse the JSON-lines commit file of ``version``.

    Raises :class:`SourceError` for features this source cannot read
    faithfully (deletion vectors, column mapping).
    """
    files: list[DeltaFile] = []
    removed_files: list[DeltaFile] = []
    change_files: list[DeltaFile] = []
    change_data_feed: bool | None = None
    operation, timestamp, schema = "UNKNOWN", None, None
    for line in raw.splitlines():
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except ValueError as exc:
            raise SourceError(f"Delta commit {where} is not valid JSON lines: {exc}") from exc
        if "add" in action:
            add = action["add"]
            if not add.get("dataChange", True):
                continue
            if add.get("deletionVector"):
                raise SourceError(
                    f"Delta table version {version} ({where}) adds a file with a deletion "
                    "vector, which read_delta cannot apply; disable deletion vectors on the "
                    "table (delta.enableDeletionVectors=false) and purge them"
                )
            files.append(_file_of(add))
        elif "remove" in action:
            if action["remove"].get("dataChange", True):
                removed_files.append(_file_of(action["remove"]))
        elif "cdc" in action:
            change_files.append(_file_of(action["cdc"]))
        elif "commitInfo" in action:
            info = action["commitInfo"]
            operation = _describe_operation(info)
            timestamp = info.get("inCommitTimestamp", info.get("timestamp"))
        elif "metaData" in action:
            meta = action["metaData"]
            mapping = (meta.get("configuration") or {}).get("delta.columnMapping.mode", "none")
            if mapping != "none":
                raise SourceError(
                    f"Delta table version {version} ({where}) uses column mapping "
                    f"(mode {mapping!r}); read_delta reads physical column names and does "
                    "not support it"
                )
            schema = _schema_from_json(meta["schemaString"], where)
            flag = (meta.get("configuration") or {}).get("delta.enableChangeDataFeed", "false")
            change_data_feed = str(flag).lower() == "true"
    return DeltaCommit(
        version, operation, timestamp, tuple(files), len(removed_files), schema,
        removed_files=tuple(removed_files), change_files=tuple(change_files),
        change_data_feed=change_data_feed,
    )


def _file_of(action: dict[str, Any]) -> DeltaFile:
    """The data file named by an ``add``, ``remove`` or ``cdc`` action."""
    return DeltaFile(
        path=_decode_path(action["path"]),
        partition_values=tuple(sorted((action.get("partitionValues") or {}).items())),
        size=int(action.get("size") or 0),
        rows=_num_records(action.get("stats")),
    )


def _decode_path(path: str) -> str:
    # add.path is a URI-encoded relative path, or an absolute URI
    return path if "://" in path else unquote(path)


def _num_records(stats: Any) -> int | None:
    if not stats:
        return None
    try:
        value = json.loads(stats).get("numRecords") if isinstance(stats, str) else None
    except ValueError:
        return None
    return int(value) if isinstance(value, int) else None


def _describe_operation(info: dict[str, Any]) -> str:
    op = str(info.get("operation", "UNKNOWN"))
    mode = (info.get("operationParameters") or {}).get("mode")
    return f"{op} (mode {mode})" if mode and op == "WRITE" else op


def _schema_from_json(text: str, where: str) -> pl.Schema:
    import pyarrow as pa
    from deltalake import Schema

    try:
        arrow = pa.schema(Schema.from_json(text).to_arrow())
    except Exception as exc:
        raise SourceError(f"cannot read the table schema in {where}: {exc}") from exc
    return pl.DataFrame(arrow.empty_table()).schema


class DeltaLogStore:
    """Reads the commit files of one table: local disk, or S3 through pyarrow."""

    def __init__(self, uri: str, storage_options: dict[str, str]) -> None:
        self.uri = uri
        self.storage_options = storage_options
        scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
        if scheme in ("", "file"):
            self.local = True
            self.root = uri[len("file://"):] if scheme else uri
            self._fs: Any = None
        elif scheme in ("s3", "s3a"):
            self.local = False
            self.root = uri.split("://", 1)[1]
            self._fs = s3_filesystem(storage_options)
        else:
            raise PlanError(
                f"read_delta({uri!r}): only local paths, file:// and s3:// tables are "
                f"supported, not {scheme}://"
            )

    def log_path(self, version: int) -> str:
        """Where the commit file of ``version`` is (for messages and reads)."""
        return f"{self.root}/{LOG_DIR}/{version:020d}.json"

    def read(self, version: int) -> bytes | None:
        """The commit file of ``version``, or ``None`` when it does not exist."""
        path = self.log_path(version)
        try:
            if self.local:
                with open(path, "rb") as fh:
                    return fh.read()
            with self._fs.open_input_stream(path) as fh:
                return bytes(fh.read())
        except FileNotFoundError:
            return None
        except OSError as exc:
            if not self.local and _not_found(exc):
                return None
            raise SourceError(f"cannot read Delta commit {path}: {exc}") from exc

    def exists(self, version: int) -> bool:
        """True when the commit file of ``version`` exists."""
        path = self.log_path(version)
        if self.local:
            return os.path.isfile(path)
        import pyarrow.fs as pafs

        try:
            return bool(self._fs.get_file_info(path).type == pafs.FileType.File)
        except OSError as exc:
            raise SourceError(f"cannot look for Delta commit {path}: {exc}") from exc

    def versions(self) -> list[int]:
        """Versions that have a JSON commit file, ascending (one listing)."""
        directory = f"{self.root}/{LOG_DIR}"
        try:
            if self.local:
                names = os.listdir(directory) if os.path.isdir(directory) else []
            else:
                import pyarrow.fs as pafs

                infos = self._fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
                names = [info.base_name for info in infos]
        except OSError as exc:
            raise SourceError(f"cannot list the Delta log {directory}: {exc}") from exc
        return sorted(
            int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit()
        )

    def data_path(self, rel: str) -> str:
        """A data file's location as Polars reads it."""
        if "://" in rel:
            return rel[len("file://"):] if rel.startswith("file://") else rel
        if self.local:
            return os.path.join(self.root, rel)
        return f"{self.uri.rstrip('/')}/{rel}"

    def mtime_ms(self, version: int) -> int | None:
        """The commit file's modification time (Delta's commit time without
        in-commit timestamps)."""
        path = self.log_path(version)
        try:
            if self.local:
                return int(os.stat(path).st_mtime * 1000)
            info = self._fs.get_file_info(path)
            return int(info.mtime.timestamp() * 1000) if info.mtime else None
        except OSError:
            return None


def _not_found(exc: OSError) -> bool:
    text = str(exc).lower()
    return "not found" in text or "nosuchkey" in text or "does not exist" in text


def s3_filesystem(options: dict[str, str]) -> Any:
    """A ``pyarrow.fs.S3FileSystem`` from delta-rs style ``storage_options``
    (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_REGION``, ...)."""
    import pyarrow.fs as pafs

    opts = {k.lower(): v for k, v in options.items()}

    def pick(*names: str) -> str | None:
        for name in names:
            if opts.get(name):
                return opts[name]
        return None

    kwargs: dict[str, Any] = {}
    if key := pick("aws_access_key_id", "access_key_id"):
        kwargs["access_key"] = key
        kwargs["secret_key"] = pick("aws_secret_access_key", "secret_access_key") or ""
        if token := pick("aws_session_token", "session_token", "aws_token", "token"):
            kwargs["session_token"] = token
    if region := pick("aws_region", "region", "aws_default_region"):
        kwargs["region"] = region
    if endpoint := pick("aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint"):
        scheme, _, rest = endpoint.partition("://")
        kwargs["endpoint_override"] = rest if rest else endpoint
        kwargs["scheme"] = scheme if rest else "https"
    if (pick("aws_virtual_hosted_style_request", "virtual_hosted_style_request") or "").lower() \
            == "true":
        kwargs["force_virtual_addressing"] = True
    return pafs.S3FileSystem(**kwargs)


# --------------------------------------------------------------------------- source


@dataclass(frozen=True)
class Backlog:
    """How much a range of the log holds: versions with data, files and rows."""

    versions: int
    files: int
    rows: int | None
    """``None`` when some file has no row count in its statistics."""


class DeltaSource(Source):
    """The data files appended to a Delta table, version by version.

    Parameters
    ----------
    path
        The table: a local directory, ``file://`` or ``s3://`` URI.
    starting_version
        The first version to read (default: 0, the whole history).
    starting_timestamp
        Start at the first version committed at or after this instant
        (a ``datetime``, naive meaning UTC, or an ISO-8601 string); a time
        after the latest commit starts after it (only new commits are read).
    max_files_per_batch
        At most this many data files per batch (``None``: all new files).
    ignore_changes
        Read the added files of versions that rewrite data instead of
        stopping (rewritten rows are emitted again).
    storage_options
        For ``s3://``: delta-rs style options (``AWS_ENDPOINT_URL``,
        ``AWS_ACCESS_KEY_ID``, ``AWS_REGION``, ``AWS_ALLOW_HTTP``, ...),
        used for the log and passed to Polars for the data files.

    Guarantees: ``read(a, b)`` returns the same rows, with the same columns,
    every time (the commit files it reads are immutable), as long as the
    log and the data files of those versions are kept (``vacuum`` and log
    cleanup remove them: a replay then fails with a clear error, never
    silently reads something else).
    """

    kind = "delta"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        starting_version: int | None = None,
        starting_timestamp: datetime | str | None = None,
        max_files_per_batch: int | None = None,
        ignore_changes: bool = False,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        text = os.fspath(path)
        self.uri = text.rstrip("/") if "://" in text else os.path.abspath(os.path.expanduser(text))
        if starting_version is not None and starting_timestamp is not None:
            raise PlanError("read_delta: pass starting_version or starting_timestamp, not both")
        if starting_version is not None and (
            isinstance(starting_version, bool) or not isinstance(starting_version, int)
            or starting_version < 0
        ):
            raise PlanError(
                f"read_delta: starting_version must be a version number >= 0, "
                f"got {starting_version!r}"
            )
        check_batch_cap(max_files_per_batch, option="max_files_per_batch", reader="read_delta")
        self.starting_version = starting_version
        self.starting_timestamp_ms = (
            None if starting_timestamp is None else _instant_ms(starting_timestamp)
        )
        self.max_files_per_batch = max_files_per_batch
        self.ignore_changes = ignore_changes
        self.storage_options = dict(storage_options or {})
        self.log = DeltaLogStore(self.uri, self.storage_options)
        self._commits: dict[int, DeltaCommit] = {}
        self._schemas: dict[int, pl.Schema] = {}
        self._latest: int | None = None
        self._current_schema: pl.Schema | None = None

    def clone(self) -> DeltaSource:
        """A new source over the same table with the same options (its own caches),
        e.g. for a progress display that must not share the engine's instance."""
        copy = DeltaSource(
            self.uri, starting_version=self.starting_version,
            max_files_per_batch=self.max_files_per_batch, ignore_changes=self.ignore_changes,
            storage_options=self.storage_options,
        )
        copy.starting_timestamp_ms = self.starting_timestamp_ms
        return copy

    # -- identity ---------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """Kind, table URI and options (storage options are left out: secrets)."""
        return {
            "kind": self.kind,
            "path": self.uri,
            "starting_version": self.starting_version,
            "starting_timestamp_ms": self.starting_timestamp_ms,
            "max_files_per_batch": self.max_files_per_batch,
            "ignore_changes": self.ignore_changes,
        }

    def identity(self) -> dict[str, Any]:
        """Kind and table URI: offsets are positions in that table's log."""
        return {"kind": self.kind, "path": self.uri}

    @property
    def schema(self) -> pl.Schema | None:
        """The table's schema at its latest version (for batches without rows)."""
        if self._current_schema is None:
            latest = self.latest_version()
            if latest is not None:
                self._current_schema = self._schema_at(latest)
        return self._current_schema

    # -- lifecycle --------------------------------------------------------------

    def open(self, ctx: SourceContext) -> None:
        """Check that the table exists (its log has a commit)."""
        if self.latest_version() is None:
            raise SourceError(
                f"read_delta: there is no Delta table at {self.uri} (no commit files in "
                f"{LOG_DIR}/); create the table first, or fix the path"
            )

    def initial_offset(self) -> dict[str, int]:
        """``starting_version``, the version at ``starting_timestamp``, or version 0."""
        versions = self.log.versions()
        if not versions:
            raise SourceError(f"read_delta: there is no Delta table at {self.uri}")
        earliest, latest = versions[0], versions[-1]
        if self.starting_timestamp_ms is not None:
            return {"version": self._version_at(self.starting_timestamp_ms, earliest, latest),
                    "index": 0}
        start = self.starting_version if self.starting_version is not None else 0
        if start > latest:
            raise SourceError(
                f"read_delta({self.uri!r}): starting_version={start} is after the table's "
                f"latest version {latest}"
            )
        if start < earliest:
            raise SourceError(
                f"read_delta({self.uri!r}): the table's log starts at version {earliest} "
                f"(older commits were cleaned up), so version {start} cannot be replayed. "
                f"Pass starting_version={earliest} or later to read the changes from there "
                "(rows added before it are not read)."
            )
        return {"version": start, "index": 0}

    def latest_offset(self, start: Any, *, capped: bool = True) -> dict[str, int]:
        """The end of the next batch: up to ``max_files_per_batch`` new data files.

        Walks the versions after ``start``, skipping those without new rows.
        Unless ``ignore_changes``, a version that rewrites data ends a capped
        batch before it; when it is the first version to read (or the batch
        is uncapped) the range takes it whole and stops there, and
        :meth:`read` refuses that range with a :class:`SourceError`. So the
        rows before the rewrite are processed first, and the error surfaces
        when the stream reaches it (planning itself never fails: the engine
        may plan speculatively). Returns ``start`` when there is nothing new.
        """
        version, index = _check_offset(start, self.uri)
        latest = self.latest_version()
        cap = self.max_files_per_batch if capped else None
        taken = 0
        pos = (version, index)
        while latest is not None and pos[0] <= latest:
            commit = self.log_commit(pos[0])
            if commit.rewrites and not self.ignore_changes:
                if taken and capped:
                    break
                pos = (pos[0] + 1, 0)
                taken += 1
                break
            remaining = len(commit.files) - pos[1]
            if cap is not None and taken + remaining > cap:
                pos = (pos[0], pos[1] + cap - taken)
                taken = cap
                break
            taken += remaining
            pos = (pos[0] + 1, 0)
            if cap is not None and taken >= cap:
                break
        if taken == 0:
            return {"version": version, "index": index}
        return {"version": pos[0], "index": pos[1]}

    def compare(self, a: Any, b: Any) -> int:
        """Order of two positions: by version, then file index."""
        x, y = _check_offset(a, self.uri), _check_offset(b, self.uri)
        return (x > y) - (x < y)

    def read(self, start: Any, end: Any) -> SourceBatch:
        """The rows of exactly the data files in ``[start, end)``."""
        files, schema = self._files_and_schema(start, end)
        return self.read_files(files, schema)

    def read_splits(self, start: Any, end: Any, pieces: int) -> list[ReadSplit] | None:
        """The data files of ``[start, end)`` (from the commit files, no rows read)
        as ``pieces`` contiguous runs of about equal bytes (:class:`DeltaSplit`),
        each conformed to the schema of the range's last version, as :meth:`read`."""
        files, schema = self._files_and_schema(start, end)
        reader = self.clone()
        return [
            DeltaSplit(reader, tuple(files[lo:hi]), schema)
            for lo, hi in balanced_runs([f.size for _, f in files], pieces)
        ]

    def _files_and_schema(
        self, start: Any, end: Any
    ) -> tuple[list[tuple[int, DeltaFile]], pl.Schema]:
        """The range's data files, in log order, and the schema they are read with."""
        files = self.files_between(start, end)
        last_version = max(
            (v for v, _ in files), default=_check_offset(start, self.uri)[0]
        )
        return files, self._schema_at(max(last_version, 0))

    def read_files(
        self, files: Sequence[tuple[int, DeltaFile]], schema: pl.Schema
    ) -> SourceBatch:
        """The rows of ``(version, file)`` data files, in order, as ``schema``."""
        frames = [self._read_file(version, f, schema) for version, f in files]
        if not frames:
            return SourceBatch(schema.to_frame())
        return SourceBatch(pl.concat(frames, how="vertical"))

    # -- the log ----------------------------------------------------------------

    def latest_version(self) -> int | None:
        """The newest version; probes for commit files after the last one seen."""
        if self._latest is None:
            versions = self.log.versions()
            if not versions:
                return None
            self._latest = versions[-1]
        while self.log.exists(self._latest + 1):
            self._latest += 1
        return self._latest

    def log_commit(self, version: int) -> DeltaCommit:
        """The parsed commit of ``version`` (cached; commit files never change)."""
        commit = self._load_commit(version)
        if commit is None:
            raise SourceError(
                f"Delta table {self.uri}: the commit file of version {version} "
                f"({self.log.log_path(version)}) is gone (log cleanup after "
                "delta.logRetentionDuration?). A recorded batch cannot be replayed without it: "
                "restore it, or start the query on a new checkpoint with a later "
                "starting_version."
            )
        return commit

    def _load_commit(self, version: int) -> DeltaCommit | None:
        cached = self._commits.get(version)
        if cached is not None:
            return cached
        raw = self.log.read(version)
        if raw is None:
            return None
        commit = parse_commit(version, raw, where=self.log.log_path(version))
        if commit.timestamp_ms is None:
            commit = replace(commit, timestamp_ms=self.log.mtime_ms(version))
        self._commits[version] = commit
        return commit

    def files_between(
        self, start: Any, end: Any, *, strict: bool = True
    ) -> list[tuple[int, DeltaFile]]:
        """``(version, file)`` for every data file in ``[start, end)``, in log order.

        A version that rewrites data raises :class:`SourceError` (unless
        ``ignore_changes``); with ``strict=False`` it adds no files instead.
        """
        (v0, i0), (v1, i1) = _check_offset(start, self.uri), _check_offset(end, self.uri)
        out: list[tuple[int, DeltaFile]] = []
        for version in range(v0, v1 + 1):
            lo = i0 if version == v0 else 0
            if version == v1 and i1 == 0:
                break
            commit = self.log_commit(version)
            if commit.rewrites and not self.ignore_changes:
                if strict:
                    raise self._rewrite_error(commit)
                continue
            hi = i1 if version == v1 else len(commit.files)
            if hi > len(commit.files):
                raise SourceError(
                    f"Delta table {self.uri}: a recorded batch ends at file {hi} of version "
                    f"{version}, which added only {len(commit.files)} data files; the "
                    "checkpoint belongs to another table or the log was rewritten"
                )
            out.extend((version, f) for f in commit.files[lo:hi])
        return out

    backlog_unit = "versions"
    """What :meth:`progress_items` counts files by (``microbatch backfill``)."""

    def progress_items(self, start: Any, end: Any) -> list[tuple[int, int | None]]:
        """``(version, rows)`` of every data file in ``[start, end)``, in log order
        (rows from the file's statistics, ``None`` when not recorded)."""
        return [(version, f.rows) for version, f in self.files_between(start, end, strict=False)]

    def backlog(self, start: Any, end: Any) -> Backlog:
        """Versions with data, files and rows in ``[start, end)`` (for progress)."""
        files = self.files_between(start, end, strict=False)
        rows = [f.rows for _, f in files]
        return Backlog(
            versions=len({v for v, _ in files}),
            files=len(files),
            rows=None if any(r is None for r in rows) else sum(r or 0 for r in rows),
        )

    def _version_at(self, ts_ms: int, earliest: int, latest: int) -> int:
        """The first version committed at or after ``ts_ms`` (binary search; commit
        times increase with versions), or ``latest + 1``."""
        lo, hi = earliest, latest + 1
        while lo < hi:
            mid = (lo + hi) // 2
            stamp = self.log_commit(mid).timestamp_ms
            if stamp is not None and stamp >= ts_ms:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _schema_at(self, version: int) -> pl.Schema:
        """The table schema in force at ``version``: the newest ``metaData`` at or
        before it (walking back through commits), else delta-rs's view of it."""
        walked: list[int] = []
        schema: pl.Schema | None = None
        v = version
        while v >= 0 and len(walked) < SCHEMA_WALK_LIMIT:
            if v in self._schemas:
                schema = self._schemas[v]
                break
            commit = self._load_commit(v)
            if commit is None:  # cleaned up: ask delta-rs (it reads checkpoints)
                break
            if commit.schema is not None:
                schema = commit.schema
                break
            walked.append(v)
            v -= 1
        if schema is None:
            schema = self._load_schema(version)
        for w in [*walked, version]:
            self._schemas[w] = schema
        return schema

    def _load_schema(self, version: int) -> pl.Schema:
        """delta-rs's view of the schema at ``version`` (it reads checkpoints). When
        that version cannot be loaded any more (its log was cleaned up), the
        latest schema is used: columns added since are then null in the batch."""
        import pyarrow as pa
        from deltalake import DeltaTable

        options = self.storage_options or None
        try:
            table = DeltaTable(self.uri, version=version, storage_options=options)
        except Exception as exc:
            log.warning("Delta table %s: version %d cannot be loaded (%s); reading it with "
                        "the latest schema", self.uri, version, str(exc).splitlines()[:1])
            try:
                table = DeltaTable(self.uri, storage_options=options)
            except Exception as again:
                raise SourceError(
                    f"Delta table {self.uri}: cannot load the schema of version {version}: "
                    f"{again}"
                ) from again
        arrow = pa.schema(table.schema().to_arrow())
        return pl.DataFrame(arrow.empty_table()).schema

    # -- reading ----------------------------------------------------------------

    def _read_file(self, version: int, file: DeltaFile, schema: pl.Schema) -> pl.DataFrame:
        location = self.log.data_path(file.path)
        try:
            frame = pl.read_parquet(location, storage_options=self.storage_options or None)
        except FileNotFoundError:
            raise self._missing_file(version, file) from None
        except (pl.exceptions.PolarsError, OSError) as exc:
            if "not found" in str(exc).lower() or "no such file" in str(exc).lower():
                raise self._missing_file(version, file) from exc
            raise SourceError(
                f"Delta table {self.uri}: cannot read data file {file.path} of version "
                f"{version}: {exc}"
            ) from exc
        values = dict(file.partition_values)
        columns: list[pl.Expr] = []
        for name, dtype in schema.items():
            if name in values:
                columns.append(_partition_literal(values[name], dtype, name))
            elif name in frame.columns:
                columns.append(pl.col(name).cast(dtype))
            else:
                columns.append(pl.lit(None, dtype).alias(name))
        try:
            return frame.with_columns(columns).select(list(schema))
        except pl.exceptions.PolarsError as exc:
            raise SourceError(
                f"Delta table {self.uri}: data file {file.path} of version {version} does not "
                f"fit the table schema {dict(schema)}: {exc}"
            ) from exc

    def _missing_file(self, version: int, file: DeltaFile) -> SourceError:
        return SourceError(
            f"Delta table {self.uri}: data file {file.path} added by version {version} is "
            "gone (removed by VACUUM?). A recorded batch cannot be replayed without it: "
            "restore it, or start the query on a new checkpoint with a later starting_version."
        )

    def _rewrite_error(self, commit: DeltaCommit) -> SourceError:
        return SourceError(
            f"Delta table {self.uri}: version {commit.version} ({commit.operation}) removes or "
            f"rewrites data ({commit.removed} file(s) removed), which a stream of appended "
            "rows cannot follow; the stream stops here (earlier versions were read). To go "
            "on, restart with ignore_changes=True passed to read_delta "
            "(the rows of rewritten files are emitted "
            "again, so unchanged rows appear twice downstream), or start a new checkpoint "
            f"with starting_version={commit.version + 1}. To follow deletes and updates, "
            "read the table's change feed instead: read_delta(path, changes=True) (the "
            "table needs delta.enableChangeDataFeed=true)."
        )


@dataclass(frozen=True)
class DeltaSplit(ReadSplit):
    """A contiguous run of a batch's data files (with the version that added
    each), read where it is sent with the schema the driver planned: the same
    rows and columns as the driver's read of them."""

    reader: DeltaSource
    files: tuple[tuple[int, DeltaFile], ...]
    schema: pl.Schema

    def read(self) -> SourceBatch:
        return self.reader.read_files(self.files, self.schema)

    @property
    def size_hint(self) -> int:
        return sum(f.size for _, f in self.files)


def _check_offset(offset: Any, uri: str) -> tuple[int, int]:
    if (
        isinstance(offset, dict)
        and isinstance(offset.get("version"), int)
        and isinstance(offset.get("index"), int)
        and offset["version"] >= 0
        and offset["index"] >= 0
    ):
        return offset["version"], offset["index"]
    raise SourceError(
        f"Delta source {uri}: offset {offset!r} is not a {{'version': v, 'index': i}} "
        "position; was the checkpoint written by another kind of source?"
    )


def _instant_ms(value: datetime | str, *, reader: str = "read_delta") -> int:
    """``value`` (a datetime, naive meaning UTC, or ISO-8601 text) in epoch ms;
    :class:`PlanError` naming ``reader`` when it is neither."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError as exc:
            raise PlanError(
                f"{reader}: starting_timestamp {value!r} is not an ISO-8601 time"
            ) from exc
    if not isinstance(value, datetime):
        raise PlanError(
            f"{reader}: starting_timestamp must be a datetime or ISO-8601 string, "
            f"got {value!r}"
        )
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return int(value.timestamp() * 1000)


def _partition_literal(text: str | None, dtype: pl.DataType, name: str) -> pl.Expr:
    """A partition value as Delta serializes it, typed (timestamps are UTC)."""
    if text is None:
        return pl.lit(None, dtype).alias(name)
    raw = pl.lit(text, pl.String)
    if dtype == pl.String:
        return raw.alias(name)
    if isinstance(dtype, pl.Datetime):
        parsed = (
            raw.str.replace("T", " ").str.replace("Z$", "")
            .str.to_datetime("%Y-%m-%d %H:%M:%S%.f", time_unit=dtype.time_unit or "us")
        )
        if dtype.time_zone:
            parsed = parsed.dt.replace_time_zone("UTC").dt.convert_time_zone(dtype.time_zone)
        return parsed.alias(name)
    if dtype == pl.Date:
        return raw.str.to_date("%Y-%m-%d").alias(name)
    if dtype == pl.Boolean:
        return (raw.str.to_lowercase() == "true").alias(name)
    if dtype == pl.Binary:
        return raw.cast(pl.Binary).alias(name)
    return raw.cast(dtype).alias(name)
