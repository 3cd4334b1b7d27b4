"""When batches run: a processing-time interval, once, or available-now.

Triggers are small frozen specs; the trigger loop in :mod:`microbatch.engine.execution`
interprets them.
"""

from __future__ import annotations

from dataclasses import dataclass

from microbatch.durations import format_duration_ms, parse_duration_ms
from microbatch.exceptions import DurationError, TriggerError


@dataclass(frozen=True)
class ProcessingTime:
    """Start a batch at every multiple of ``interval_ms`` of the wall clock.

    Ticks are aligned to interval boundaries, so batches do not drift. When a
    batch overruns its interval the next one starts at once and the progress
    record says the query is falling behind. ``0`` runs batches back to back.
    """

    interval_ms: int

    def __str__(self) -> str:
        return format_duration_ms(self.interval_ms) if self.interval_ms else "0s"


@dataclass(frozen=True)
class Once:
    """Run one batch over everything available now (after any batch left
    uncommitted by a crash), then stop."""

    def __str__(self) -> str:
        return "once"


@dataclass(frozen=True)
class AvailableNow:
    """Process everything available when the query starts, in batches capped
    by the sources' per-batch limits, then stop."""

    def __str__(self) -> str:
        return "available-now"


Trigger = ProcessingTime | Once | AvailableNow


def parse_trigger(value: str | Trigger | None) -> Trigger:
    """Turn ``"10s"``, ``"once"``, ``"available-now"`` (or a spec) into a trigger.

    ``None`` means ``ProcessingTime(0)``: batches back to back, as Spark does
    without a trigger.
    """
    if value is None:
        return ProcessingTime(0)
    if isinstance(value, ProcessingTime | Once | AvailableNow):
        return value
    text = str(value).strip().lower()
    if text == "once":
        return Once()
    if text in {"available-now", "availablenow", "available_now"}:
        return AvailableNow()
    try:
        return ProcessingTime(parse_duration_ms(text, what="trigger"))
    except DurationError:
        raise TriggerError(
            f"unknown trigger {value!r}: use an interval such as '10s' or '1m', "
            "'once' (one batch, then stop) or 'available-now' (all data available now, "
            "in capped batches, then stop)"
        ) from None
