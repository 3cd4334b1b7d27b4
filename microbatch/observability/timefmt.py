"""Times and durations written for people, shared by every view (CLI lines,
``microbatch status``, the report, the notebook view).

- a duration reads ``9.8 s``, ``4.1 min``, ``8 h 3 min`` or ``336 d 2 h``, never
  ``29002395.1 s``;
- an instant (a watermark, an event time) carries its date, in UTC, ISO 8601:
  ``2026-01-01T00:04:20Z``;
- a watermark lag of more than :data:`HISTORY_LAG_MS` says what it is: the event
  time of old data (a replay of history, a backfill), not a delay to alarm about.
"""

from __future__ import annotations

from datetime import UTC, datetime

HISTORY_LAG_MS = 24 * 3600 * 1000
"""A watermark further behind the wall clock than this is read as old data being
replayed (a live stream lagging a day has its own alarm: ``watermark_stalled``)."""

_MINUTE, _HOUR, _DAY = 60_000, 3_600_000, 86_400_000


def fmt_duration_ms(ms: float | None) -> str:
    """``9.8 s``, ``4.1 min``, ``8 h 3 min``, ``336 d 2 h``; ``-`` when unknown.

    Examples
    --------
    >>> fmt_duration_ms(9_800), fmt_duration_ms(250_000), fmt_duration_ms(29_002_395_100)
    ('9.8 s', '4.2 min', '335 d 16 h')
    >>> fmt_duration_ms(8 * 3_600_000 + 3 * 60_000)
    '8 h 3 min'
    """
    if not isinstance(ms, int | float):
        return "-"
    sign, ms = ("-" if ms < 0 else ""), abs(ms)
    if ms < 120_000:
        return f"{sign}{ms / 1000:,.1f} s"
    if ms < _HOUR:
        return f"{sign}{ms / _MINUTE:,.1f} min"
    if ms < _DAY:
        hours, rest = divmod(int(ms), _HOUR)
        return f"{sign}{hours} h {rest // _MINUTE} min"
    days, rest = divmod(int(ms), _DAY)
    return f"{sign}{days:,} d {rest // _HOUR} h"


def fmt_instant(ms: int | None) -> str | None:
    """Epoch milliseconds as an ISO-8601 UTC date and time to the second
    (``2026-01-01T00:04:20Z``); ``None`` stays ``None``."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_history(watermark_lag_ms: float | None) -> bool:
    """True when a watermark lag says the data is old (replayed history)."""
    return isinstance(watermark_lag_ms, int | float) and watermark_lag_ms > HISTORY_LAG_MS


def watermark_lag_text(lag_ms: float | None) -> str:
    """``lag 9.8 s``, or for replayed history ``event time 335 d 16 h behind the
    clock: old data``; ``-`` when unknown."""
    if not isinstance(lag_ms, int | float):
        return "-"
    if is_history(lag_ms):
        return f"event time {fmt_duration_ms(lag_ms)} behind the clock: old data"
    return f"lag {fmt_duration_ms(lag_ms)}"


def watermark_text(watermark_ms: int | None, now_ms: int | None) -> str:
    """``2026-01-01T00:04:20Z (lag 9.8 s)``: the watermark with its date and lag."""
    if watermark_ms is None:
        return "none"
    when = fmt_instant(watermark_ms)
    if now_ms is None:
        return str(when)
    return f"{when} ({watermark_lag_text(now_ms - watermark_ms)})"
