"""A batch's partial aggregates per (window, keys) on Polars' streaming engine,
the same bits under any row order.

Polars' streaming engine groups 2-2.5x faster than the in-memory engine (it
runs on every thread; the in-memory engine's single-threaded path, which
:mod:`microbatch.frames` forces, builds an index list per group), but it
folds each morsel apart and combines the per-morsel results in the order the
threads finish. Counts, integer sums and integer min/max are exact, so no order
can change them. A float sum is made exact too: every value of the batch is a
multiple of ``2**b0`` (``b0``: 53 bits below the smallest non-zero magnitude),
so ``x * 2**-b0`` is an integer, exactly, and the group's sum of those integers
in Int128 is the exact sum of its values, whatever the order. It is rounded to
Float64 once, at the end: a batch's partial sum is the correctly rounded sum of
its values (the value ``math.fsum`` gives), a function of the group's values
alone, neither of their order nor of the other rows of the batch.

``exact_window_partials`` returns ``None`` when an aggregate has no exact form
here (``first``/``last``, ``min``/``max`` of floats, a sum of a column that is
neither an integer nor Float64, a float column holding NaN or infinity, or
magnitudes too far apart for Int128); the caller then runs the in-memory
``group_by``, as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from microbatch.frames import collect_exact
from microbatch.operators.packed_group_by import fits_int64
from microbatch.plan.aggregates import AggSpec
from microbatch.plan.event_time import event_time_ms
from microbatch.plan.windows import WindowSpec

__all__ = ["exact_window_partials"]

_PACK = "__packed"
_INT128_BITS = 126
"""Magnitude bits an Int128 sum may use (one short of the sign bit, one spare)."""
_LOWEST_SCALE = -1000
"""``b0`` below this (values near the subnormal range) is refused: ``2**-b0``
must be a finite Float64."""


@dataclass(frozen=True)
class _Sum:
    """A Float64 column summed as Int128 multiples of ``2**scale``."""

    column: pl.Expr
    scale: int


def exact_window_partials(
    df: pl.DataFrame,
    live: pl.LazyFrame,
    *,
    window_column: str,
    spec: WindowSpec,
    keys: Sequence[str],
    aggs: Sequence[AggSpec],
) -> pl.DataFrame | None:
    """``live.group_by([window_column, *keys]).agg(partials of aggs)`` on the streaming
    engine, with the types of the in-memory result; ``None`` when not exact (see module).

    ``df`` is the batch ``live`` was derived from (its rows bound the values:
    ``live``'s rows are a subset of its rows, each in at most one row of a group).
    """
    schema = df.schema
    if df.height == 0 or any(not _exact(a, schema) for a in aggs):
        return None
    floats = sorted({a.column for a in aggs if a.column is not None and _float_sum(a, schema)})
    stats = df.select(*_stats(floats, keys, spec, schema)).row(0, named=True)
    scales = {c: _scale(stats, i, df.height) for i, c in enumerate(floats)}
    if any(s is None for s in scales.values()):
        return None
    exprs: list[pl.Expr] = []
    finals: list[pl.Expr] = []
    for agg in aggs:
        for name, expr in zip(agg.partial_names(), _partials(agg, schema, scales), strict=True):
            if isinstance(expr, _Sum):
                exprs.append((expr.column * 2.0**-expr.scale).cast(pl.Int128).sum().alias(name))
                finals.append((pl.col(name).cast(pl.Float64) * 2.0**expr.scale).alias(name))
            else:
                exprs.append(expr.alias(name))
                finals.append(pl.col(name))
    packing = _packing(stats, keys, spec, schema)
    if packing is None:
        grouped = collect_exact(live.group_by([window_column, *keys]).agg(exprs).select(
            window_column, *keys, *finals))
    else:
        key, low, key_low, bits = packing
        packed = (
            ((pl.col(window_column) - low) // spec.slide_ms) * (1 << bits)
            + (pl.col(key).cast(pl.Int64) - key_low)
        ).alias(_PACK)
        grouped = collect_exact(live.group_by(packed).agg(exprs).select(
            ((pl.col(_PACK) // (1 << bits)) * spec.slide_ms + low).alias(window_column),
            ((pl.col(_PACK) % (1 << bits)) + key_low).cast(schema[key]).alias(key),
            *finals,
        ))
    dtypes = {n: t for a in aggs for n, t in a.partial_dtypes(schema).items()}
    return grouped.with_columns(pl.col(n).cast(t) for n, t in dtypes.items())


def _float_sum(agg: AggSpec, schema: pl.Schema) -> bool:
    """``agg`` sums a column as Float64 (a Float64 ``sum``, any numeric ``mean``)."""
    dtype = schema.get(agg.column or "")
    if agg.kind == "sum":
        return dtype == pl.Float64
    return agg.kind == "mean" and dtype is not None and (dtype.is_integer() or dtype == pl.Float64)


def _exact(agg: AggSpec, schema: pl.Schema) -> bool:
    """Every partial of ``agg`` has an order-independent form here."""
    if agg.kind in {"len", "count"}:
        return True
    dtype = schema.get(agg.column or "")
    if dtype is None:
        return False
    if agg.kind in {"sum", "min", "max"} and dtype.is_integer():
        return True
    return _float_sum(agg, schema)


def _partials(
    agg: AggSpec, schema: pl.Schema, scales: dict[str, int | None]
) -> list[pl.Expr | _Sum]:
    """``agg.partials(schema)``, with each Float64 sum as an exact :class:`_Sum`."""
    if agg.kind == "len" or agg.column is None:
        return [pl.len().cast(pl.Int64)]
    col = pl.col(agg.column)
    scale = scales.get(agg.column)
    match agg.kind:
        case "count":
            return [col.count().cast(pl.Int64)]
        case "sum" if scale is None:
            return [col.sum()]
        case "min":
            return [col.min()]
        case "max":
            return [col.max()]
        case "sum" | "mean":
            assert scale is not None
            exact = _Sum(col.cast(pl.Float64), scale)
            return [exact] if agg.kind == "sum" else [exact, col.count().cast(pl.Int64)]
    raise AssertionError(agg.kind)


def _stats(
    floats: list[str], keys: Sequence[str], spec: WindowSpec, schema: pl.Schema
) -> list[pl.Expr]:
    """One pass over the batch: event-time and key bounds (for packing), and the
    ``i``-th float column's largest and smallest non-zero magnitude and non-finite
    count (``hi{i}``, ``lo{i}``, ``bad{i}``)."""
    t = event_time_ms(spec.column, schema)
    exprs = [t.min().alias("t0"), t.max().alias("t1")]
    if len(keys) == 1 and fits_int64(schema[keys[0]]):
        k = pl.col(keys[0]).cast(pl.Int64)
        exprs += [k.min().alias("k0"), k.max().alias("k1"), k.null_count().alias("k_nulls")]
    for i, c in enumerate(floats):
        x = pl.col(c).cast(pl.Float64)
        exprs += [
            x.abs().max().alias(f"hi{i}"),
            x.abs().filter(x != 0).min().alias(f"lo{i}"),
            (~x.is_finite()).sum().alias(f"bad{i}"),
        ]
    return exprs


def _scale(stats: dict[str, Any], i: int, rows: int) -> int | None:
    """``b0`` for the ``i``-th float column: every value is a multiple of ``2**b0``,
    and ``rows`` values of magnitude below its largest sum in Int128 without overflow."""
    hi, lo, bad = stats[f"hi{i}"], stats[f"lo{i}"], stats[f"bad{i}"]
    if bad:
        return None
    if hi is None or lo is None:  # only zeros and nulls: every sum is 0
        return 0
    b0 = math.frexp(lo)[1] - 53  # lo >= 2**(e-1): its lowest bit (and every larger value's)
    top = math.frexp(hi)[1]  # every |x| < 2**top
    if b0 < _LOWEST_SCALE or top - b0 + rows.bit_length() > _INT128_BITS:
        return None
    return b0


def _packing(
    stats: dict[str, Any], keys: Sequence[str], spec: WindowSpec, schema: pl.Schema
) -> tuple[str, int, int, int] | None:
    """(key, lowest window value, lowest key, bits for the key) for one Int64 group
    key ``index << bits | key - low``, or ``None`` (two-column ``group_by``).

    The window column's values are multiples of the slide within a window size of
    the batch's event times (a tumbling or hopping window's start, a cumulating
    window's end).
    """
    t0, t1 = stats["t0"], stats["t1"]
    if len(keys) != 1 or stats.get("k_nulls", 1) or t0 is None or t1 is None:
        return None
    k0, k1 = int(stats["k0"]), int(stats["k1"])
    low = ((t0 - spec.size_ms) // spec.slide_ms) * spec.slide_ms  # a multiple of the slide
    windows = (t1 + spec.size_ms - low) // spec.slide_ms + 1
    bits = (k1 - k0).bit_length()
    if bits + windows.bit_length() > 62:
        return None
    return keys[0], low, k0, bits
