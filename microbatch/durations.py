"""Parsing of human duration strings (``"500ms"``, ``"10s"``, ``"1m"``, ``"2h"``, ``"1d"``)."""

from __future__ import annotations

import re
from datetime import timedelta

from microbatch.exceptions import DurationError
from microbatch.types import Duration

_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")


def parse_duration_ms(value: Duration, *, what: str = "duration", signed: bool = False) -> int:
    """Return ``value`` in whole milliseconds: the one duration parser.

    Accepts ``timedelta``, a number of seconds (also as a string: ``"0"``,
    ``"2.5"``), or a string of one or more ``<number><unit>`` parts with units
    ``ms``, ``s``, ``m``, ``h``, ``d`` (``"1m30s"``). With ``signed`` a leading
    ``-``/``+`` and negative numbers are allowed (interval-join bounds:
    ``"-10m"``). Raises :class:`DurationError` naming ``what`` otherwise.
    """
    if isinstance(value, timedelta):
        ms = int(value.total_seconds() * 1000)
        if ms < 0 and not signed:
            raise DurationError(f"{what}: must not be negative, got {value!r}")
        return ms
    if isinstance(value, bool):
        raise DurationError(f"{what}: expected a duration such as '10s', got {value!r}")
    if isinstance(value, int | float):
        if value < 0 and not signed:
            raise DurationError(f"{what}: must not be negative, got {value!r}")
        return int(value * 1000)
    text = str(value).strip().lower().replace(" ", "")
    try:  # a bare number is seconds, as a number argument is
        return parse_duration_ms(float(text), what=what, signed=signed)
    except ValueError:
        pass
    sign = 1
    if signed and text[:1] in ("-", "+"):
        sign, text = (-1 if text[0] == "-" else 1), text[1:]
    pos, total = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS_MS[match.group(2)]
        pos = match.end()
    if not text or pos != len(text):
        example = "'-10m', '0s', '+5s'" if signed else "'500ms', '10s', '1m', '2h', '1d' or '1m30s'"
        raise DurationError(
            f"{what}: cannot parse {value!r}; write a number and a unit, e.g. {example}"
        )
    return sign * int(total)


def format_duration_ms(ms: int) -> str:
    """Render milliseconds back in the shortest exact unit (``60000`` -> ``"1m"``)."""
    for unit in ("d", "h", "m", "s"):
        if ms and ms % _UNITS_MS[unit] == 0:
            return f"{ms // _UNITS_MS[unit]}{unit}"
    return f"{ms}ms"
