"""Window specs and vectorized window assignment.

``window(col, size)`` tumbles, ``window(col, size, slide=...)`` hops,
``cumulate_window(col, size, step)`` grows from a fixed start by ``step`` up to
``size`` (Flink's ``CUMULATE``), ``session_window(col, gap)`` groups a key's
events separated by less than ``gap``. Windows are half-open ``[start, end)``
and aligned to the epoch.

Operators keep a window's identity in one Int64 column (``__ws``, its *key*):
the window start for tumbling and hopping windows, the window end for
cumulating ones (their windows share starts, never ends). ``start_of`` and
``end_of`` turn a key into the window's bounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from microbatch.durations import parse_duration_ms
from microbatch.exceptions import PlanError
from microbatch.plan.columns import column_name


@dataclass(frozen=True)
class WindowSpec:
    """A tumbling (``slide == size``), hopping or cumulating event-time window.

    A cumulating window (``cumulative=True``) has ``size_ms`` as its largest
    size and ``slide_ms`` as its step: from each start (a multiple of the
    size) it ends after one step, two steps, ... up to the size.
    """

    column: str
    size_ms: int
    slide_ms: int
    allowed_lateness_ms: int = 0
    cumulative: bool = False

    @property
    def is_tumbling(self) -> bool:
        return self.size_ms == self.slide_ms

    def start_of(self, key: pl.Expr) -> pl.Expr:
        """A window's start (epoch ms) from its key (see the module doc)."""
        if self.cumulative:
            return ((key - 1) // self.size_ms) * self.size_ms
        return key

    def end_of(self, key: pl.Expr) -> pl.Expr:
        """A window's end (epoch ms, exclusive) from its key (see the module doc)."""
        return key if self.cumulative else key + self.size_ms

    def describe(self) -> dict[str, object]:
        doc: dict[str, object] = {
            "kind": "cumulate_window" if self.cumulative else "window",
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
    >>> mb.window("ts", "10m", "5m").describe()
    {'kind': 'window', 'column': 'ts', 'size_ms': 600000, 'slide_ms': 300000}

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
    return _fixed_windows(
        column_name(column, "mb.window"), size, size if slide is None else slide,
        allowed_lateness, cumulative=False,
    )


def cumulate_window(
    column: str | pl.Expr,
    size: str | int,
    step: str | int,
    *,
    allowed_lateness: str | int | None = None,
) -> WindowSpec:
    """Cumulating windows on ``column``: from each start, one window per ``step``
    up to ``size`` (Flink SQL's ``CUMULATE``).

    The starts are aligned to the epoch every ``size``; from a start ``s`` the
    windows are ``[s, s + step)``, ``[s, s + 2*step)``, ... ``[s, s + size)``,
    so a row at ``t`` falls in every one of them that ends after ``t``. This
    is the daily total reported every hour: ``cumulate_window("ts", "1d",
    "1h")``. Each window closes, and in append mode is emitted once, when the
    watermark reaches its end, so the day's running total appears hour by
    hour, each row final. Use it in :meth:`Stream.group_by` (``window_start``,
    ``window_end`` columns, typed like ``column``) or :meth:`Stream.join_window`.

    Parameters
    ----------
    column
        The event-time column (a name or ``pl.col(name)``): a Datetime, a Date,
        or an integer of epoch milliseconds.
    size
        The largest window, and the distance between starts: a duration string
        (``"1d"``), seconds, or a ``timedelta``.
    step
        How much each window of a start grows; ``size`` must be a multiple.
    allowed_lateness
        As in :func:`window`: keep a closed window's state that much longer and
        emit corrected rows with the next ``revision``.

    Returns
    -------
    WindowSpec

    Raises
    ------
    PlanError
        When ``size`` or ``step`` is not positive, ``size`` is not a multiple
        of ``step``, or a duration cannot be parsed.

    Examples
    --------
    Counts over the first 1, 2 and 3 minutes of each 3-minute period:

    >>> from datetime import datetime
    >>> times = [(0, 10), (1, 20), (1, 50), (2, 30), (4, 0)]
    >>> events = pl.DataFrame({"ts": [datetime(2026, 1, 1, 0, m, s) for m, s in times]})
    >>> query = (
    ...     mb.read_memory(events)
    ...     .with_watermark("ts", "0s")
    ...     .group_by(mb.cumulate_window("ts", "3m", "1m"))
    ...     .agg(pl.len().alias("n"))
    ...     .write_memory("doc_cumulate")
    ...     .start(trigger="available-now")
    ... )
    >>> query.await_termination()
    True
    >>> out = mb.table("doc_cumulate")
    >>> out.select(pl.col("window_start", "window_end").dt.strftime("%H:%M"), "n").rows()
    [('00:00', '00:01', 1), ('00:00', '00:02', 3), ('00:00', '00:03', 4)]

    The 00:04 row's windows (from 00:03) are still open.
    """
    return _fixed_windows(
        column_name(column, "mb.cumulate_window"), size, step, allowed_lateness,
        cumulative=True,
    )


def _fixed_windows(
    column: str,
    size: str | int,
    step: str | int,
    allowed_lateness: str | int | None,
    *,
    cumulative: bool,
) -> WindowSpec:
    """The spec of :func:`window` (``step`` is the slide) or :func:`cumulate_window`,
    its durations parsed and checked."""
    what = "cumulate window" if cumulative else "window"
    step_name = "step" if cumulative else "slide"
    size_ms = parse_duration_ms(size, what=f"{what} size")
    step_ms = parse_duration_ms(step, what=f"{what} {step_name}")
    if size_ms <= 0 or step_ms <= 0:
        raise PlanError(
            f"{what} size and {step_name} must be positive, got {size!r} / {step!r}"
        )
    if size_ms % step_ms:
        raise PlanError(
            f"{what} size {size!r} is not a multiple of {step_name} {step!r}; choose a "
            f"{step_name} that divides the size (e.g. size '1h', {step_name} '5m')"
        )
    lateness = (
        0
        if allowed_lateness is None
        else parse_duration_ms(allowed_lateness, what="allowed_lateness")
    )
    return WindowSpec(column, size_ms, step_ms, lateness, cumulative=cumulative)


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
    """Add ``__ws`` (the window's key, epoch ms): one row per (row, window) it falls in.

    Tumbling: ``floor(t / size) * size``. Hopping: the ``size / slide``
    windows whose start is ``floor(t / slide) * slide - i * slide``.
    Cumulating (keyed by end): the ends ``floor(t / step) * step + step``, one
    step more, ... up to the row's start plus the size. Vectorized.
    """
    last_start = (pl.col(ts_ms) // spec.slide_ms) * spec.slide_ms
    if spec.cumulative:
        first_end = last_start + spec.slide_ms
        last_end = (pl.col(ts_ms) // spec.size_ms) * spec.size_ms + spec.size_ms
        steps = (last_end - first_end) // spec.slide_ms + 1
        return lf.with_columns(
            (first_end + pl.int_ranges(0, steps, dtype=pl.Int64) * spec.slide_ms).alias("__ws")
        ).explode("__ws")
    if spec.is_tumbling:
        return lf.with_columns(last_start.alias("__ws"))
    k = spec.size_ms // spec.slide_ms
    return lf.with_columns(
        (last_start - pl.int_ranges(0, k, dtype=pl.Int64) * spec.slide_ms).alias("__ws")
    ).explode("__ws")
