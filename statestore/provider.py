"""StateStoreProvider: hands out the store for a version and owns its files.

Recovery rule (what ``load(v)`` does)::

    if the in-memory store is exactly committed version v (nothing staged):
        return it                                   # steady state, O(1)
    chain = newest snapshot s <= v, changelogs s+1..v   # StateCorruptError if a file is missing
    store = empty; store += snapshot s; replay each changelog (deletes, then upserts)
    delete the files of every version > v            # an abandoned future
    return store

``commit()`` writes ``changelog/<v+1>.arrow`` (the commit point), then maybe a
snapshot, then purges files no longer needed for the newest
``retention_versions`` versions. A snapshot is written when the changelog bytes
written since the last snapshot reach that snapshot's size (at least
``min_snapshot_bytes``) or the chain reaches ``max_changelog_chain``: the
O(state) snapshot is paid for by as many bytes of O(batch) changelogs, so no
commit is O(state) on average, and a rebuild reads at most ~2x the state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import polars as pl

from statestore.buffer import AppendBuffer
from statestore.exceptions import StateStoreError
from statestore.files import VersionFiles, read_arrow, write_arrow
from statestore.schema import StateSchema
from statestore.store import StateStore

Compression = Literal["zstd", "lz4", "uncompressed"]
Layout = Literal["keyed", "append"]


class StateStoreProvider:
    """The versioned state of one stateful operator, kept under ``directory``.

    Guarantees: ``load(v)`` returns exactly committed version ``v`` or raises
    StateCorruptError naming what is missing or damaged; only committed versions
    survive a crash or an abort; committing a version again replaces it
    atomically. One provider (one process) may write a directory at a time.

    Parameters
    ----------
    directory
        Where the versions live; created if missing.
    key_schema, value_schema
        Column name → Polars dtype of the key and of the value columns.
    time_column
        A key or value column (integer, Datetime or Date) that ``pop_expired``
        compares against.
    retention_versions
        How many of the newest committed versions stay loadable.
    compression
        Arrow IPC compression of the files (lz4 by default: the commit is on every
        batch's path, and lz4 writes about a third faster than zstd).
    max_changelog_chain, min_snapshot_bytes
        Snapshot policy (see the module docstring).
    layout
        ``"keyed"`` (default): a :class:`StateStore`, one row per key, from
        :meth:`load`. ``"append"``: an :class:`~statestore.buffer.AppendBuffer`
        (rows as appended, popped by ``time_column``), from :meth:`load_buffer`.
    added_values
        Value columns added to the schema after some versions were written: they
        read as nulls from older files (schema evolution by added nullable columns).
    read_only
        An offline reader (:meth:`read_version`) beside a job that may be
        running: nothing is created, no file is deleted (not even the versions
        newer than the one read, nor temp files), and nothing can be committed.
    """

    def __init__(
        self,
        directory: str | Path,
        key_schema: dict[str, pl.DataType],
        value_schema: dict[str, pl.DataType],
        *,
        time_column: str | None = None,
        retention_versions: int = 100,
        compression: Compression = "lz4",
        max_changelog_chain: int = 100,
        min_snapshot_bytes: int = 1 << 20,
        added_values: Sequence[str] = (),
        layout: Layout = "keyed",
        read_only: bool = False,
        _hash_bits: int = 64,
    ) -> None:
        if retention_versions < 1:
            raise StateStoreError(f"retention_versions must be >= 1, got {retention_versions}")
        if max_changelog_chain < 1:
            raise StateStoreError(f"max_changelog_chain must be >= 1, got {max_changelog_chain}")
        if compression not in ("zstd", "lz4", "uncompressed"):
            raise StateStoreError(
                f"compression must be 'zstd', 'lz4' or 'uncompressed', got {compression!r}"
            )
        self.directory = Path(directory)
        self.schema = StateSchema.build(key_schema, value_schema, time_column)
        self.retention_versions = retention_versions
        self._compression = None if compression == "uncompressed" else compression
        self._max_chain = max_changelog_chain
        self._min_snapshot_bytes = min_snapshot_bytes
        self._hash_bits = _hash_bits
        unknown = [c for c in added_values if c not in value_schema]
        if unknown:
            raise StateStoreError(f"added_values {unknown} are not value columns")
        self._added = tuple(added_values)
        if layout not in ("keyed", "append"):
            raise StateStoreError(f"layout must be 'keyed' or 'append', got {layout!r}")
        if layout == "append" and time_column is None:
            raise StateStoreError("layout='append' needs a time_column (what pops rows)")
        self.layout = layout
        self.read_only = read_only
        self._files = VersionFiles(self.directory, read_only=read_only)
        self._store: StateStore | AppendBuffer | None = None
        # Snapshot policy, restored from the chain on every rebuild.
        self._snapshot_bytes = 0
        self._since_snapshot = 0
        self._chain_length = 0

    def latest_version(self) -> int:
        """Newest committed version on disk (0 when none)."""
        return self._files.latest()

    def committed_versions(self) -> list[int]:
        """The versions >= 1 that :meth:`read_version` can rebuild now, ascending
        (a snapshot, or a changelog on top of a rebuildable version; version 0,
        the empty state, needs no file and is always readable)."""
        files = self._files
        snapshots = set(files.versions("snapshot"))
        changelogs = set(files.versions("changelog"))
        out: list[int] = []
        for v in range(1, files.latest() + 1):
            if v in snapshots or (v in changelogs and (v == 1 or (out and out[-1] == v - 1))):
                out.append(v)
        return out

    def read_version(self, version: int) -> pl.DataFrame:
        """Every row of committed ``version`` (key, value columns; an append
        buffer's rows in arrival order), rebuilt from disk without touching it.

        Needs no lock and deletes nothing (see ``read_only``); raises
        StateCorruptError, as :meth:`load`, naming a missing or damaged file.
        O(state).
        """
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise StateStoreError(f"read_version({version!r}): the version must be an int >= 0")
        store = self._rebuild(version, discard=False)
        try:
            return store.to_frame()
        finally:
            store.close("it was read by read_version")

    def begin_at(self, version: int) -> None:
        """Make ``version`` hold the empty state in a directory without versions.

        For an operator defined in batch ``version`` rather than batch 0 (its
        input had no columns before: a source without a declared schema whose
        first batches were all dead letters): batch N loads version N, so
        version ``version`` must exist. Writes an empty snapshot durably; a no-op
        when any version is already committed (a batch re-run after a crash).
        Call it before recording the operator's schema, which makes the store
        exist on a restart.
        """
        self._check_writable()
        if version <= 0 or self._files.latest() > 0:
            return
        write_arrow(
            self._files.path("snapshot", version),
            pl.DataFrame(schema=self.schema.polars_schema),
            kind="snapshot",
            version=version,
            compression=self._compression,
        )

    def load(self, version: int) -> StateStore:
        """The store holding committed ``version`` (0: the empty state).

        O(1) when the in-memory store is exactly that version; otherwise it is
        rebuilt from disk and the files of newer versions are deleted.
        """
        self._check_writable()
        if self.layout != "keyed":
            raise StateStoreError("this provider keeps an append buffer: call load_buffer()")
        store = self._load(version)
        assert isinstance(store, StateStore)
        return store

    def load_buffer(self, version: int) -> AppendBuffer:
        """The append buffer (``layout="append"``) holding committed ``version``;
        costs as :meth:`load`."""
        self._check_writable()
        if self.layout != "append":
            raise StateStoreError("this provider keeps a keyed store: call load()")
        store = self._load(version)
        assert isinstance(store, AppendBuffer)
        return store

    def _check_writable(self) -> None:
        if self.read_only:
            raise StateStoreError(
                f"the provider of {self.directory} is read-only (an offline reader): use "
                "read_version(), or open it without read_only=True to run batches"
            )

    def _load(self, version: int) -> StateStore | AppendBuffer:
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise StateStoreError(f"load({version!r}): the version must be an int >= 0")
        started = time.perf_counter()
        store = self._store
        if store is not None and store.holds_committed(version):
            store.begin_batch((time.perf_counter() - started) * 1000)
            return store
        if store is not None:
            store.close(f"provider.load({version}) replaced it")
            self._store = None
        store = self._rebuild(version)
        self._store = store
        store.begin_batch((time.perf_counter() - started) * 1000)
        return store

    def _rebuild(self, version: int, *, discard: bool = True) -> StateStore | AppendBuffer:
        files, schema = self._files, self.schema.polars_schema
        chain = files.chain(version)
        if chain.snapshot:
            frame = read_arrow(
                files.path("snapshot", chain.snapshot),
                kind="snapshot",
                version=chain.snapshot,
                schema=schema,
                added=self._added,
            )
        else:
            frame = pl.DataFrame(schema=schema)
        store: StateStore | AppendBuffer
        if self.layout == "append":
            store = AppendBuffer(self, self.schema, version)
        else:
            store = StateStore(
                self, self.schema, version, hash_bits=self._hash_bits, expected_rows=frame.height
            )
        store.load_rows(frame)
        del frame
        for v in chain.changelogs:
            path = files.path("changelog", v)
            store.apply_changelog(
                read_arrow(path, kind="changelog", version=v, schema=schema, added=self._added)
            )
        if not discard:
            return store
        if files.latest() > version:
            files.discard_after(version)
        self._snapshot_bytes = files.size("snapshot", chain.snapshot) if chain.snapshot else 0
        self._since_snapshot = sum(files.size("changelog", v) for v in chain.changelogs)
        self._chain_length = len(chain.changelogs)
        return store

    def write_version(
        self,
        owner: object,
        version: int,
        changelog: pl.DataFrame,
        snapshot: Callable[[], pl.DataFrame],
    ) -> tuple[int, bool]:
        """Write ``version``'s files; return (changelog bytes, snapshot written).

        Called by ``owner.commit()`` (see :mod:`statestore.contract`)."""
        if owner is not self._store:
            raise StateStoreError(
                f"cannot commit version {version}: this store is no longer the provider's "
                "current one; call provider.load(version) again"
            )
        files = self._files
        written = write_arrow(
            files.path("changelog", version),
            changelog,
            kind="changelog",
            version=version,
            compression=self._compression,
        )
        self._since_snapshot += written
        self._chain_length += 1
        threshold = max(self._snapshot_bytes, self._min_snapshot_bytes)
        due = self._chain_length >= self._max_chain or self._since_snapshot >= threshold
        if due:
            self._snapshot_bytes = write_arrow(
                files.path("snapshot", version),
                snapshot(),
                kind="snapshot",
                version=version,
                compression=self._compression,
            )
            self._since_snapshot = self._chain_length = 0
        files.purge(version, self.retention_versions)
        return written, due

    def release(self, owner: object) -> None:
        """Drop the in-memory copy after an abort or failed commit (called by
        ``owner``; see :mod:`statestore.contract`)."""
        if self._store is owner:
            self._store = None
