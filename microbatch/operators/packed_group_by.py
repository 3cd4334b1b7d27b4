"""``group_by([window start, key])`` through one packed Int64 key when it fits.

Polars groups by one integer column much faster than by two (the in-memory
engine row-encodes multi-column keys: ~80 ms against ~50 ms for 1M rows and
85k groups here). Window starts are multiples of the window's slide, so a
batch's windows are a small range of slide indices; with one integer key
whose range is known, ``index << bits | key - low`` is a unique Int64 per
(window, key). The result is the same groups with the same aggregates (each
group's rows are aggregated in the same row order); only the order of the
groups differs, which no caller relies on.

Falls back to the plain two-column ``group_by`` when there is no single
integer key, the key has nulls, or the ranges do not fit in 62 bits.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

__all__ = ["fits_int64", "group_by_window_and_key"]

_PACK = "__packed"


def group_by_window_and_key(
    frame: pl.DataFrame,
    window: str,
    keys: Sequence[str],
    slide_ms: int,
    aggs: Sequence[pl.Expr],
) -> pl.DataFrame:
    """``frame.group_by([window, *keys]).agg(aggs)``, packed when it fits (see module)."""
    plan = _packing(frame, window, keys, slide_ms)
    if plan is None:
        return frame.group_by([window, *keys]).agg(aggs)
    key, window_low, key_low, bits = plan
    dtype = frame.schema[key]
    packed = (
        ((pl.col(window) - window_low) // slide_ms) * (1 << bits)
        + (pl.col(key).cast(pl.Int64) - key_low)
    ).alias(_PACK)
    grouped = frame.group_by(packed).agg(aggs)
    return grouped.select(
        ((pl.col(_PACK) // (1 << bits)) * slide_ms + window_low).alias(window),
        ((pl.col(_PACK) % (1 << bits)) + key_low).cast(dtype).alias(key),
        pl.exclude(_PACK),
    )


def fits_int64(dtype: pl.DataType) -> bool:
    """An integer type whose every value fits an Int64 (a key that can be packed)."""
    return dtype.is_integer() and dtype != pl.UInt64


def _packing(
    frame: pl.DataFrame, window: str, keys: Sequence[str], slide_ms: int
) -> tuple[str, int, int, int] | None:
    """(key, lowest window start, lowest key, bits for the key), or None."""
    if len(keys) != 1 or frame.height == 0:
        return None
    key = keys[0]
    dtype = frame.schema[key]
    if not fits_int64(dtype):
        return None
    column = frame.get_column(key)
    if column.null_count() or frame.get_column(window).null_count():
        return None
    bounds = frame.select(
        pl.col(window).min().alias("w0"), pl.col(window).max().alias("w1"),
        pl.col(key).cast(pl.Int64).min().alias("k0"), pl.col(key).cast(pl.Int64).max().alias("k1"),
    ).row(0)
    w0, w1, k0, k1 = (int(v) for v in bounds)
    bits = (k1 - k0).bit_length()
    windows = (w1 - w0) // slide_ms + 1
    if bits + windows.bit_length() > 62:
        return None
    return key, w0, k0, bits
