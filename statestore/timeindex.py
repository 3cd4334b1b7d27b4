"""Time index: which row slots may expire at or before a time, without a scan.

Entries ``(time, row)`` are kept in sorted runs, one run per batch that
inserted rows or changed their time (size-tiered: ``FANOUT`` runs of one level
merge into a run of the next level, so there are O(log state) runs and each
entry is merged O(log state) times, by a near-linear stable sort of presorted
runs). ``expired(t)`` binary-searches each run and takes the prefix: it costs
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
_COMPACT_SLACK = 4096

#: ``current(times, rows)``: True where ``rows`` are live and still hold ``times``.
IsCurrent = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass
class _Run:
    times: np.ndarray  # sorted ascending
    rows: np.ndarray
    level: int
    allocated: int  # length of the arrays the views point into


class TimeIndex:
    """Sorted runs of (time, row) entries for ``pop_expired``."""

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.runs: list[_Run] = []
        self.entries = 0
        self.merged = 0  # entries moved by merges (amortized work, for metrics)

    def add(self, times: np.ndarray, rows: np.ndarray, current: IsCurrent) -> None:
        """Index ``rows`` at ``times`` (new rows, or rows whose time changed)."""
        if not len(rows):
            return
        order = np.argsort(times, kind="stable")
        self.runs.append(_Run(times[order], rows[order].astype(np.int64), 0, len(rows)))
        self.entries += len(rows)
        while len(self.runs) >= FANOUT and len({r.level for r in self.runs[-FANOUT:]}) == 1:
            tail = self.runs[-FANOUT:]
            del self.runs[-FANOUT:]
            self.runs.append(self._merge(tail, tail[0].level + 1, current))

    def _merge(self, runs: list[_Run], level: int, current: IsCurrent) -> _Run:
        times = np.concatenate([r.times for r in runs])
        rows = np.concatenate([r.rows for r in runs])
        self.merged += len(rows)
        keep = current(times, rows)
        times, rows = times[keep], rows[keep]
        self.entries -= int(keep.size - times.size)
        order = np.argsort(times, kind="stable")  # timsort: linear on presorted runs
        return _Run(times[order], rows[order], level, len(rows))

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
        out = np.concatenate(taken) if taken else np.empty(0, dtype=np.int64)
        self.entries -= len(out)
        return out

    def maybe_compact(self, live: int, current: IsCurrent) -> None:
        """Merge everything into one run when stale entries outnumber live rows."""
        if self.entries > 2 * live + _COMPACT_SLACK and self.runs:
            level = max(r.level for r in self.runs)
            runs, self.runs = self.runs, []
            self.runs.append(self._merge(runs, level, current))

    def nbytes(self) -> int:
        """Memory held by the runs (including consumed prefixes not yet released)."""
        return sum(r.allocated * (r.times.itemsize + r.rows.itemsize) for r in self.runs)
