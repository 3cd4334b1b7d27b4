"""Time index: which row slots may expire at or before a time, without a scan.

Entries ``(time, row)`` are kept in sorted runs, one run per batch that
inserted rows or changed their time. Runs are size-tiered: a run's class is
``log4(len / 1024)``; classes never increase along the list (a new run larger
than its predecessor absorbs it) and ``FANOUT`` runs of one class merge into a
run of a higher class. So there are O(log state) runs, each entry is merged
O(log state) times (by a near-linear stable sort of presorted runs), and a
big run, such as a whole snapshot's, is left alone by small batches.
``expired(t)`` binary-searches each run and takes the prefix: it costs
O(runs + entries returned), never O(state).

Entries may be stale (the row was deleted, its slot reused or its time
changed): the caller re-checks every returned row against its current time and
liveness. Merges and compactions drop stale entries, so they never pile up.
Invariant: every live row with a non-null time has an entry with its current time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

FANOUT = 4
_CLASS_BASE = 1024  # runs below 4 * 1024 entries share the smallest class
_COMPACT_SLACK = 4096
_INT32_ROWS = 2**31 - 1

#: ``current(times, rows)``: True where ``rows`` are live and still hold ``times``.
IsCurrent = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass
class _Run:
    times: np.ndarray  # sorted ascending
    rows: np.ndarray
    allocated: int  # length of the arrays the views point into

    @property
    def size_class(self) -> int:
        """floor(log4(len / 1024)), 0 for small runs."""
        return max(0, (len(self.rows) // _CLASS_BASE).bit_length() - 1) // 2


def _sorted_run(times: np.ndarray, rows: np.ndarray) -> _Run:
    order = np.argsort(times, kind="stable")  # timsort: linear on presorted runs
    rows = rows[order]
    if rows.size and rows.dtype != np.int32 and int(rows.max()) <= _INT32_ROWS:
        rows = rows.astype(np.int32)
    return _Run(times[order], rows, len(rows))


class TimeIndex:
    """Sorted runs of (time, row) entries for ``pop_expired``."""

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.runs: list[_Run] = []
        self.entries = 0
        self.merged = 0  # entries moved by merges (amortized work, for metrics)

    def add(self, times: np.ndarray, rows: np.ndarray, current: IsCurrent) -> None:
        """Index ``rows`` at ``times`` (new rows, or rows whose time changed).

        NOTE: call it after the rows hold ``times``: merges drop entries that
        disagree with a row's current time.
        """
        if not len(rows):
            return
        self.runs.append(_sorted_run(times, rows))
        self.entries += len(rows)
        runs = self.runs
        while len(runs) >= 2:
            if runs[-1].size_class > runs[-2].size_class:
                take = 2
            elif len(runs) >= FANOUT and len({r.size_class for r in runs[-FANOUT:]}) == 1:
                take = FANOUT
            else:
                break
            tail = runs[-take:]
            del runs[-take:]
            runs.append(self._merge(tail, current))

    def _merge(self, runs: list[_Run], current: IsCurrent) -> _Run:
        times = np.concatenate([r.times for r in runs])
        rows = np.concatenate([r.rows for r in runs])
        self.merged += len(rows)
        keep = current(times, rows)
        self.entries -= int(keep.size - np.count_nonzero(keep))
        return _sorted_run(times[keep], rows[keep])

    def expired(self, t: int) -> np.ndarray:
        """Remove and return the rows of all entries with time <= ``t`` (may be stale)."""
        if not self.runs:
            return np.empty(0, dtype=np.int64)
        info = np.iinfo(self.dtype) if self.dtype.kind in "iu" else None
        if info is not None and t < info.min:
            return np.empty(0, dtype=np.int64)
        bound = self.dtype.type(min(t, info.max) if info is not None else t)
        taken: list[np.ndarray] = []
        kept: list[_Run] = []
        for run in self.runs:
            k = int(np.searchsorted(run.times, bound, side="right"))
            if k:
                taken.append(run.rows[:k])
                run.times, run.rows = run.times[k:], run.rows[k:]
                if len(run.rows) * 4 < run.allocated:  # release the consumed prefix
                    run.times, run.rows = run.times.copy(), run.rows.copy()
                    run.allocated = len(run.rows)
            if len(run.rows):
                kept.append(run)
        self.runs = kept
        out = np.concatenate(taken).astype(np.int64) if taken else np.empty(0, dtype=np.int64)
        self.entries -= len(out)
        return out

    def earliest(self) -> int | None:
        """The smallest time of any entry (a lower bound: the entry may be stale)."""
        heads = [int(run.times[0]) for run in self.runs if len(run.times)]
        return min(heads) if heads else None

    def maybe_compact(self, live: int, current: IsCurrent) -> None:
        """Merge everything into one run when stale entries outnumber live rows."""
        if self.entries > 2 * live + _COMPACT_SLACK and self.runs:
            runs, self.runs = self.runs, []
            self.runs.append(self._merge(runs, current))

    def nbytes(self) -> int:
        """Memory held by the runs (including consumed prefixes not yet released)."""
        return sum(r.allocated * (r.times.itemsize + r.rows.itemsize) for r in self.runs)
