"""Window specs and vectorized window assignment.

``window(col, size)`` tumbles, ``window(col, size, slide=...)`` hops,
``session_window(col, gap)`` groups a key's events separated by less than
``gap``. Windows are half-open ``[start, end)`` and aligned to the epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from microbatch.exceptions import PlanError
from microbatch.plan.durations import parse_duration_ms


@dataclass(frozen=True)
class WindowSpec:
    """A tumbling (``slide == size``) or hopping event-time window."""

    column: str
    size_ms: int
    slide_ms: int
    allowed_lateness_ms: int = 0

    @property
    def is_tumbling(self) -> bool:
        return self.size_ms == self.slide_ms

    def describe(self) -> dict[str, object]:
        doc: dict[str, object] = {
            "kind": "window",
            "column": self.column,
            "size_ms": self.size_ms,
            "slide_ms": self.slide_ms,
        }
        if self.allowed_lateness_ms:
            doc["allowed_lateness_ms"] = self.allowed_lateness_ms
        return doc


@dataclass(frozen=True)
class SessionWindowSpec:
    """Sessions: a row at t makes ``[t, t + gap)``; overlapping or touching
    sessions of a key merge."""

    column: str
    gap_ms: int

    def describe(self) -> dict[str, object]:
        return {"kind": "session_window", "column": self.column, "gap_ms": self.gap_ms}


def window(
    column: str,
    size: str | int,
    slide: str | int | None = None,
    *,
    allowed_lateness: str | int | None = None,
) -> WindowSpec:
    """A tumbling window of ``size`` on ``column``, hopping by ``slide`` when given.

    ``size`` must be a whole multiple of ``slide``. ``allowed_lateness`` keeps a
    closed window's state that much longer: rows arriving within it update the
    window and, in append mode, the corrected row is emitted again with the
    next ``revision``.
    """
    size_ms = parse_duration_ms(size, what="window size")
    slide_ms = size_ms if slide is None else parse_duration_ms(slide, what="window slide")
    if size_ms <= 0 or slide_ms <= 0:
        raise PlanError(f"window size and slide must be positive, got {size!r} / {slide!r}")
    if size_ms % slide_ms:
        raise PlanError(
            f"window size {size!r} is not a multiple of slide {slide!r}; choose a slide "
            "that divides the size (e.g. size '5m', slide '1m')"
        )
    lateness = (
        0
        if allowed_lateness is None
        else parse_duration_ms(allowed_lateness, what="allowed_lateness")
    )
    return WindowSpec(column, size_ms, slide_ms, lateness)


def session_window(column: str, gap: str | int) -> SessionWindowSpec:
    """Session windows on ``column`` closed after ``gap`` without events."""
    gap_ms = parse_duration_ms(gap, what="session gap")
    if gap_ms <= 0:
        raise PlanError(f"session gap must be positive, got {gap!r}")
    return SessionWindowSpec(column, gap_ms)


def assign_windows(lf: pl.LazyFrame, spec: WindowSpec, ts_ms: str) -> pl.LazyFrame:
    """Add ``__ws`` (window start, epoch ms): one row per (row, window) it falls in.

    Tumbling: ``floor(t / size) * size``. Hopping: the ``size / slide``
    windows whose start is ``floor(t / slide) * slide - i * slide``. Vectorized.
    """
    last_start = (pl.col(ts_ms) // spec.slide_ms) * spec.slide_ms
    if spec.is_tumbling:
        return lf.with_columns(last_start.alias("__ws"))
    k = spec.size_ms // spec.slide_ms
    return lf.with_columns(
        (last_start - pl.int_ranges(0, k, dtype=pl.Int64) * spec.slide_ms).alias("__ws")
    ).explode("__ws")
