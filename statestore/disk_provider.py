"""The provider of the on-disk backend: the version rule over an LMDB database.

The Arrow files stay the durable record, exactly as with the in-memory store
(``changelog/<v>.arrow`` per version, ``snapshot/<v>.arrow`` by the same
policy, written through :mod:`statestore.durable`, so the crash explorer sees
them). The database under ``lmdb/`` holds the rows of one version, and says
which: its version and the checksum of that version's file, committed in the
same LMDB transaction as the rows. It is a materialized view of the files:

Recovery rule (what ``load(v)`` does)::

    if the open store is exactly committed version v: return it        # steady state
    chain = newest snapshot s <= v, changelogs s+1..v      # StateCorruptError if missing
    d = the database's version (None: absent, damaged, other schema, mid-rebuild)
    if d == v and its checksum is version v's file's:     use it as is
    elif d > v: step back d -> v with the kept before-images (the last 3 versions)
    elif d < v, same lineage, changelogs d+1..v on disk: roll forward, replaying them
    otherwise: empty it, stream snapshot s in chunks, replay the changelogs   # rebuild
    delete the files of every version > v                  # after the database moved

``commit()``: the changelog file (durable: the commit point), then the LMDB
transaction (rows, version marker, before-images), then maybe a snapshot
streamed from a read transaction in chunks, then the purge. A crash between
the file and the transaction leaves the database one version behind: the next
load rolls it forward (or discards the file, when the commit log says the
batch did not commit). The checksum in the marker ties the database to the
files: a state directory restored from a backup, or files rewritten by the
in-memory backend, never reuse a database of another history.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import polars as pl

from statestore.disk import DiskStateStore, LmdbState, fingerprint
from statestore.exceptions import StateStoreError
from statestore.files import file_digest, iter_arrow, read_arrow, write_arrow, write_arrow_chunks
from statestore.provider import StateStoreProvider
from statestore.store import StateStore

__all__ = ["DiskStateStoreProvider"]

log = logging.getLogger("statestore")

REBUILD_COMMIT_ROWS = 1 << 20
"""A rebuild commits its transaction every this many rows (bounded dirty pages)."""


class DiskStateStoreProvider(StateStoreProvider):
    """A :class:`~statestore.StateStoreProvider` whose keyed store lives in LMDB.

    Guarantees: those of the in-memory provider (``load(v)`` returns exactly
    committed version ``v`` or raises StateCorruptError; only committed versions
    survive a crash or an abort), with the same files on disk, so an offline
    reader (``read_version``) or the in-memory backend reads them unchanged.
    ``layout="append"`` is refused: append buffers stay in memory.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        if self.layout != "keyed":
            raise StateStoreError(
                "the disk backend keeps keyed stores; append buffers stay in memory"
            )
        self._db: LmdbState | None = None
        self.rebuilds = 0
        """How often a load had to rebuild the database from the files (tests, metrics)."""

    def _database(self) -> LmdbState:
        if self._db is None:
            self._db = LmdbState.acquire(self.directory, fingerprint(self.schema))
        return self._db

    def close(self) -> None:
        """Close the database (a later load opens it again)."""
        if self._store is not None:
            self._store.close("the provider was closed")
            self._store = None
        if self._db is not None:
            self._db.release()
            self._db = None

    def load(self, version: int) -> StateStore:
        """The store holding committed ``version`` (see the module's recovery rule)."""
        self._check_writable()
        return self._load(version)

    def _load(self, version: int) -> StateStore:
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise StateStoreError(f"load({version!r}): the version must be an int >= 0")
        started = time.perf_counter()
        store = self._store
        if store is not None and store.holds_committed(version):
            store.begin_batch((time.perf_counter() - started) * 1000)
            return store  # type: ignore[return-value]
        if store is not None:
            store.close(f"provider.load({version}) replaced it")
            self._store = None
        disk = self._open_at(version)
        self._store = disk  # type: ignore[assignment]
        disk.begin_batch((time.perf_counter() - started) * 1000)
        return disk  # type: ignore[return-value]

    def _digest(self, version: int) -> str:
        if version == 0:
            return ""
        files = self._files
        path = files.path("changelog", version)
        if path.exists():
            return file_digest(path)
        return file_digest(files.path("snapshot", version))

    def _open_at(self, version: int) -> DiskStateStore:
        files = self._files
        chain = files.chain(version)  # StateCorruptError when a file is missing
        db = self._database()
        want = (version, self._digest(version))
        at = db.version()
        if at is not None and at != want:
            self._move(db, at, version)
            moved = db.version()
            if moved == want:
                log.info("state database %s moved from version %d to %d", db.path, at[0],
                         version)
            at = moved
        if at != want:
            log.log(logging.INFO if version else logging.DEBUG,
                    "state database %s rebuilt at version %d from the files (it was at %s)",
                    db.path, version, "nothing" if at is None else at[0])
            self._rebuild_db(db, chain.snapshot, chain.changelogs, version)
        if files.latest() > version:
            files.discard_after(version)
        self._snapshot_bytes = files.size("snapshot", chain.snapshot) if chain.snapshot else 0
        self._since_snapshot = sum(files.size("changelog", v) for v in chain.changelogs)
        self._chain_length = len(chain.changelogs)
        return DiskStateStore(self, self.schema, version, db)

    def _move(self, db: LmdbState, at: tuple[int, str], version: int) -> None:
        """Step the database from ``at`` toward ``version`` with before-images (back) or
        changelogs (forward); stops where it cannot (the caller then rebuilds)."""
        current, digest = at
        if digest != self._digest(current):
            return  # another history (or its file is gone): rebuild
        if current > version:
            while current > version:
                store = DiskStateStore(self, self.schema, current, db)
                if not store.apply_undo(current - 1, self._digest(current - 1)):
                    return
                current -= 1
            return
        have = set(self._files.versions("changelog"))
        if any(v not in have for v in range(current + 1, version + 1)):
            return
        store = DiskStateStore(self, self.schema, current, db)
        for v in range(current + 1, version + 1):
            path = self._files.path("changelog", v)
            frame = read_arrow(path, kind="changelog", version=v,
                               schema=self.schema.polars_schema, added=self._added)
            store.apply_changelog(frame)
            store.finish_rebuild(v, self._digest(v))

    def _rebuild_db(
        self, db: LmdbState, snapshot: int, changelogs: tuple[int, ...], version: int
    ) -> None:
        """Empty the database and load ``version`` from the files, one chunk in memory."""
        self.rebuilds += 1
        db.clear()
        store = DiskStateStore(self, self.schema, version, db)
        schema = self.schema.polars_schema
        if snapshot:
            pending = 0
            for chunk in iter_arrow(self._files.path("snapshot", snapshot), kind="snapshot",
                                    version=snapshot, schema=schema, added=self._added):
                store.load_chunk(chunk)
                pending += chunk.height
                if pending >= REBUILD_COMMIT_ROWS:
                    store.finish_rebuild(None, "")
                    pending = 0
        for v in changelogs:
            store.apply_changelog(read_arrow(self._files.path("changelog", v), kind="changelog",
                                             version=v, schema=schema, added=self._added))
        store.finish_rebuild(version, self._digest(version))

    def write_version(
        self,
        owner: object,
        version: int,
        changelog: pl.DataFrame,
        snapshot: Callable[[], pl.DataFrame],
    ) -> tuple[int, bool]:
        """The changelog file, then the database transaction, then maybe a snapshot
        streamed from the database; return (changelog bytes, snapshot written)."""
        if owner is not self._store or not isinstance(owner, DiskStateStore):
            raise StateStoreError(
                f"cannot commit version {version}: this store is no longer the provider's "
                "current one; call provider.load(version) again"
            )
        files = self._files
        path = files.path("changelog", version)
        written = write_arrow(path, changelog, kind="changelog", version=version,
                              compression=self._compression)
        owner.commit_db(version, file_digest(path))
        self._since_snapshot += written
        self._chain_length += 1
        threshold = max(self._snapshot_bytes, self._min_snapshot_bytes)
        due = self._chain_length >= self._max_chain or self._since_snapshot >= threshold
        if due:
            self._snapshot_bytes = write_arrow_chunks(
                files.path("snapshot", version), self.schema.polars_schema, owner.iter_rows(),
                kind="snapshot", version=version, compression=self._compression,
            )
            self._since_snapshot = self._chain_length = 0
        files.purge(version, self.retention_versions)
        return written, due
