"""Parsing of human duration strings (``"500ms"``, ``"10s"``, ``"1m"``, ``"2h"``, ``"1d"``)."""

from __future__ import annotations

import re
from datetime import timedelta

from microbatch.exceptions import DurationError

_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")


def parse_duration_ms(value: str | int | float | timedelta, *, what: str = "duration") -> int:
    """Return ``value`` in whole milliseconds.

    Accepts ``timedelta``, a number of seconds, or a string of one or more
    ``<number><unit>`` parts with units ``ms``, ``s``, ``m``, ``h``, ``d``
    (``"1m30s"``). Raises :class:`DurationError` naming ``what`` otherwise.
    """
    if isinstance(value, timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, bool):
        raise DurationError(f"{what}: expected a duration such as '10s', got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise DurationError(f"{what}: must not be negative, got {value!r}")
        return int(value * 1000)
    text = str(value).strip().lower().replace(" ", "")
    pos, total = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS_MS[match.group(2)]
        pos = match.end()
    if not text or pos != len(text):
        raise DurationError(
            f"{what}: cannot parse {value!r}; write a number and a unit, "
            "e.g. '500ms', '10s', '1m', '2h', '1d' or '1m30s'"
        )
    return int(total)


def format_duration_ms(ms: int) -> str:
    """Render milliseconds back in the shortest exact unit (``60000`` -> ``"1m"``)."""
    for unit in ("d", "h", "m", "s"):
        if ms and ms % _UNITS_MS[unit] == 0:
            return f"{ms // _UNITS_MS[unit]}{unit}"
    return f"{ms}ms"
