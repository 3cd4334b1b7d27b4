"""Columnar row storage: one numpy array per column, addressed by row slot.

Slots are allocated from a free-list (slots of deleted rows) first, then from
the end; arrays grow by doubling, so an insert is amortized O(1). Every
operation takes a vector of slots and does one numpy scatter or gather per
column: its cost follows the number of slots, not the number of stored rows.
"""

from __future__ import annotations

import sys

import numpy as np
import polars as pl

from statestore.schema import ColumnSpec, Parts


def unique_slots(slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ``slots`` ascending, and the position of each one's first occurrence.

    Sort-based on purpose: ``np.unique`` may take a hash path that is many times
    slower for integer arrays.
    """
    order = np.argsort(slots, kind="stable")
    ordered = slots[order]
    first = np.ones(len(ordered), dtype=np.bool_)
    first[1:] = ordered[1:] != ordered[:-1]
    return ordered[first], order[first]


class Column:
    """The values (and lazily, a validity mask) of one column for every slot."""

    __slots__ = ("spec", "valid", "values")

    def __init__(self, spec: ColumnSpec, capacity: int) -> None:
        self.spec = spec
        self.values: np.ndarray = np.zeros(capacity, dtype=spec.np_dtype)
        if not spec.native:
            self.values[:] = None
        self.valid: np.ndarray | None = None

    def grow(self, capacity: int, used: int) -> None:
        """Reallocate to ``capacity`` slots, keeping slots ``[0, used)``."""
        values = np.zeros(capacity, dtype=self.spec.np_dtype)
        if not self.spec.native:
            values[used:] = None
        values[:used] = self.values[:used]
        self.values = values
        if self.valid is not None:
            valid = np.ones(capacity, dtype=np.bool_)
            valid[:used] = self.valid[:used]
            self.valid = valid

    def write(self, rows: np.ndarray, values: np.ndarray, valid: np.ndarray | None) -> None:
        """Scatter ``values`` (and nulls where ``valid`` is False) into ``rows``."""
        self.values[rows] = values
        if valid is not None:
            if self.valid is None:
                self.valid = np.ones(len(self.values), dtype=np.bool_)
            self.valid[rows] = valid
        elif self.valid is not None:
            self.valid[rows] = True

    def gather(self, rows: np.ndarray, found: np.ndarray | None = None) -> Parts:
        """The (values, validity) at ``rows``; rows where ``found`` is False are null."""
        values = self.values[rows]
        valid = None if self.valid is None else self.valid[rows]
        if found is not None:
            valid = found if valid is None else valid & found
        return values, valid

    def equal(self, rows: np.ndarray, values: np.ndarray, valid: np.ndarray | None) -> np.ndarray:
        """Elementwise exact equality of stored ``rows`` with ``values`` (null equals null)."""
        stored = self.values[rows]
        eq = np.asarray(stored == values, dtype=np.bool_)
        if self.spec.is_float:
            eq |= np.isnan(stored) & np.isnan(values)
        if self.valid is None and valid is None:
            return eq
        stored_valid = np.ones(len(rows), np.bool_) if self.valid is None else self.valid[rows]
        other_valid = np.ones(len(rows), np.bool_) if valid is None else valid
        return np.where(stored_valid & other_valid, eq, stored_valid == other_valid)

    def nbytes(self, sample: np.ndarray, live: int) -> int:
        """Approximate memory held; object columns estimate their objects from ``sample``."""
        total = self.values.nbytes + (0 if self.valid is None else self.valid.nbytes)
        if not self.spec.native and sample.size:
            sizes = [sys.getsizeof(v) for v in self.values[sample]]  # <= 64 objects
            total += int(np.mean(sizes) * live)
        return total


class RowStore:
    """Rows of the state, column by column, plus each row's key hash and liveness."""

    def __init__(self, specs: tuple[ColumnSpec, ...], capacity: int = 64) -> None:
        capacity = max(capacity + capacity // 4, 16)  # headroom: no regrowth right after a load
        self.columns = {spec.name: Column(spec, capacity) for spec in specs}
        self.alive = np.zeros(capacity, dtype=np.bool_)
        self.hashes = np.zeros(capacity, dtype=np.uint64)
        self.high = 0  # slots [0, high) have been handed out at least once
        self.live = 0
        self._free = np.empty(16, dtype=np.int64)
        self._n_free = 0
        self.rows_written = 0  # counters for metrics and scaling checks
        self.rows_read = 0
        self.rows_moved = 0  # copied by growth (amortized O(1) per insert)

    @property
    def capacity(self) -> int:
        """Number of slots allocated."""
        return len(self.alive)

    def _grow(self, needed: int) -> None:
        capacity = max(needed + needed // 4, 2 * self.capacity)  # doubling, with headroom
        self.rows_moved += self.high
        for column in self.columns.values():
            column.grow(capacity, self.high)
        alive = np.zeros(capacity, dtype=np.bool_)
        alive[: self.high] = self.alive[: self.high]
        hashes = np.zeros(capacity, dtype=np.uint64)
        hashes[: self.high] = self.hashes[: self.high]
        self.alive, self.hashes = alive, hashes

    def allocate(self, hashes: np.ndarray) -> np.ndarray:
        """Hand out one live slot per hash (free-list first) and record the hashes."""
        n = len(hashes)
        k = min(n, self._n_free)
        reused = self._free[self._n_free - k : self._n_free].copy()
        self._n_free -= k
        fresh = n - k
        if self.high + fresh > self.capacity:
            self._grow(self.high + fresh)
        rows = np.concatenate([reused, np.arange(self.high, self.high + fresh, dtype=np.int64)])
        self.high += fresh
        self.alive[rows] = True
        self.hashes[rows] = hashes
        self.live += n
        return rows

    def release(self, rows: np.ndarray) -> None:
        """Mark unique live ``rows`` dead and put their slots on the free-list."""
        self.alive[rows] = False
        self.live -= len(rows)
        for column in self.columns.values():
            if not column.spec.native:
                column.values[rows] = None  # drop references to the Python objects
        needed = self._n_free + len(rows)
        if needed > len(self._free):
            free = np.empty(max(needed, 2 * len(self._free)), dtype=np.int64)
            free[: self._n_free] = self._free[: self._n_free]
            self._free = free
        self._free[self._n_free : needed] = rows
        self._n_free = needed

    def write(self, rows: np.ndarray, parts: dict[str, Parts]) -> None:
        """Scatter each named column's (values, validity) into ``rows``."""
        for name, (values, valid) in parts.items():
            self.columns[name].write(rows, values, valid)
        self.rows_written += len(rows)

    def frame(
        self,
        specs: tuple[ColumnSpec, ...],
        rows: np.ndarray,
        found: np.ndarray | None = None,
    ) -> pl.DataFrame:
        """Gather ``specs`` at ``rows`` into a DataFrame (null where ``found`` is False)."""
        self.rows_read += len(rows)
        return pl.DataFrame(
            [spec.from_parts(*self.columns[spec.name].gather(rows, found)) for spec in specs]
        )

    def live_rows(self) -> np.ndarray:
        """Slots of all live rows, ascending (a full scan: O(state))."""
        return np.flatnonzero(self.alive[: self.high])

    def nbytes(self) -> int:
        """Approximate memory held by the rows, including spare capacity. O(1)."""
        probe = np.linspace(0, max(self.high - 1, 0), num=min(self.high, 256)).astype(np.int64)
        sample = probe[self.alive[probe]][:64]  # evenly spread live slots, not a scan
        cols = sum(c.nbytes(sample, self.live) for c in self.columns.values())
        return cols + self.alive.nbytes + self.hashes.nbytes + self._free.nbytes
