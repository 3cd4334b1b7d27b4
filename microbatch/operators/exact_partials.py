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

``exact_window_partials`` (a batch's rows to partials) and
``exact_window_merge`` (the partial rows of a closing window to one row each,
the same way) return ``None`` when an aggregate has no exact form here
(``first``/``last``, ``min``/``max`` of floats, a sum of a column that is
neither an integer nor Float64, a float column holding NaN or infinity, or
magnitudes too far apart for Int128); the caller then runs the in-memory
``group_by``, as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import polars as pl

from microbatch.frames import collect, collect_exact
from microbatch.operators.packed_group_by import fits_int64
from microbatch.plan.aggregates import AggSpec
from microbatch.plan.event_time import event_time_ms
from microbatch.plan.windows import WindowSpec

__all__ = ["exact_window_merge", "exact_window_partials"]

_PACK = "__packed"
_INT128_BITS = 126
"""Magnitude bits an Int128 sum may use (one short of the sign bit, one spare)."""
_LOWEST_SCALE = -1000
"""``b0`` below this (values near the subnormal range) is refused: ``2**-b0``
must be a finite Float64."""


def exact_window_partials(
    df: pl.DataFrame,
    live: pl.LazyFrame,
    *,
    window_column: str,
    spec: WindowSpec,
    keys: Sequence[str],
    aggs: Sequence[AggSpec],
    streaming: bool = True,
) -> pl.DataFrame | None:
    """``live.group_by([window_column, *keys]).agg(partials of aggs)`` on the streaming
    engine (the in-memory one with ``streaming=False``: the same bits, faster on
    small frames), with the types of the in-memory result; ``None`` when not exact
    (see module).

    ``df`` is the batch ``live`` was derived from (its rows bound the values:
    ``live``'s rows are a subset of its rows, each in at most one row of a group).
    """
    outputs = [_partials(a, df.schema) for a in aggs]
    if df.height == 0 or any(o is None for o in outputs):
        return None
    t = event_time_ms(spec.column, df.schema)
    # window values (a tumbling or hopping start, a cumulating end) are multiples of
    # the slide within a window size of the event times
    low = ((t.min() - spec.size_ms) // spec.slide_ms) * spec.slide_ms
    dtypes = {n: d for a in aggs for n, d in a.partial_dtypes(df.schema).items()}
    return _exact_group_by(
        df, live, window_column=window_column, spec=spec, keys=keys,
        outputs=[e for o in outputs if o is not None for e in o],
        window_bounds=(low, t.max() + spec.size_ms), dtypes=dtypes, streaming=streaming,
    )


def exact_window_merge(
    partials: pl.DataFrame,
    *,
    window_column: str,
    spec: WindowSpec,
    keys: Sequence[str],
    aggs: Sequence[AggSpec],
    constant: Sequence[str] = (),
    streaming: bool = True,
) -> pl.DataFrame | None:
    """Partial rows of ``aggs`` merged per (window, keys) on the streaming engine
    (``AggSpec.merges``, exactly); each ``constant`` column (one value per group)
    kept; ``None`` when not exact (see module)."""
    outputs = [_merges(a, partials.schema) for a in aggs]
    if partials.height == 0 or any(o is None for o in outputs):
        return None
    # NOTE: min() of a column constant per group is its first(), in any order
    merged = [e for o in outputs if o is not None for e in o]
    merged += [_Out("min", c, c) for c in constant]
    ws = pl.col(window_column)
    return _exact_group_by(
        partials, partials.lazy(), window_column=window_column, spec=spec, keys=keys,
        outputs=merged, window_bounds=(ws.min(), ws.max()), dtypes=dict(partials.schema),
        streaming=streaming,
    )


@dataclass(frozen=True)
class _Out:
    """One output of an exact ``group_by``: ``op`` of ``column`` as ``name``.

    ``fsum`` sums the column as Float64, exactly (Int128 multiples of ``2**b0``);
    ``isum``, ``min`` and ``max`` are over integers; ``len`` counts rows.
    """

    op: Literal["len", "count", "isum", "fsum", "min", "max"]
    column: str | None
    name: str


def _partials(agg: AggSpec, schema: pl.Schema) -> list[_Out] | None:
    """``agg.partials(schema)`` as exact outputs, or ``None``."""
    names = agg.partial_names()
    dtype = schema.get(agg.column or "")
    if agg.kind == "len":
        return [_Out("len", None, names[0])]
    if agg.kind == "count":
        return [_Out("count", agg.column, names[0])]
    if dtype is None:
        return None
    integer = dtype.is_integer()
    if agg.kind == "sum" and (integer or dtype == pl.Float64):
        return [_Out("isum" if integer else "fsum", agg.column, names[0])]
    if agg.kind == "mean" and (integer or dtype == pl.Float64):
        return [_Out("fsum", agg.column, names[0]), _Out("count", agg.column, names[1])]
    if agg.kind in {"min", "max"} and integer:
        return [_Out("min" if agg.kind == "min" else "max", agg.column, names[0])]
    return None  # first/last (ordered), float min/max (-0.0 vs 0.0), other types


def _merges(agg: AggSpec, schema: pl.Schema) -> list[_Out] | None:
    """``agg.merges()`` over partial columns of ``schema`` as exact outputs, or ``None``."""
    outs: list[_Out] = []
    for name, kind in zip(agg.partial_names(), _merge_kinds(agg), strict=True):
        dtype = schema.get(name)
        if kind is None or dtype is None:
            return None
        if kind == "sum" and dtype.is_integer():
            outs.append(_Out("isum", name, name))
        elif kind == "sum" and dtype == pl.Float64:
            outs.append(_Out("fsum", name, name))
        elif kind in {"min", "max"} and dtype.is_integer():
            outs.append(_Out("min" if kind == "min" else "max", name, name))
        else:
            return None
    return outs


def _merge_kinds(agg: AggSpec) -> list[str | None]:
    """How each partial of ``agg`` merges (:meth:`AggSpec.merges`); ``None``: ordered."""
    match agg.kind:
        case "len" | "count" | "sum":
            return ["sum"]
        case "mean":
            return ["sum", "sum"]
        case "min" | "max":
            return [agg.kind]
    return [None, None]


def _exact_group_by(
    df: pl.DataFrame,
    lf: pl.LazyFrame,
    *,
    window_column: str,
    spec: WindowSpec,
    keys: Sequence[str],
    outputs: list[_Out],
    window_bounds: tuple[pl.Expr, pl.Expr],
    dtypes: dict[str, pl.DataType],
    streaming: bool = True,
) -> pl.DataFrame | None:
    """``lf.group_by([window_column, *keys]).agg(outputs)`` on the streaming engine,
    cast to ``dtypes``; ``df``'s rows bound ``lf``'s values (see the callers)."""
    schema = df.schema
    floats = sorted({o.column for o in outputs if o.op == "fsum" and o.column is not None})
    stats = df.select(*_stats(floats, keys, window_bounds, schema)).row(0, named=True)
    scales = [_scale(stats, i, df.height) for i in range(len(floats))]
    if any(s is None for s in scales):
        return None
    scale = dict(zip(floats, scales, strict=True))
    exprs: list[pl.Expr] = []
    finals: list[pl.Expr] = []
    for out in outputs:
        col = pl.col(out.column) if out.column is not None else None
        if out.op == "fsum" and col is not None and out.column is not None:
            b0 = scale[out.column]
            assert b0 is not None
            exprs.append((col.cast(pl.Float64) * 2.0**-b0).cast(pl.Int128).sum().alias(out.name))
            finals.append((pl.col(out.name).cast(pl.Float64) * 2.0**b0).alias(out.name))
            continue
        exprs.append(_exact_partial(out.op, col).alias(out.name))
        finals.append(pl.col(out.name))
    packing = _packing(stats, keys, spec)
    run = collect_exact if streaming else collect
    if packing is None:
        grouped = run(lf.group_by([window_column, *keys]).agg(exprs).select(
            window_column, *keys, *finals))
    else:
        key, low, key_low, bits = packing
        packed = (
            ((pl.col(window_column) - low) // spec.slide_ms) * (1 << bits)
            + (pl.col(key).cast(pl.Int64) - key_low)
        ).alias(_PACK)
        grouped = run(lf.group_by(packed).agg(exprs).select(
            ((pl.col(_PACK) // (1 << bits)) * spec.slide_ms + low).alias(window_column),
            ((pl.col(_PACK) % (1 << bits)) + key_low).cast(schema[key]).alias(key),
            *finals,
        ))
    return grouped.with_columns(
        pl.col(n).cast(d) for n, d in dtypes.items() if n in grouped.columns
    )


def _stats(
    floats: list[str], keys: Sequence[str], window_bounds: tuple[pl.Expr, pl.Expr],
    schema: pl.Schema,
) -> list[pl.Expr]:
    """One pass over the rows: the bounds of the window values and of the key (for
    packing), and the ``i``-th float column's largest and smallest non-zero
    magnitude and non-finite count (``hi{i}``, ``lo{i}``, ``bad{i}``)."""
    exprs = [window_bounds[0].alias("w0"), window_bounds[1].alias("w1")]
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
    stats: dict[str, Any], keys: Sequence[str], spec: WindowSpec
) -> tuple[str, int, int, int] | None:
    """(key, lowest window value, lowest key, bits for the key) for one Int64 group
    key ``index << bits | key - low``, or ``None`` (two-column ``group_by``).
    ``w0`` (a multiple of the slide) and ``w1`` bound the window values."""
    w0, w1 = stats["w0"], stats["w1"]
    if len(keys) != 1 or stats.get("k_nulls", 1) or w0 is None or w1 is None:
        return None
    k0, k1 = int(stats["k0"]), int(stats["k1"])
    windows = (w1 - w0) // spec.slide_ms + 1
    bits = (k1 - k0).bit_length()
    if bits + windows.bit_length() > 62:
        return None
    return keys[0], w0, k0, bits


# ------------------------------------------------------------ map-side combine

_WIRE_INT128 = pl.Decimal(38, 0)
"""How an Int128 partial travels in Arrow (which has no Int128): every value here
is below ``2**126`` in magnitude, inside Decimal(38, 0)'s range."""


@dataclass(frozen=True)
class CombinePlan:
    """How an aggregation's partials are computed on a slice of a batch's rows
    (the map side of a scaled-out query) and merged into the batch's partials
    (the reduce side), giving exactly the partials the whole batch's rows give.

    Integer sums, counts and integer min/max merge exactly in any grouping. A
    Float64 sum (or mean) travels as its Int128 multiple of ``2**b`` (``b`` the
    slice's own scale, recorded in its facts): the reduce side shifts every slice
    to the smallest ``b``, adds in Int128 and rounds once, which is the exact
    path's result over the same rows (``fsum`` only where the operator sums
    floats on the exact path, see :func:`combine_plan`)."""

    keys: tuple[str, ...]
    outputs: tuple[_Out, ...]
    dtypes: dict[str, pl.DataType]
    floats: tuple[str, ...]


def combine_plan(
    aggs: Sequence[AggSpec], schema: pl.Schema, keys: Sequence[str], *, floats: bool
) -> CombinePlan | None:
    """The combine plan of ``aggs`` over rows of ``schema`` grouped by ``keys``, or
    ``None`` when some aggregate's partial depends on how rows are grouped
    (``first``/``last``, float min/max, a float sum when ``floats`` is false: the
    operator sums floats in row order there)."""
    outputs: list[_Out] = []
    for agg in aggs:
        got = _partials(agg, schema)
        if got is None or (not floats and any(o.op == "fsum" for o in got)):
            return None
        outputs += got
    dtypes = {n: d for a in aggs for n, d in a.partial_dtypes(schema).items()}
    used = sorted({o.column for o in outputs if o.op == "fsum" and o.column is not None})
    return CombinePlan(tuple(keys), tuple(outputs), dtypes, tuple(used))


def slice_partials(
    plan: CombinePlan, df: pl.DataFrame, live: pl.LazyFrame
) -> tuple[pl.DataFrame, dict[str, Any]] | None:
    """A slice's partials per group of ``live`` (derived from the slice's rows
    ``df``, late rows included, as :func:`exact_window_partials` is) and its facts
    (rows, and per float column its magnitudes and scale); ``None`` when a float
    column holds NaN or infinity or magnitudes too far apart (the rows must travel)."""
    facts: dict[str, Any] = {"rows": df.height, "floats": {}}
    scale: dict[str, int] = {}
    if plan.floats and df.height:
        stats = df.select(*_stats(list(plan.floats), (), (pl.lit(0), pl.lit(0)),
                                  df.schema)).row(0, named=True)
        for i, column in enumerate(plan.floats):
            b0 = _scale(stats, i, df.height)
            if b0 is None:
                return None
            scale[column] = b0
            facts["floats"][column] = {"hi": stats[f"hi{i}"], "lo": stats[f"lo{i}"], "b": b0}
    exprs: list[pl.Expr] = []
    for out in plan.outputs:
        col = pl.col(out.column) if out.column is not None else None
        if out.op == "fsum" and col is not None:
            b0 = scale.get(out.column or "", 0)
            exprs.append((col.cast(pl.Float64) * 2.0**-b0).cast(pl.Int128).sum()
                         .cast(_WIRE_INT128).alias(out.name))
        else:
            exprs.append(_exact_partial(out.op, col).alias(out.name))
    grouped = collect(live.group_by(list(plan.keys), maintain_order=True).agg(exprs))
    fsums = {o.name for o in plan.outputs if o.op == "fsum"}
    return grouped.with_columns(
        pl.col(n).cast(d) for n, d in plan.dtypes.items() if n in grouped.columns
        and n not in fsums
    ), facts


def merge_slice_partials(
    plan: CombinePlan, parts: Sequence[tuple[pl.DataFrame, dict[str, Any]]]
) -> pl.DataFrame | None:
    """The batch's partials (one row per group, groups in order of first
    appearance) from its slices' (in slice order); ``None`` when the rows of all
    slices together have float magnitudes too far apart for the exact path (the
    rows must travel: the operator sums them its other way)."""
    rows = sum(f["rows"] for _, f in parts)
    shifted: list[pl.DataFrame] = []
    scale: dict[str, int] = {}
    for column in plan.floats:
        seen = [f["floats"][column] for _, f in parts if column in f["floats"]]
        his = [s["hi"] for s in seen if s["hi"] is not None]
        los = [s["lo"] for s in seen if s["lo"] is not None]
        stats = {"hi0": max(his, default=None), "lo0": min(los, default=None), "bad0": 0}
        b0 = _scale(stats, 0, rows) if rows else 0
        if b0 is None:
            return None
        scale[column] = b0
    fsum = {o.name: o.column for o in plan.outputs if o.op == "fsum"}
    for frame, facts in parts:
        shifted.append(frame.with_columns(
            (pl.col(name).cast(pl.Int128)
             * pl.lit(2 ** (facts["floats"].get(column, {}).get("b", scale[column])
                            - scale[column]), pl.Int128)).alias(name)
            for name, column in fsum.items() if column is not None
        ))
    both = pl.concat(shifted, how="vertical", rechunk=True)
    exprs: list[pl.Expr] = []
    for out in plan.outputs:
        if out.op in {"len", "count", "isum", "fsum"}:
            exprs.append(pl.col(out.name).sum())
        elif out.op == "min":
            exprs.append(pl.col(out.name).min())
        else:
            exprs.append(pl.col(out.name).max())
    merged = collect(both.lazy().group_by(list(plan.keys), maintain_order=True).agg(exprs))
    return merged.with_columns(
        *[(pl.col(name).cast(pl.Float64) * 2.0 ** scale[column]).alias(name)
          for name, column in fsum.items() if column is not None],
    ).with_columns(pl.col(n).cast(d) for n, d in plan.dtypes.items() if n in merged.columns)


def _exact_partial(op: str, col: pl.Expr | None) -> pl.Expr:
    """The partial of an aggregate that is exact in any grouping (counts, integer
    sums, mins, maxes; a row count without a column)."""
    match op, col:
        case "count", pl.Expr():
            return col.count().cast(pl.Int64)
        case "isum", pl.Expr():
            return col.sum()
        case "min", pl.Expr():
            return col.min()
        case "max", pl.Expr():
            return col.max()
        case _:
            return pl.len().cast(pl.Int64)
