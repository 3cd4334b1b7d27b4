"""Window specs and vectorized window assignment.

``window(col, size)`` tumbles, ``window(col, size, slide=...)`` hops,
``session_window(col, gap)`` groups a key's events separated by less than
``gap``. Windows are half-open ``[start, end)`` and aligned to the epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from microbatch.durations import parse_duration_ms
from microbatch.exceptions import PlanError
from microbatch.plan.columns import column_name


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
    column: str | pl.Expr,
    size: str | int,
    slide: str | int | None = None,
    *,
    allowed_lateness: str | int | None = None,
) -> WindowSpec:
    """A tumbling window of ``size`` on ``column``, hopping by ``slide`` when given.

    Windows are half-open ``[start, end)`` and aligned to the epoch; a row
    falls in one tumbling window, or in ``size / slide`` hopping windows. Use it
    in :meth:`Stream.group_by` (the aggregation adds ``window_start`` and
    ``window_end`` columns, typed like ``column``) or
    :meth:`Stream.join_window`. A window closes when the watermark reaches its
    end; in append mode its row is emitted then, once.

    Parameters
    ----------
    column
        The event-time column (a name or ``pl.col(name)``): a Datetime, a Date,
        or an integer of epoch milliseconds.
    size
        The window length: a duration string (``"10s"``, ``"5m"``, ``"1h30m"``),
        seconds, or a ``timedelta``.
    slide
        The hop between window starts (``None``: ``size``, tumbling). ``size``
        must be a whole multiple of ``slide``.
    allowed_lateness
        Keep a closed window's state that much longer: rows arriving within it
        update the window and, in append mode, the corrected row is emitted
        again with the next ``revision`` (an extra output column).

    Returns
    -------
    WindowSpec

    Raises
    ------
    PlanError
        When ``size`` or ``slide`` is not positive, ``size`` is not a multiple
        of ``slide``, or a duration cannot be parsed.

    Examples
    --------
    >>> mb.window("ts", "10m", "5m")
    WindowSpec(column='ts', size_ms=600000, slide_ms=300000, allowed_lateness_ms=0)

    Counts per 2-minute window, hopping by 1 minute (each row is in two
    windows):

    >>> from datetime import datetime
    >>> times = [(0, 10), (0, 50), (1, 20), (3, 0)]
    >>> events = pl.DataFrame({"ts": [datetime(2026, 1, 1, 0, m, s) for m, s in times]})
    >>> query = (
    ...     mb.read_memory(events)
    ...     .with_watermark("ts", "0s")
    ...     .group_by(mb.window("ts", "2m", "1m"))
    ...     .agg(pl.len().alias("n"))
    ...     .write_memory("doc_window_counts")
    ...     .start(trigger="available-now")
    ... )
    >>> query.await_termination()
    True
    >>> out = mb.table("doc_window_counts")
    >>> out.select(pl.col("window_start", "window_end").dt.strftime("%H:%M"), "n").rows()
    [('23:59', '00:01', 2), ('00:00', '00:02', 3), ('00:01', '00:03', 1)]

    The windows holding the 00:03 row are still open: the watermark (00:03)
    has not passed their end.

    With ``allowed_lateness`` a row for a closed window corrects it, as a new
    revision (here one row per batch, the last one late):

    >>> times = [(0, 10), (1, 30), (3, 0), (0, 40)]
    >>> events = pl.DataFrame({"ts": [datetime(2026, 1, 1, 0, m, s) for m, s in times]})
    >>> query = (
    ...     mb.read_memory(events, max_records_per_batch=1)
    ...     .with_watermark("ts", "0s")
    ...     .group_by(mb.window("ts", "1m", allowed_lateness="5m"))
    ...     .agg(pl.len().alias("n"))
    ...     .write_memory("doc_window_revisions")
    ...     .start(trigger="available-now")
    ... )
    >>> query.await_termination()
    True
    >>> out = mb.table("doc_window_revisions")
    >>> out.select(pl.col("window_start").dt.strftime("%H:%M"), "n", "revision").rows()
    [('00:00', 1, 0), ('00:01', 1, 0), ('00:00', 2, 1)]
    """
    column = column_name(column, "mb.window")
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


def session_window(column: str | pl.Expr, gap: str | int) -> SessionWindowSpec:
    """Session windows on ``column`` closed after ``gap`` without events.

    A row at ``t`` makes a session ``[t, t + gap)``; overlapping or touching
    sessions of a key merge. The aggregation's ``window_start`` is the first
    row's time and ``window_end`` the last row's time plus ``gap``. A session
    closes (and, in append mode, is emitted) when the watermark reaches its
    end. Sessions differ per key, so they cannot be used in ``join_window``.

    Parameters
    ----------
    column
        The event-time column (a name or ``pl.col(name)``): a Datetime, a Date,
        or an integer of epoch milliseconds.
    gap
        The inactivity that ends a session: a duration string (``"30s"``),
        seconds, or a ``timedelta``.

    Returns
    -------
    SessionWindowSpec

    Raises
    ------
    PlanError
        When ``gap`` is not positive or cannot be parsed.

    Examples
    --------
    >>> from datetime import datetime
    >>> times = [(0, 0), (0, 10), (0, 50), (5, 0)]
    >>> clicks = pl.DataFrame(
    ...     {
    ...         "ts": [datetime(2026, 1, 1, 0, m, s) for m, s in times],
    ...         "user": ["a", "a", "a", "b"],
    ...     }
    ... )
    >>> query = (
    ...     mb.read_memory(clicks)
    ...     .with_watermark("ts", "0s")
    ...     .group_by(mb.session_window("ts", "30s"), "user")
    ...     .agg(pl.len().alias("clicks"))
    ...     .write_memory("doc_sessions")
    ...     .start(trigger="available-now")
    ... )
    >>> query.await_termination()
    True
    >>> out = mb.table("doc_sessions")
    >>> span = pl.col("window_start", "window_end").dt.strftime("%M:%S")
    >>> out.select(span, "user", "clicks").rows()
    [('00:00', '00:40', 'a', 2), ('00:50', '01:20', 'a', 1)]

    User ``b``'s session (from 05:00) is still open: the watermark has not
    reached its end.
    """
    column = column_name(column, "mb.session_window")
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
