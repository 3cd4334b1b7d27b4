"""Bulk decoding into a schema, shared by the file and Kafka sources.

The good path is one Polars call; only when it fails are the bad items found
by bisection (:func:`bisect_bad`), so every good item still decodes and each
bad one gets a reason. :func:`conform` casts a decoded frame to exactly the
schema and says, per row, why a row does not fit; :func:`castable` says
whether a typed column (Parquet) can be converted at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import polars as pl
from polars._typing import PolarsDataType

REASON_LIMIT = 300
"""Characters of an error message kept as a dead letter's reason."""
VALUE_LIMIT = 80
"""Characters of a value quoted in a reason."""
DECODE_ERRORS = (pl.exceptions.PolarsError, pl.exceptions.PanicException, ValueError, OSError)
"""Errors a decoder may raise on bad input. Polars raises ``PanicException`` (a
``BaseException``) on some malformed inputs; it must not escape as a crash."""
_T = TypeVar("_T")


def short_reason(exc: BaseException) -> str:
    """The first line of an error message, bounded (Polars appends long hints)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= REASON_LIMIT else text[: REASON_LIMIT - 3] + "..."


def bisect_bad(
    count: int, attempt: Callable[[int, int], _T]
) -> tuple[list[tuple[int, int, _T]], list[tuple[int, str]]]:
    """Run ``attempt`` on ``[0, count)``; on failure split the range and retry.

    Returns the good ranges with their results, in order, and the single
    items that fail on their own with the reason. One bulk call when all is
    well; ``O(bad * log(count))`` calls otherwise.
    """
    goods: list[tuple[int, int, _T]] = []
    bads: list[tuple[int, str]] = []
    stack = [(0, count)]
    while stack:
        lo, hi = stack.pop()
        if lo >= hi:
            continue
        try:
            goods.append((lo, hi, attempt(lo, hi)))
        except DECODE_ERRORS as exc:
            if hi - lo == 1:
                bads.append((lo, short_reason(exc)))
            else:
                mid = (lo + hi) // 2
                stack.extend([(mid, hi), (lo, mid)])
    return goods, bads


def conform(frame: pl.DataFrame, schema: pl.Schema) -> tuple[pl.DataFrame, pl.Series]:
    """Cast ``frame`` to exactly ``schema``.

    Returns the cast frame and, per row, the reason the row does not fit (the
    first column whose non-null value could not be converted), null when the
    row is good. Missing columns are null; extra columns are dropped.
    """
    if frame.schema == schema:  # nothing to convert, so nothing can fail
        return frame, _no_reasons(frame.height)
    columns: list[pl.Series] = []
    reasons: list[pl.Series] = []
    for name, dtype in schema.items():
        if name not in frame.columns:
            columns.append(pl.Series(name, [None] * frame.height, dtype=dtype))
            continue
        source = frame.get_column(name)
        converted = convert(source, dtype).alias(name)
        columns.append(converted)
        if source.dtype == dtype:
            continue
        failed = source.is_not_null() & converted.is_null()
        if failed.any():
            shown = source.cast(pl.String, strict=False).str.slice(0, VALUE_LIMIT)
            text = pl.select(
                pl.when(pl.lit(failed))
                .then(
                    pl.concat_str(
                        pl.lit(f"column {name!r}: cannot convert "),
                        pl.lit(shown).fill_null("?"),
                        pl.lit(f" to {dtype}"),
                    )
                )
                .otherwise(None)
            ).to_series()
            reasons.append(text)
    out = pl.DataFrame(columns) if columns else schema.to_frame()
    if not reasons:
        return out, _no_reasons(frame.height)
    first = pl.select(pl.coalesce([pl.lit(r) for r in reasons])).to_series().alias("reason")
    return out, first


def castable(source: PolarsDataType, target: PolarsDataType) -> bool:
    """Whether a column of type ``source`` has a conversion to ``target``.

    The conversions are those of text (JSON, CSV) carried over to typed
    columns: anything but a nested type to text; text (``String``,
    ``Categorical``, ``Enum``) to anything, value by value; numbers (integers,
    floats, decimals) to numbers; ``Date`` or ``Datetime`` to ``Datetime``;
    a type to itself (any time unit or zone of ``Datetime``); a list or array
    to a list or array of a castable inner type; a struct to a struct whose
    every field it has, of a castable type; an all-null column to anything.
    Refused: numbers to times (an epoch number is ambiguous: text formats
    refuse it too), times to numbers, booleans to or from numbers, nested to
    flat types. Values of a castable type may still not fit (``1.5`` for an
    integer, an overflow): :func:`conform` finds those per row.
    """
    if source == target or isinstance(source, pl.Null):
        return True
    if isinstance(source, pl.String | pl.Categorical | pl.Enum):
        return True
    if isinstance(target, pl.String):
        return not source.is_nested()
    if source.is_numeric() and target.is_numeric():
        return True
    if isinstance(target, pl.Datetime):
        return isinstance(source, pl.Date | pl.Datetime)
    if isinstance(source, pl.List | pl.Array) and isinstance(target, pl.List | pl.Array):
        return castable(source.inner, target.inner)
    if isinstance(source, pl.Struct) and isinstance(target, pl.Struct):
        fields = {f.name: f.dtype for f in source.fields}
        return all(f.name in fields and castable(fields[f.name], f.dtype) for f in target.fields)
    return False


def _no_reasons(n: int) -> pl.Series:
    return pl.repeat(None, n, dtype=pl.String, eager=True).alias("reason")


def convert(series: pl.Series, dtype: pl.DataType) -> pl.Series:
    """``series`` as ``dtype``; values that do not convert become null."""
    if series.dtype == dtype:
        return series
    if isinstance(series.dtype, pl.Categorical | pl.Enum):
        series = series.cast(pl.String)
    if series.dtype != pl.String:
        converted = series.cast(dtype, strict=False)
        if series.dtype.is_float() and dtype.is_integer():
            # a cast truncates 1.5 to 1: such a value does not fit, as "1.5" in JSON
            lossy = converted.cast(series.dtype) != series
            converted = converted.zip_with(~lossy.fill_null(False), converted.clear(len(series)))
        return converted
    text = series.str.strip_chars()
    if isinstance(dtype, pl.Datetime):
        return parse_datetime(text, dtype)
    if isinstance(dtype, pl.Date):
        return text.str.to_date("%Y-%m-%d", strict=False)
    if isinstance(dtype, pl.Boolean):
        return text.str.to_lowercase().replace_strict(
            {"true": True, "false": False}, default=None, return_dtype=pl.Boolean
        )
    if dtype.is_nested():
        return decode_nested(series, dtype)
    if isinstance(dtype, pl.Decimal):
        return parse_decimal(text, dtype)
    return text.cast(dtype, strict=False)


def parse_decimal(text: pl.Series, dtype: pl.Decimal) -> pl.Series:
    """Decimal text exactly; a value with more (non-zero) fractional digits than
    the scale does not fit (a cast would drop them: ``"12.345"`` -> ``12.34``)."""
    converted = text.cast(dtype, strict=False)
    digits = text.str.extract(r"^[+-]?\d*\.(\d*?)0*$").str.len_chars()
    lossy = (digits > (dtype.scale or 0)).fill_null(False)
    return converted.zip_with(~lossy, converted.clear(len(text)))


def parse_datetime(text: pl.Series, dtype: pl.Datetime) -> pl.Series:
    """ISO-8601 strings (``T`` or space; with ``Z``/offset, naive, or date only)."""
    unit = dtype.time_unit or "us"
    tz = dtype.time_zone
    iso = text.str.replace(r"^(\d{4}-\d{2}-\d{2}) ", "${1}T")
    aware = iso.str.to_datetime("%+", time_unit=unit, time_zone="UTC", strict=False)
    aware = aware.dt.convert_time_zone(tz) if tz else aware.dt.replace_time_zone(None)
    if aware.null_count() == text.null_count():
        return aware.alias(text.name)
    naive = pl.select(
        pl.coalesce(
            pl.lit(iso.str.to_datetime("%Y-%m-%dT%H:%M:%S%.f", time_unit=unit, strict=False)),
            pl.lit(iso.str.to_datetime("%Y-%m-%d", time_unit=unit, strict=False)),
        )
    ).to_series()
    if tz:
        naive = naive.dt.replace_time_zone(tz, ambiguous="earliest", non_existent="null")
    return pl.select(pl.coalesce(pl.lit(aware), pl.lit(naive))).to_series().alias(text.name)


def decode_nested(series: pl.Series, dtype: pl.DataType) -> pl.Series:
    """JSON text into a nested type; values that do not decode become null."""
    goods, _ = bisect_bad(len(series), lambda lo, hi: series[lo:hi].str.json_decode(dtype))
    if not goods:
        return pl.Series(series.name, [None] * len(series), dtype=dtype)
    parts: list[pl.Series] = []
    index = 0
    for lo, hi, decoded in goods:
        if lo > index:
            parts.append(pl.Series(series.name, [None] * (lo - index), dtype=dtype))
        parts.append(decoded.cast(dtype))
        index = hi
    if index < len(series):
        parts.append(pl.Series(series.name, [None] * (len(series) - index), dtype=dtype))
    return pl.concat(parts)
