"""A vectorized open-addressing hash index: key hash → row slot.

The table is a power-of-two numpy array of row slots (``EMPTY``, ``TOMBSTONE``
or a row). Linear probing runs in *rounds*: each round looks at the current
slot of every still-unresolved key at once (one gather), so a batch of ``n``
keys costs O(n · mean probe length) element operations, whatever the table
size, and O(longest probe sequence) numpy calls of shrinking size. Load
(live + tombstones) stays <= 1/2, so probe sequences are short and always end
at an ``EMPTY`` slot.

Inserts claim free slots by scatter-then-verify: every claimant of a slot
writes its row, one write survives, the survivor wins and the losers move to
the next slot in the next round. Keys already present are never re-inserted
(the caller looks them up first), so a batch's inserts are distinct keys.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

EMPTY = -1
TOMBSTONE = -2
MAX_LOAD = 0.5
MAX_TOMBSTONES = 0.25  # rebuild when tombstones exceed this fraction of the table
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIN_BITS = 4
_INT32_ROWS = 2**31 - 8

#: ``eq(batch_positions, rows)``: True where the batch key equals the stored row's key.
KeyEqual = Callable[[np.ndarray, np.ndarray], np.ndarray]


class HashIndex:
    """Maps 64-bit key hashes to row slots; equality of real keys is the caller's."""

    def __init__(self, expected_rows: int = 0) -> None:
        self.bits = _bits_for(expected_rows)
        self.table = _empty_table(self.bits, expected_rows)
        self.live = 0
        self.tombstones = 0
        self.probes = 0  # slots examined by find/insert/locate (not by rebuilds)
        self.rounds = 0  # numpy probe rounds
        self.rehashed = 0  # rows re-inserted by resizes and tombstone cleanups

    @property
    def size(self) -> int:
        """Number of slots in the table."""
        return len(self.table)

    def _home(self, hashes: np.ndarray) -> np.ndarray:
        # Fibonacci hashing: the top bits of hash * golden ratio spread any hash well.
        return ((hashes * _GOLDEN) >> np.uint64(64 - self.bits)).astype(np.int64)

    def find(
        self, hashes: np.ndarray, row_hashes: np.ndarray, equal: KeyEqual
    ) -> tuple[np.ndarray, np.ndarray]:
        """Look up every hash; return (row or -1, table slot or -1) per input position.

        A stored row matches when its hash equals and ``equal`` confirms the key,
        so hash collisions never produce a wrong answer.
        """
        n = len(hashes)
        rows_out = np.full(n, -1, dtype=np.int64)
        slots_out = np.full(n, -1, dtype=np.int64)
        pos = np.arange(n, dtype=np.int64)
        slot = self._home(hashes)
        want = hashes
        mask = self.size - 1
        while pos.size:
            self.rounds += 1
            self.probes += pos.size
            rows = self.table[slot].astype(np.int64)
            done = rows == EMPTY
            cand = np.flatnonzero(rows >= 0)
            if cand.size:
                cand = cand[row_hashes[rows[cand]] == want[cand]]
            if cand.size:
                hit = cand[equal(pos[cand], rows[cand])]
                rows_out[pos[hit]] = rows[hit]
                slots_out[pos[hit]] = slot[hit]
                done[hit] = True
            keep = ~done
            pos, slot, want = pos[keep], (slot[keep] + 1) & mask, want[keep]
        return rows_out, slots_out

    def locate(self, rows: np.ndarray, row_hashes: np.ndarray) -> np.ndarray:
        """Table slots of indexed ``rows`` (found by identity, no key comparison)."""
        slots_out = np.empty(len(rows), dtype=np.int64)
        pos = np.arange(len(rows), dtype=np.int64)
        slot = self._home(row_hashes[rows])
        want = rows
        mask = self.size - 1
        while pos.size:
            self.rounds += 1
            self.probes += pos.size
            hit = self.table[slot] == want
            slots_out[pos[hit]] = slot[hit]
            keep = ~hit
            pos, slot, want = pos[keep], (slot[keep] + 1) & mask, want[keep]
        return slots_out

    def insert(self, hashes: np.ndarray, rows: np.ndarray, row_hashes: np.ndarray) -> None:
        """Index new ``rows`` (keys known to be absent and distinct), growing if needed."""
        if self.live + self.tombstones + len(rows) > self.size * MAX_LOAD:
            self.rebuild(row_hashes, self._live_rows_hint(), extra=len(rows))
        self.probes += self._claim(hashes, rows)
        self.live += len(rows)

    def _claim(self, hashes: np.ndarray, rows: np.ndarray) -> int:
        """Put each row in the first free slot of its probe sequence; return slots probed."""
        if rows.size and self.table.dtype == np.int32 and int(rows.max()) > _INT32_ROWS:
            self.table = self.table.astype(np.int64)
        slot = self._home(hashes)
        mask = self.size - 1
        table = self.table
        probes = 0
        while rows.size:
            self.rounds += 1
            probes += rows.size
            current = table[slot]
            free = np.flatnonzero(current < 0)
            if free.size:
                claim_slots = slot[free]
                claim_rows = rows[free]
                table[claim_slots] = claim_rows  # every claimant writes; one write survives
                won = table[claim_slots] == claim_rows
                self.tombstones -= int(np.count_nonzero(current[free[won]] == TOMBSTONE))
                keep = np.ones(rows.size, dtype=np.bool_)
                keep[free[won]] = False
                rows, slot = rows[keep], slot[keep]
            slot = (slot + 1) & mask
        return probes

    def remove(self, slots: np.ndarray) -> None:
        """Tombstone distinct occupied ``slots``."""
        self.table[slots] = TOMBSTONE
        self.live -= len(slots)
        self.tombstones += len(slots)

    def needs_cleanup(self) -> bool:
        """True when tombstones should be cleared (or the table shrunk) by a rebuild."""
        too_sparse = self.bits > _MIN_BITS and self.live < self.size // 16
        return self.tombstones > self.size * MAX_TOMBSTONES or too_sparse

    def rebuild(self, row_hashes: np.ndarray, live_rows: np.ndarray, extra: int = 0) -> None:
        """Re-insert ``live_rows`` into a fresh table sized for ``extra`` more rows.

        O(state), but only after O(table size) inserts or deletes: amortized O(1).
        """
        self.bits = _bits_for(len(live_rows) + extra)
        self.table = _empty_table(self.bits, len(live_rows) + extra)
        self.tombstones = 0
        self.live = len(live_rows)
        self.rehashed += len(live_rows)
        self._claim(row_hashes[live_rows], live_rows.astype(np.int64))

    def _live_rows_hint(self) -> np.ndarray:
        # The table itself knows which rows are indexed.
        occupied = self.table[self.table >= 0]
        return occupied.astype(np.int64)

    def nbytes(self) -> int:
        """Memory held by the table."""
        return self.table.nbytes


def _bits_for(rows: int) -> int:
    """Smallest power-of-two table holding ``rows`` at load <= 0.4 (room before a resize)."""
    return max(_MIN_BITS, int(max(rows, 1) * 5 // 2 - 1).bit_length())


def _empty_table(bits: int, rows: int) -> np.ndarray:
    dtype = np.int32 if rows < _INT32_ROWS else np.int64
    return np.full(1 << bits, EMPTY, dtype=dtype)
