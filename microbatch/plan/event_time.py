"""What a query declares about event time: the watermark spec, and the epoch-ms
expression of an event-time column.

The spec is data (frozen, validated, recorded in plan descriptions); the logic
that computes watermarks from it lives in :mod:`microbatch.engine.watermark`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from microbatch.durations import parse_duration_ms
from microbatch.exceptions import PlanError

__all__ = ["WatermarkSpec", "event_time_ms"]


@dataclass(frozen=True)
class WatermarkSpec:
    """``with_watermark(column, delay, idle_timeout)`` as a validated spec."""

    column: str
    delay_ms: int
    idle_timeout_ms: int | None = None
    max_future_skew_ms: int | None = None
    """Rows with event time more than this after the batch's processing time
    do not advance the watermark (one clock-skewed device cannot make every
    other row late); they are still processed and counted."""
    processing_time: bool = False
    """The column is the batch's processing time (``with_processing_time``):
    the watermark is the batch's own recorded timestamp, not the rows' maxima."""

    @classmethod
    def parse(
        cls, column: str, delay: Any, idle_timeout: Any = None, max_future_skew: Any = None
    ) -> WatermarkSpec:
        if not isinstance(column, str) or not column:
            raise PlanError(f"with_watermark needs a column name, got {column!r}")
        return cls(
            column,
            parse_duration_ms(delay, what="with_watermark delay"),
            None if idle_timeout is None else parse_duration_ms(idle_timeout, what="idle_timeout"),
            None
            if max_future_skew is None
            else parse_duration_ms(max_future_skew, what="max_future_skew"),
        )


def event_time_ms(column: str, schema: pl.Schema) -> pl.Expr:
    """An Int64 epoch-milliseconds expression for an event-time column."""
    if column not in schema:
        raise PlanError(
            f"event-time column {column!r} is not in the stream; columns are {list(schema)}"
        )
    dtype = schema[column]
    if isinstance(dtype, pl.Datetime):
        return pl.col(column).dt.epoch("ms")
    if dtype == pl.Date:
        return pl.col(column).cast(pl.Datetime("ms")).dt.epoch("ms")
    if dtype.is_integer():
        return pl.col(column).cast(pl.Int64)
    raise PlanError(
        f"event-time column {column!r} has type {dtype}; it must be a Datetime, a Date, "
        "or an integer of epoch milliseconds. Cast it with .with_columns(...) first."
    )


def ms_to_time(expr: pl.Expr, dtype: pl.DataType) -> pl.Expr:
    """Epoch milliseconds (``expr``) as the event-time type ``dtype`` (the
    inverse of :func:`event_time_ms`): how window bounds are emitted."""
    if isinstance(dtype, pl.Datetime):
        ms = pl.from_epoch(expr, time_unit="ms")
        if dtype.time_zone:
            ms = ms.dt.replace_time_zone("UTC").dt.convert_time_zone(dtype.time_zone)
        return ms.dt.cast_time_unit(dtype.time_unit or "us")
    if dtype == pl.Date:
        return pl.from_epoch(expr, time_unit="ms").dt.date()
    return expr.cast(dtype)
