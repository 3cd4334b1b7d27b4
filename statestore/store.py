"""StateStore: one version of the state, in memory, with staged changes.

Every operation is a handful of vectorized numpy/Polars calls whose size is
the argument's size: hash the keys, probe the hash index in rounds, scatter or
gather the touched row slots. Only ``to_frame``, ``evict`` and snapshots read
the whole state, and they say so.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from statestore.contract import VersionKeeper
from statestore.exceptions import StateStoreError
from statestore.hashindex import HashIndex, KeyEqual
from statestore.rows import RowStore, unique_slots
from statestore.schema import FOUND_COLUMN, OP_COLUMN, Parts, StateSchema, lookup_for_upsert
from statestore.timeindex import TimeIndex
from statestore.versioned import VersionedState

_ROW = "__statestore_row"
OP_UPSERT = 0
OP_DELETE = 1


def _take(parts: Parts, pos: np.ndarray | None) -> Parts:
    if pos is None:
        return parts
    values, valid = parts
    return values[pos], None if valid is None else valid[pos]


class StateStore(VersionedState):
    """The state as of ``version`` plus the changes staged since.

    Guarantees: mutations are visible to later calls before ``commit()``
    (read-your-writes); ``commit()`` makes them durable as ``version + 1``;
    ``abort()`` (or a failed commit) discards them and closes this object. A
    store is not thread-safe; one provider owns one store at a time.
    """

    def __init__(
        self,
        provider: VersionKeeper,
        schema: StateSchema,
        version: int,
        *,
        hash_bits: int = 64,
        expected_rows: int = 0,
    ) -> None:
        super().__init__(provider, version)
        self._schema = schema
        self._hash_bits = hash_bits
        self._mutations = 0
        self._last_lookup: tuple[int, np.ndarray, list[Parts], np.ndarray] | None = None
        self._rows = RowStore(schema.columns, capacity=expected_rows)
        self._index = HashIndex(expected_rows)
        self._time_name = schema.time_column
        self._time_is_key = self._time_name in schema.key_names
        spec = schema.spec(self._time_name) if self._time_name else None
        self._time = TimeIndex(spec.np_dtype) if spec is not None else None
        self._staged = False
        self._dirty: list[np.ndarray] = []
        self._deleted: list[pl.DataFrame] = []
        self._upserted = 0
        self._removed = 0
        self._baseline: dict[str, int] = {}

    # ----------------------------------------------------------------- reads

    @property
    def num_rows(self) -> int:
        """Number of live rows, staged changes included."""
        self._check_open()
        return self._rows.live

    def lookup(self, keys: pl.DataFrame) -> pl.DataFrame:
        """One row per input row, in input order: the keys, the values and ``__found``.

        Values are null where the key is absent. Extra input columns are ignored.
        Cost: O(len(keys)).
        """
        self._check_open()
        schema = self._schema
        frame = schema.conform(keys, schema.keys, "lookup")
        hashes, parts, rows, _ = self._find(frame)
        # kept for upsert(..., keys_from_lookup=True): the same keys need no second probe
        self._last_lookup = (self._mutations, hashes, parts, rows)
        found = rows >= 0
        values = self._rows.frame(schema.values, np.where(found, rows, 0), found)
        return frame.hstack(values).with_columns(pl.Series(FOUND_COLUMN, found))

    def to_frame(self) -> pl.DataFrame:
        """All live rows (staged changes included), in no particular order. O(state)."""
        self._check_open()
        return self._rows.frame(self._schema.columns, self._rows.live_rows())

    # ------------------------------------------------------------- mutations

    def upsert(self, rows: pl.DataFrame, *, keys_from_lookup: bool = False) -> None:
        """Insert or replace rows by key. Cost: O(len(rows)).

        ``rows`` holds exactly the key and value columns (cast to the schema);
        a key may appear once per call, else StateStoreError.

        ``keys_from_lookup=True`` promises that ``rows`` has exactly the keys,
        in the same order, of the last ``lookup`` call, and that those keys were
        unique; the store then reuses that lookup's hashing and probing instead of
        doing them again (the read-merge-write of an aggregation). A mutation in
        between, or a different row count, is refused.
        """
        self._check_open()
        schema = self._schema
        last = lookup_for_upsert(schema, rows, self._last_lookup, self._mutations,
                                 keys_from_lookup=keys_from_lookup)
        cached = None if last is None else last[1:]
        self._upsert(schema.conform(rows, schema.columns, "upsert"), track=True, cached=cached)

    def delete(self, keys: pl.DataFrame) -> None:
        """Delete rows by key; absent keys are ignored. Cost: O(len(keys))."""
        self._check_open()
        self._delete(self._schema.conform(keys, self._schema.keys, "delete"), track=True)

    def pop_expired(self, t: object) -> pl.DataFrame:
        """Remove and return every row whose time column is <= ``t``.

        ``t`` is an int (the column's physical unit) or a datetime/date. Rows with
        a null time never expire. The result is ordered by time, then key.
        Cost: O(rows returned + time-index runs), not O(state).
        """
        self._check_open()
        name, index = self._time_name, self._time
        if name is None or index is None:
            raise StateStoreError(
                "pop_expired needs a time_column; pass time_column=... to StateStoreProvider"
            )
        threshold = self._schema.time_to_physical(t)
        candidates = index.expired(threshold)
        column = self._rows.columns[name]
        if candidates.size:
            ok = self._rows.alive[candidates] & (column.values[candidates] <= threshold)
            if column.valid is not None:
                ok &= column.valid[candidates]
            candidates = unique_slots(candidates[ok])[0]
        out = self._remove_rows(candidates)
        return out.sort([name, *self._sort_keys()])

    def next_time(self) -> int | None:
        """A lower bound of the earliest time-column value of the rows (physical
        units), or ``None`` when nothing can expire: ``pop_expired(t)`` with a
        smaller ``t`` returns nothing. O(time-index runs)."""
        self._check_open()
        return self._time.earliest() if self._time is not None else None

    def evict(self, predicate: pl.Expr) -> pl.DataFrame:
        """Remove and return the rows matching ``predicate`` (ordered by key). O(state)."""
        self._check_open()
        live = self._rows.live_rows()
        frame = self._rows.frame(self._schema.columns, live)
        try:
            chosen = frame.with_columns(pl.Series(_ROW, live)).filter(predicate)
        except pl.exceptions.PolarsError as exc:
            raise StateStoreError(f"evict: the predicate failed on the state: {exc}") from exc
        out = self._remove_rows(chosen[_ROW].to_numpy(), chosen.drop(_ROW))
        return out.sort(self._sort_keys()) if self._sort_keys() else out

    # ------------------------------------------------------------ lifecycle

    def _has_staged(self) -> bool:
        return self._staged

    def _committed(self) -> None:
        self._staged = False
        self._dirty, self._deleted = [], []

    @property
    def metrics(self) -> dict[str, Any]:
        """Size and per-batch activity (since the last ``provider.load``).

        ``bytes`` is the memory held by the store's arrays (columns with spare
        capacity, hash table, time index); ``index_probes``/``rows_written``/
        ``rows_read`` count the elements the batch touched (they follow the
        batch's size, not the state's).
        """
        counters = self._counters()
        nbytes = (
            self._rows.nbytes()
            + self._index.nbytes()
            + (self._time.nbytes() if self._time is not None else 0)
        )
        return {
            "version": self._version,
            "rows": self._rows.live,
            "bytes": nbytes,
            "bytes_per_row": nbytes / max(self._rows.live, 1),
            "upserted": self._upserted,
            "deleted": self._removed,
            **self._last,
            **{k: v - self._baseline.get(k, 0) for k, v in counters.items()},
            "time_index_entries": self._time.entries if self._time is not None else 0,
            "time_index_runs": len(self._time.runs) if self._time is not None else 0,
        }

    # ------------------------------------------------------------- internals

    def _counters(self) -> dict[str, int]:
        return {
            "index_probes": self._index.probes,
            "index_rounds": self._index.rounds,
            "rehashed_rows": self._index.rehashed,
            "rows_written": self._rows.rows_written,
            "rows_read": self._rows.rows_read,
            "rows_moved": self._rows.rows_moved,
            "time_index_merged": self._time.merged if self._time is not None else 0,
        }

    # ------------------------------------------- called by the provider only

    def begin_batch(self, load_ms: float) -> None:
        """Reset per-batch metrics (the provider, on each load)."""
        super().begin_batch(load_ms)
        self._baseline = self._counters()
        self._upserted = self._removed = 0

    def _sort_keys(self) -> list[str]:
        return [c.name for c in self._schema.keys if c.orderable and c.name != self._time_name]

    def _key_equal(self, parts: list[Parts]) -> KeyEqual:
        columns = [self._rows.columns[c.name] for c in self._schema.keys]

        def equal(pos: np.ndarray, rows: np.ndarray) -> np.ndarray:
            ok = np.ones(len(pos), dtype=np.bool_)
            for column, part in zip(columns, parts, strict=True):
                ok &= column.equal(rows, *_take(part, pos))
            return ok

        return equal

    def _find(
        self, keys: pl.DataFrame, hashes: np.ndarray | None = None
    ) -> tuple[np.ndarray, list[Parts], np.ndarray, np.ndarray]:
        """Hash, convert and look up conformed keys: (hashes, parts, rows, table slots)."""
        if hashes is None:
            hashes = self._schema.hash_keys(keys, self._hash_bits)
        parts = [c.to_parts(keys[c.name]) for c in self._schema.keys]
        if not self._rows.live:
            none = np.full(len(hashes), -1, dtype=np.int64)
            return hashes, parts, none, none
        rows, slots = self._index.find(hashes, self._rows.hashes, self._key_equal(parts))
        return hashes, parts, rows, slots

    @staticmethod
    def _check_unique(keys: pl.DataFrame, hashes: np.ndarray) -> None:
        """StateStoreError if a key repeats; O(n log n) on hashes, exact on collisions."""
        if len(hashes) < 2:
            return
        ordered = np.sort(hashes)
        repeated = ordered[1:][ordered[1:] == ordered[:-1]]
        if not repeated.size:
            return
        suspects = keys.filter(pl.Series(np.isin(hashes, repeated)))
        dup = suspects.filter(pl.struct(keys.columns).is_duplicated())
        if dup.height:
            raise StateStoreError(
                f"upsert: {dup.height} rows share their key with another row of the same call "
                f"(e.g. {dup.row(0, named=True)}); aggregate the batch per key first"
            )

    def _upsert(
        self,
        frame: pl.DataFrame,
        *,
        track: bool,
        cached: tuple[np.ndarray, list[Parts], np.ndarray] | None = None,
    ) -> None:
        if not frame.height:
            return
        self._mutations += 1
        schema = self._schema
        if cached is not None:
            hashes, key_parts, found = cached
        else:
            keys = frame.select(schema.key_names)
            hashes = schema.hash_keys(keys, self._hash_bits)
            if track:
                self._check_unique(keys, hashes)
            hashes, key_parts, found, _ = self._find(keys, hashes)
        parts: dict[str, Parts] = dict(zip(schema.key_names, key_parts, strict=True))
        parts.update((c.name, c.to_parts(frame[c.name])) for c in schema.values)
        old = np.flatnonzero(found >= 0)
        new = np.flatnonzero(found < 0)
        touched: list[np.ndarray] = []
        if old.size:
            old_rows = found[old]
            pos = None if old.size == frame.height else old
            new_times, moved = None, np.empty(0, dtype=np.int64)
            if self._time_name is not None and not self._time_is_key:
                new_times = _take(parts[self._time_name], pos)
                moved = self._changed_times(old_rows, new_times)  # compares with the old times
            self._rows.write(old_rows, {c.name: _take(parts[c.name], pos) for c in schema.values})
            # NOTE: index moved rows only after their new time is written: a merge of
            # time-index runs drops every entry that disagrees with the row's current time.
            if new_times is not None and moved.size:
                self._index_times(old_rows[moved], _take(new_times, moved))
            touched.append(old_rows)
        if new.size:
            pos = None if new.size == frame.height else new
            new_hashes = hashes if pos is None else hashes[pos]
            new_rows = self._rows.allocate(new_hashes)
            self._rows.write(new_rows, {name: _take(p, pos) for name, p in parts.items()})
            self._index.insert(new_hashes, new_rows, self._rows.hashes)
            if self._time_name is not None:
                self._index_times(new_rows, _take(parts[self._time_name], pos))
            touched.append(new_rows)
        self._upserted += frame.height
        if track:
            self._staged = True
            self._dirty.extend(touched)

    def _index_times(self, rows: np.ndarray, times: Parts) -> None:
        if self._time is None:
            return
        values, valid = times
        if valid is not None:
            rows, values = rows[valid], values[valid]
        self._time.add(values, rows, self._time_current)
        self._time.maybe_compact(self._rows.live, self._time_current)

    def _changed_times(self, rows: np.ndarray, new: Parts) -> np.ndarray:
        """Positions in ``rows`` whose time column changes to ``new``."""
        old_values, old_valid = self._rows.columns[self._time_name or ""].gather(rows)
        new_values, new_valid = new
        changed = old_values != new_values
        if old_valid is not None or new_valid is not None:
            ov = np.ones(len(rows), np.bool_) if old_valid is None else old_valid
            nv = np.ones(len(rows), np.bool_) if new_valid is None else new_valid
            changed = (changed & ov & nv) | (ov != nv)
        return np.flatnonzero(changed)

    def _time_current(self, times: np.ndarray, rows: np.ndarray) -> np.ndarray:
        column = self._rows.columns[self._time_name or ""]
        ok: np.ndarray = self._rows.alive[rows] & (column.values[rows] == times)
        if column.valid is not None:
            ok &= column.valid[rows]
        return ok

    def _delete(self, keys: pl.DataFrame, *, track: bool) -> None:
        self._mutations += 1
        if not keys.height or not self._rows.live:
            return
        _, _, rows, slots = self._find(keys)
        hit = np.flatnonzero(rows >= 0)
        if not hit.size:
            return
        unique_rows, first = unique_slots(rows[hit])
        pos = hit[first]
        self._index.remove(slots[pos])
        self._rows.release(unique_rows)
        self._after_remove(len(unique_rows))
        if track:
            self._staged = True
            self._deleted.append(keys.select(pl.all().gather(pl.Series(pos))))

    def _remove_rows(self, rows: np.ndarray, frame: pl.DataFrame | None = None) -> pl.DataFrame:
        """Remove distinct live ``rows`` (found by slot, not key); return their contents."""
        out = self._rows.frame(self._schema.columns, rows) if frame is None else frame
        self._mutations += 1
        if rows.size:
            self._index.remove(self._index.locate(rows, self._rows.hashes))
            self._rows.release(rows)
            self._after_remove(len(rows))
            self._staged = True
            self._deleted.append(out.select(self._schema.key_names))
        return out

    def _after_remove(self, n: int) -> None:
        self._removed += n
        if self._index.needs_cleanup():
            self._index.rebuild(self._rows.hashes, self._rows.live_rows())

    def _changelog(self) -> pl.DataFrame:
        """This version's net changes: deleted keys (op 1), then upserted rows (op 0).

        Replaying deletes before upserts gives the staged state, also for a key
        deleted and re-inserted in the same version.
        """
        schema = self._schema
        frames = []
        if self._deleted:
            frames.append(
                pl.concat(self._deleted).with_columns(
                    *[pl.lit(None, dtype=c.dtype).alias(c.name) for c in schema.values],
                    pl.lit(OP_DELETE, dtype=pl.Int8).alias(OP_COLUMN),
                )
            )
        if self._dirty:
            rows = unique_slots(np.concatenate(self._dirty))[0]
            rows = rows[self._rows.alive[rows]]
            frames.append(
                self._rows.frame(schema.columns, rows).with_columns(
                    pl.lit(OP_UPSERT, dtype=pl.Int8).alias(OP_COLUMN)
                )
            )
        if not frames:
            empty: dict[str, pl.DataType] = {**schema.polars_schema, OP_COLUMN: pl.Int8()}
            return pl.DataFrame(schema=empty)
        return pl.concat(frames)

    def apply_changelog(self, frame: pl.DataFrame) -> None:
        """Replay one committed changelog (during a rebuild from disk)."""
        op = pl.col(OP_COLUMN)
        self._delete(frame.filter(op == OP_DELETE).select(self._schema.key_names), track=False)
        self._upsert(frame.filter(op == OP_UPSERT).drop(OP_COLUMN), track=False)

    def load_rows(self, frame: pl.DataFrame) -> None:
        """Bulk-load a snapshot's rows (keys known unique) into an empty store."""
        self._upsert(frame, track=False)
