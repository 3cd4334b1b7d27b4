"""The on-disk keyed store: rows in an LMDB database, one version at a time.

:class:`DiskStateStore` has the API and guarantees of
:class:`~statestore.StateStore` (lookup, upsert, delete, pop_expired,
next_time, evict, to_frame; commit or abort) but keeps its rows in an embedded
LMDB database under ``<store>/lmdb/`` instead of numpy arrays, so the state may
be larger than memory: the process holds the batch and the pages LMDB maps in
(the kernel's page cache, which it reclaims), not the state.

Every operation is vectorized over its argument: keys and values are encoded
column-wise (:mod:`statestore.codec`) into one ``bytes`` per row and handed to
LMDB's C calls in one pass (``Cursor.putmulti``; ``get``/``delete`` mapped over
the list by C, with no Python bytecode per row).

Database layout (sub-databases of one environment)::

    rows    key bytes -> value bytes               the rows of the version
    time    time (8 bytes, big-endian, sign-flipped) -> key bytes   (dupsort)
    undo<i> key bytes -> b"\\0" | b"\\1" + value    before-images of a version
    meta    version, the digest of that version's file, codec, schema

A batch's changes go into one LMDB write transaction (read-your-writes inside
it); ``commit()`` writes the Arrow changelog file first (the durable record,
through :mod:`statestore.durable`), then commits the transaction with the new
version marker and the before-images of every touched key, so the database
can also step back (see :class:`~statestore.disk_provider.DiskStateStoreProvider`).
``abort()`` aborts the transaction: the database never holds staged rows.

The time index is lazy: an upsert adds an entry at the row's time and never
removes the old one; ``pop_expired(t)`` reads the entries up to ``t``, pops
the rows whose *current* time is <= t and drops every entry it read (an entry
of a row that moved on is stale).
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import polars as pl

from statestore.codec import CODEC_VERSION, MAX_KEY_BYTES, RowCodec, binary_parts, with_flag
from statestore.contract import VersionKeeper
from statestore.exceptions import StateStoreError
from statestore.schema import FOUND_COLUMN, OP_COLUMN, StateSchema, lookup_for_upsert
from statestore.versioned import VersionedState

if TYPE_CHECKING:
    import lmdb

__all__ = ["DiskStateStore", "LmdbState", "import_lmdb"]

OP_UPSERT = 0
OP_DELETE = 1
UNDO_SLOTS = 3
"""Versions the database can step back (a pipelined run leaves at most two
batches uncommitted)."""
CHUNK = 1 << 16
"""Rows per chunk when the whole state is read (snapshots, evict, rebuilds)."""
_SIGN = np.uint64(1 << 63)
_NO_TIME = np.iinfo(np.int64).min
MAP_MIN = 4 << 30
"""The database's first map size (address space, not memory or disk: the file is
sparse); doubled before a transaction whenever half of it is used."""


def import_lmdb() -> Any:
    """The ``lmdb`` module, or StateStoreError naming the extra that installs it."""
    try:
        import lmdb
    except ImportError as exc:  # pragma: no cover - the extra is installed by make test
        raise StateStoreError(
            "state_backend='lmdb' (or 'disk') needs the lmdb package: pip install "
            "'microbatch[disk]' (or pip install lmdb), or use state_backend='memory'"
        ) from exc
    return lmdb


def time_bytes(times: np.ndarray) -> list[bytes]:
    """Int64 times as 8 big-endian bytes whose byte order is the numeric order."""
    flipped = (times.astype(np.int64).view(np.uint64) ^ _SIGN).astype(">u8")
    return flipped.view("V8").tolist()  # type: ignore[no-any-return]


def times_of(items: list[bytes]) -> np.ndarray:
    """The int64 times of :func:`time_bytes` output."""
    raw = np.frombuffer(b"".join(items), dtype=">u8").astype(np.uint64)
    return (raw ^ _SIGN).view(np.int64)


def _key_order(keys: list[bytes]) -> np.ndarray | None:
    """The permutation that sorts ``keys`` bytewise (LMDB's order), or None when
    they are sorted or few: B-tree operations in key order touch each page once."""
    if len(keys) < 64:
        return None
    series = pl.Series(keys, dtype=pl.Binary)
    if series.is_sorted():
        return None
    return series.arg_sort().to_numpy()


def _take(items: list[Any], order: np.ndarray) -> list[Any]:
    """``items`` permuted by ``order`` (numpy over an object array: no Python loop)."""
    arr = np.empty(len(items), dtype=object)
    arr[:] = items
    return arr[order].tolist()  # type: ignore[no-any-return]


def _chunks(it: Iterator[Any], first: int = 1024) -> Iterator[list[Any]]:
    size = first
    while True:
        chunk = list(itertools.islice(it, size))
        if not chunk:
            return
        yield chunk
        size = min(size * 4, CHUNK)


class LmdbState:
    """The LMDB environment of one store directory and its sub-databases.

    Guarantees: a committed transaction survives a crash of the process (LMDB
    fsyncs on commit); ``version()`` is the version whose rows the database
    holds, ``None`` while a rebuild is under way or when written by another
    codec or schema (the caller then rebuilds from the Arrow files).
    """

    _open: ClassVar[dict[Path, LmdbState]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def acquire(cls, directory: Path, fingerprint: str) -> LmdbState:
        """The environment of ``directory``, shared by every provider of it in this
        process (LMDB allows one per process); :meth:`release` when done."""
        path = (directory / "lmdb").resolve()
        with cls._lock:
            state = cls._open.get(path)
            if state is None:
                state = cls._open[path] = cls(path)
            state.users += 1
        state.fingerprint = fingerprint.encode()
        return state

    def __init__(self, path: Path) -> None:
        lmdb = import_lmdb()
        self.path = path
        self.users = 0
        self.fingerprint = b""
        self.writer: Any = None
        """The store whose write transaction is open (one at a time)."""
        path.mkdir(parents=True, exist_ok=True)
        try:
            self.env = lmdb.open(
                str(path), map_size=MAP_MIN, max_dbs=4 + UNDO_SLOTS, readahead=False,
                max_readers=64,
            )
        except lmdb.Error as exc:
            raise StateStoreError(
                f"cannot open the state database {path}: {exc}. It is a cache of the "
                "Arrow files beside it: delete the lmdb directory and the state is rebuilt."
            ) from exc
        self.rows = self.env.open_db(b"rows")
        self.time = self.env.open_db(b"time", dupsort=True)
        self.meta = self.env.open_db(b"meta")
        self.undo = [self.env.open_db(f"undo{i}".encode()) for i in range(UNDO_SLOTS)]

    def release(self) -> None:
        """One provider less; the environment closes with the last one."""
        with self._lock:
            self.users -= 1
            if self.users > 0:
                return
            self._open.pop(self.path, None)
        if self.writer is not None:
            self.writer.close("its database was closed")
        self.env.close()

    def version(self) -> tuple[int, str] | None:
        """(version, digest of its file) the rows are at, or None (rebuild)."""
        with self.env.begin(db=self.meta) as txn:
            if txn.get(b"fingerprint") != self.fingerprint:
                return None
            raw = txn.get(b"version")
            digest = txn.get(b"digest") or b""
        return None if raw is None else (int(raw), digest.decode())

    def set_version(self, txn: lmdb.Transaction, version: int | None, digest: str) -> None:
        """Mark, in ``txn``, the rows as ``version`` whose file has ``digest`` (None:
        a rebuild under way)."""
        if version is None:
            txn.delete(b"version", db=self.meta)
        else:
            txn.put(b"version", str(version).encode(), db=self.meta)
        txn.put(b"digest", digest.encode(), db=self.meta)
        txn.put(b"fingerprint", self.fingerprint, db=self.meta)

    def undo_version(self, slot: int) -> int | None:
        """The version whose before-images undo slot ``slot`` holds, if any."""
        with self.env.begin(db=self.meta) as txn:
            raw = txn.get(f"undo{slot}".encode())
        return None if raw is None else int(raw)

    def clear(self) -> None:
        """Empty every sub-database and forget the version (the start of a rebuild)."""
        with self.env.begin(write=True) as txn:
            for db in (self.rows, self.time, *self.undo):
                txn.drop(db, delete=False)
            txn.drop(self.meta, delete=False)
            txn.put(b"fingerprint", self.fingerprint, db=self.meta)

    def grow(self) -> None:
        """Double the map size when half of it is used (no transaction may be open)."""
        used, size = self.disk_bytes(), int(self.env.info()["map_size"])
        if used * 2 > size:
            self.env.set_mapsize(max(size * 2, used * 4))

    def disk_bytes(self) -> int:
        """The database's size: the pages in use (a file may be larger)."""
        info, stat = self.env.info(), self.env.stat()
        return int((info["last_pgno"] + 1) * stat["psize"])


class DiskStateStore(VersionedState):
    """The state as of ``version`` plus the changes staged since, in LMDB.

    Guarantees: those of :class:`~statestore.StateStore` (read-your-writes;
    ``commit()`` makes the changes durable as ``version + 1``; ``abort()`` or a
    failed commit discards them and closes the store). Memory held: the batch's
    keys, values and touched keys; never the state's rows (only ``to_frame``
    and ``evict``, O(state), read them all, ``evict`` in chunks).
    """

    _kind = "disk state"

    def __init__(
        self, provider: VersionKeeper, schema: StateSchema, version: int, db: LmdbState
    ) -> None:
        super().__init__(provider, version)
        self._schema = schema
        self._db = db
        self._keys = RowCodec(schema.keys, what="key", ordered=True)
        self._values = RowCodec(schema.values, what="value")
        self._time_name = schema.time_column
        self._txn: Any = None
        self._base: Any = None  # read transaction at the committed version: before-images
        # the batch's mutations in order: (encoded keys, encoded values or None: deleted)
        self._touched: list[tuple[list[bytes], list[bytes] | None]] = []
        # lookups made before any mutation: the committed values (before-images)
        self._seen: list[tuple[list[bytes], list[bytes | None]]] = []
        self._mutations = 0
        self._last_lookup: tuple[int, list[bytes]] | None = None
        self._counts = {"upserted": 0, "deleted": 0, "rows_read": 0, "rows_written": 0}
        self._thread = 0
        self._before: tuple[list[bytes], list[bytes | None]] | None = None
        self._lookup_times: np.ndarray | None = None

    # ------------------------------------------------------------ txn

    def _write(self) -> Any:
        if self._txn is None:
            other = self._db.writer
            if other is not None and other is not self:
                if other._thread != threading.get_ident():
                    raise StateStoreError(
                        f"the state database {self._db.path} is being written by another "
                        "store in another thread: one query at a time may run on a checkpoint"
                    )
                other.close("another store of the same directory started writing")
            self._db.grow()
            self._base = self._db.env.begin(write=False)
            self._txn = self._db.env.begin(write=True)
            self._thread = threading.get_ident()
            self._db.writer = self
        return self._txn

    def _end(self, commit: bool) -> None:
        txn, base = self._txn, self._base
        self._txn = self._base = None
        if self._db.writer is self:
            self._db.writer = None
        if base is not None:
            base.abort()
        if txn is not None:
            if commit:
                txn.commit()
            else:
                txn.abort()

    # ------------------------------------------------------------ reads

    @property
    def num_rows(self) -> int:
        """Number of live rows, staged changes included. O(1)."""
        self._check_open()
        return self._entries()

    def _entries(self) -> int:
        if self._txn is not None:
            return int(self._txn.stat(self._db.rows)["entries"])
        with self._db.env.begin() as txn:
            return int(txn.stat(self._db.rows)["entries"])

    def _encode_keys(self, keys: pl.DataFrame) -> list[bytes]:
        encoded = self._keys.encode(keys)
        if keys.height and max(map(len, encoded)) > MAX_KEY_BYTES:
            raise StateStoreError(
                f"a key of the state is longer than {MAX_KEY_BYTES} bytes encoded (the disk "
                "backend's limit, from LMDB): use state_backend='memory', or a shorter key "
                "(e.g. a hash of a long string)"
            )
        return encoded

    def _get(self, keys: list[bytes]) -> list[bytes | None]:
        txn = self._write()
        self._counts["rows_read"] += len(keys)
        order = _key_order(keys)
        if order is None:
            return list(map(functools.partial(txn.get, db=self._db.rows), keys))
        got = np.empty(len(keys), dtype=object)
        got[order] = list(map(functools.partial(txn.get, db=self._db.rows), _take(keys, order)))
        return got.tolist()

    def lookup(self, keys: pl.DataFrame) -> pl.DataFrame:
        """One row per input row, in input order: the keys, the values and ``__found``.
        Cost: O(len(keys)) database reads."""
        self._check_open()
        schema = self._schema
        frame = schema.conform(keys, schema.keys, "lookup")
        encoded = self._encode_keys(frame)
        raw = self._get(encoded)
        if not self._touched:
            self._seen.append((encoded, raw))
        values, found = self._values.decode(raw)
        self._last_lookup = (self._mutations, encoded)
        out = frame.hstack(values)
        if self._time_name is not None:  # upsert(keys_from_lookup) skips unchanged entries
            times = out[self._time_name].to_physical()
            self._lookup_times = np.where(
                found & times.is_not_null().to_numpy(), times.fill_null(0).to_numpy(), _NO_TIME
            )
        return out.with_columns(pl.Series(FOUND_COLUMN, found))

    def to_frame(self) -> pl.DataFrame:
        """All live rows (staged changes included), ordered by their key bytes. O(state)."""
        self._check_open()
        frames = list(self._scan(self._write()))
        if not frames:
            return pl.DataFrame(schema=schema_of(self._schema))
        return pl.concat(frames)

    def _scan(self, txn: Any) -> Iterator[pl.DataFrame]:
        """Every row of ``txn``'s view, in chunks of at most :data:`CHUNK` rows."""
        cursor = txn.cursor(self._db.rows)
        cursor.first()
        for chunk in _chunks(cursor.iternext(), first=CHUNK):
            keys, values = zip(*chunk, strict=True)
            yield self._decode_rows(list(keys), list(values))

    def _decode_rows(self, keys: list[bytes], values: list[bytes]) -> pl.DataFrame:
        key_frame, _ = self._keys.decode(keys)
        value_frame, _ = self._values.decode(values)
        return key_frame.hstack(value_frame)

    # ------------------------------------------------------------- mutations

    def upsert(self, rows: pl.DataFrame, *, keys_from_lookup: bool = False) -> None:
        """Insert or replace rows by key (a key at most once per call). O(len(rows))."""
        self._check_open()
        schema = self._schema
        last = lookup_for_upsert(schema, rows, self._last_lookup, self._mutations,
                                 keys_from_lookup=keys_from_lookup)
        frame = schema.conform(rows, schema.columns, "upsert")
        if last is not None:
            encoded = last[1]
            self._put(frame, encoded, track=True, old_times=self._lookup_times)
        else:
            encoded = self._encode_keys(frame.select(schema.key_names))
            self._check_unique(frame, encoded)
            self._put(frame, encoded, track=True)

    def _put(
        self,
        frame: pl.DataFrame,
        encoded: list[bytes],
        *,
        track: bool,
        old_times: np.ndarray | None = None,
    ) -> None:
        if not frame.height:
            return
        self._mutations += 1
        txn = self._write()
        values = self._values.encode(frame.select(self._schema.value_names))
        order = _key_order(encoded)  # in key order: neighbouring pages, one B-tree descent
        if order is None:
            txn.cursor(self._db.rows).putmulti(zip(encoded, values, strict=True))
        else:
            txn.cursor(self._db.rows).putmulti(
                zip(_take(encoded, order), _take(values, order), strict=True)
            )
        if self._time_name is not None:
            times = frame[self._time_name].to_physical()
            has = times.is_not_null().to_numpy()
            physical = times.fill_null(0).to_numpy()
            if old_times is not None:  # an entry at the same time is already indexed
                has &= old_times != physical
            stamps = time_bytes(physical)
            if not has.all():
                stamps = list(itertools.compress(stamps, has))
                keyed = list(itertools.compress(encoded, has))
            else:
                keyed = encoded
            txn.cursor(self._db.time).putmulti(zip(stamps, keyed, strict=True), dupdata=True)
        self._counts["upserted"] += frame.height
        self._counts["rows_written"] += frame.height
        if track:
            self._touched.append((encoded, values))

    @staticmethod
    def _check_unique(frame: pl.DataFrame, encoded: list[bytes]) -> None:
        if len(encoded) < 2:
            return
        dup = pl.Series(encoded, dtype=pl.Binary).is_duplicated()
        if dup.any():
            row = frame.filter(dup).row(0, named=True)
            raise StateStoreError(
                f"upsert: {int(dup.sum())} rows share their key with another row of the same "
                f"call (e.g. {row}); aggregate the batch per key first"
            )

    def delete(self, keys: pl.DataFrame) -> None:
        """Delete rows by key; absent keys are ignored. O(len(keys))."""
        self._check_open()
        frame = self._schema.conform(keys, self._schema.keys, "delete")
        self._drop(self._encode_keys(frame), track=True)

    def _drop(self, encoded: list[bytes], *, track: bool) -> None:
        self._mutations += 1
        if not encoded:
            return
        txn = self._write()
        gone = sum(map(functools.partial(txn.delete, db=self._db.rows), encoded))
        self._counts["deleted"] += gone
        if track:
            self._touched.append((encoded, None))

    def pop_expired(self, t: object) -> pl.DataFrame:
        """Remove and return every row whose time column is <= ``t`` (ordered by time,
        then key). Cost: O(index entries up to ``t`` + rows returned), not O(state)."""
        self._check_open()
        if self._time_name is None:
            raise StateStoreError(
                "pop_expired needs a time_column; pass time_column=... to StateStoreProvider"
            )
        threshold = self._schema.time_to_physical(t)
        txn = self._write()
        cursor = txn.cursor(self._db.time)
        stamps: list[bytes] = []
        keys: list[bytes] = []
        if cursor.first():
            for chunk in _chunks(cursor.iternext()):
                chunk_stamps, chunk_keys = zip(*chunk, strict=True)
                times = times_of(list(chunk_stamps))
                n = int(np.searchsorted(times, threshold, side="right"))
                stamps += chunk_stamps[:n]
                keys += chunk_keys[:n]
                if n < len(chunk):
                    break
        self._mutations += 1
        if not stamps:
            return pl.DataFrame(schema=schema_of(self._schema))
        deleted = functools.partial(txn.delete, db=self._db.time)
        list(map(deleted, stamps, keys))
        unique = pl.Series(keys, dtype=pl.Binary).unique(maintain_order=True).to_list()
        values, found = self._values.decode(self._get(unique))
        rows = self._keys.decode(unique)[0].hstack(values)
        current = rows[self._time_name].to_physical()
        due = pl.Series(found) & current.is_not_null() & (current <= threshold)
        if not due.any():
            return pl.DataFrame(schema=schema_of(self._schema))
        out = rows.filter(due)
        self._drop(list(itertools.compress(unique, due.to_numpy())), track=True)
        return out.sort([self._time_name, *self._sort_keys()])

    def next_time(self) -> int | None:
        """A lower bound of the earliest time of the rows (physical units), or ``None``
        when nothing can expire. O(1)."""
        self._check_open()
        if self._time_name is None:
            return None
        cursor = self._write().cursor(self._db.time)
        if not cursor.first():
            return None
        return int(times_of([cursor.key()])[0])

    def evict(self, predicate: pl.Expr) -> pl.DataFrame:
        """Remove and return the rows matching ``predicate`` (ordered by key). O(state),
        read in chunks."""
        self._check_open()
        txn = self._write()
        chosen = []
        for chunk in self._scan(txn):  # the deletes come after the scan
            try:
                chosen.append(chunk.filter(predicate))
            except pl.exceptions.PolarsError as exc:
                raise StateStoreError(f"evict: the predicate failed on the state: {exc}") from exc
        out = pl.concat(chosen) if chosen else pl.DataFrame(schema=schema_of(self._schema))
        if out.height:
            self._drop(self._encode_keys(out.select(self._schema.key_names)), track=True)
        return out.sort(self._sort_keys()) if self._sort_keys() else out

    def _sort_keys(self) -> list[str]:
        return [c.name for c in self._schema.keys if c.orderable and c.name != self._time_name]

    # ------------------------------------------------------------ lifecycle

    def _has_staged(self) -> bool:
        return bool(self._touched)

    def _committed(self) -> None:
        self._touched, self._seen = [], []

    def _changelog(self) -> pl.DataFrame:
        """Net changes: deleted keys (op 1) then upserted rows (op 0), resolved in Polars
        from the batch's staged operations (the last one per key wins) and the
        before-images its lookups read; only keys never looked up are read again."""
        schema = self._schema
        empty = {**schema_of(schema), OP_COLUMN: pl.Int8()}
        if not self._touched:
            return pl.DataFrame(schema=empty)
        ops = [
            pl.DataFrame({"k": pl.Series(keys, dtype=pl.Binary)}).with_columns(
                pl.Series("v", values, dtype=pl.Binary) if values is not None
                else pl.lit(None, pl.Binary).alias("v")
            )
            for keys, values in self._touched
        ]
        net = pl.concat(ops).unique("k", keep="last", maintain_order=True)
        if self._seen:
            seen = pl.concat([
                pl.DataFrame({"k": pl.Series(k, dtype=pl.Binary),
                              "b": pl.Series(b, dtype=pl.Binary)}) for k, b in self._seen
            ]).unique("k", keep="first").with_columns(pl.lit(True).alias("seen"))
            net = net.join(seen, on="k", how="left")
        else:
            net = net.with_columns(pl.lit(None, pl.Binary).alias("b"),
                                   pl.lit(None, pl.Boolean).alias("seen"))
        keys: list[bytes] = net["k"].to_list()
        before: list[bytes | None] = net["b"].to_list()
        unseen = net["seen"].is_null().to_numpy()
        if unseen.any():
            idx = np.flatnonzero(unseen)
            read = list(map(functools.partial(self._base.get, db=self._db.rows),
                            _take(keys, idx)))
            arr = np.empty(len(before), dtype=object)
            arr[:] = before
            arr[idx] = read
            before = arr.tolist()
        self._before = (keys, before)  # for commit_db's before-images
        _, _, existed = binary_parts(before)
        present = net["v"].is_not_null().to_numpy()
        gone = ~present & existed
        frames = []
        if gone.any():
            key_frame, _ = self._keys.decode(list(itertools.compress(keys, gone)))
            frames.append(key_frame.with_columns(
                *[pl.lit(None, dtype=c.dtype).alias(c.name) for c in schema.values],
                pl.lit(OP_DELETE, dtype=pl.Int8).alias(OP_COLUMN),
            ))
        if present.any():
            upserts = net.filter(pl.Series(present))
            rows = self._decode_rows(upserts["k"].to_list(), upserts["v"].to_list())
            frames.append(rows.with_columns(pl.lit(OP_UPSERT, dtype=pl.Int8).alias(OP_COLUMN)))
        return pl.concat(frames) if frames else pl.DataFrame(schema=empty)

    def commit_db(self, version: int, digest: str) -> None:
        """Commit the transaction as ``version`` with the before-images of every touched
        key (called by the provider once the changelog file is durable)."""
        txn = self._write()
        slot = version % UNDO_SLOTS
        undo = self._db.undo[slot]
        txn.drop(undo, delete=False)
        keys, before = self._before if self._before is not None else ([], [])
        self._before = None
        if keys:
            txn.cursor(undo).putmulti(zip(keys, with_flag(before), strict=True))
        txn.put(f"undo{slot}".encode(), str(version).encode(), db=self._db.meta)
        self._db.set_version(txn, version, digest)
        self._end(commit=True)

    def close(self, reason: str) -> None:
        """Abort the open transaction (staged changes are lost) and refuse later calls."""
        self._end(commit=False)
        self._touched, self._seen = [], []
        super().close(reason)

    @property
    def metrics(self) -> dict[str, Any]:
        """Size and per-batch activity. ``bytes`` is what the store holds in memory (0
        between batches: the rows are on disk); ``disk_bytes`` the database's size."""
        entries = self._entries() if self._closed is None else 0
        return {
            "version": self._version,
            "rows": entries,
            "bytes": 0,
            "disk_bytes": self._db.disk_bytes(),
            "bytes_per_row": 0.0,
            "backend": "lmdb",
            **self._last,
            **self._counts,
        }

    # ------------------------------------------- called by the provider only

    def begin_batch(self, load_ms: float) -> None:
        """Reset per-batch metrics (the provider, on each load)."""
        super().begin_batch(load_ms)
        self._counts = dict.fromkeys(self._counts, 0)

    def holds_committed(self, version: int) -> bool:
        """True when open, nothing staged and at committed ``version``."""
        return self._closed is None and not self._touched and self._version == version

    def load_chunk(self, frame: pl.DataFrame) -> None:
        """Bulk-load rows (keys known unique) during a rebuild."""
        self._put(frame, self._keys.encode(frame.select(self._schema.key_names)), track=False)

    def apply_changelog(self, frame: pl.DataFrame) -> None:
        """Replay one committed changelog (deletes, then upserts), untracked."""
        op = pl.col(OP_COLUMN)
        deleted = frame.filter(op == OP_DELETE).select(self._schema.key_names)
        self._drop(self._keys.encode(deleted), track=False)
        self.load_chunk(frame.filter(op == OP_UPSERT).drop(OP_COLUMN))

    def finish_rebuild(self, version: int | None, digest: str) -> None:
        """Commit the rebuild's transaction; ``version`` None: more chunks follow."""
        txn = self._write()
        self._db.set_version(txn, version, digest)
        self._end(commit=True)

    def apply_undo(self, version: int, digest: str) -> bool:
        """Step the database from ``version + 1`` back to ``version`` with its
        before-images; False when they are not kept (the caller rebuilds)."""
        slot = (version + 1) % UNDO_SLOTS
        if self._db.undo_version(slot) != version + 1:
            return False
        txn = self._write()
        cursor = txn.cursor(self._db.undo[slot])
        cursor.first()
        for chunk in _chunks(cursor.iternext(), first=CHUNK):
            keys, images = zip(*chunk, strict=True)
            offsets, data, _ = binary_parts(images)
            absent = data[offsets[:-1]] == 0  # first byte: 0 absent, 1 a value follows
            if absent.any():
                self._drop(list(itertools.compress(keys, absent)), track=False)
            present = ~absent
            if present.any():
                shifted = np.append(offsets[:-1] + 1, offsets[-1])  # skip the flag byte
                values = self._values.decode_parts(shifted, data, present).filter(present)
                key_frame, _ = self._keys.decode(list(itertools.compress(keys, present)))
                self.load_chunk(key_frame.hstack(values))
        txn.drop(self._db.undo[slot], delete=False)
        txn.delete(f"undo{slot}".encode(), db=self._db.meta)
        self._db.set_version(txn, version, digest)
        self._end(commit=True)
        return True

    def iter_rows(self) -> Iterator[pl.DataFrame]:
        """Every committed row, in chunks, from a read transaction (a snapshot)."""
        with self._db.env.begin() as txn:
            yield from self._scan(txn)


def schema_of(schema: StateSchema) -> dict[str, pl.DataType]:
    """Name -> dtype of the store's key and value columns (an empty frame's schema)."""
    return dict(schema.polars_schema)


def fingerprint(schema: StateSchema) -> str:
    """What the database's bytes mean: codec version and column types."""
    cols = ",".join(f"{c.name}:{c.dtype}" for c in schema.columns)
    return f"codec{CODEC_VERSION}|keys{len(schema.keys)}|{cols}|time:{schema.time_column}"

