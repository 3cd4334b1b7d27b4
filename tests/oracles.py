"""One-shot Polars computations of what a stream must produce (the oracles)."""

from __future__ import annotations

import polars as pl


def tumbling_or_hopping(
    rows: pl.DataFrame,
    *,
    time: str,
    keys: list[str],
    size_ms: int,
    slide_ms: int,
    aggs: list[pl.Expr],
    by_row: bool = False,
) -> pl.DataFrame:
    """Every (window, keys) aggregate over ``rows``, windows as epoch ms
    (``by_row``: the (row, window) assignments, not aggregated)."""
    k = size_ms // slide_ms
    t = pl.col(time).dt.epoch("ms")
    last = (t // slide_ms) * slide_ms
    assigned = rows.with_columns(
        (last - pl.int_ranges(0, k, dtype=pl.Int64) * slide_ms).alias("ws")
    ).explode("ws")
    if by_row:
        return assigned.with_columns((pl.col("ws") + size_ms).alias("we"))
    return (
        assigned.group_by(["ws", *keys], maintain_order=True)
        .agg(aggs)
        .with_columns((pl.col("ws") + size_ms).alias("we"))
    )


def sessions(
    rows: pl.DataFrame, *, time: str, keys: list[str], gap_ms: int, aggs: list[pl.Expr]
) -> pl.DataFrame:
    """Sessions per key: sorted by time, a new one where start > running end."""
    t = pl.col(time).dt.epoch("ms")
    return (
        rows.with_columns(t.alias("__t"))
        .sort([*keys, "__t"], maintain_order=True)
        .with_columns((pl.col("__t") + gap_ms).cum_max().over(keys).alias("__end"))
        .with_columns(
            (pl.col("__t") > pl.col("__end").shift(1).over(keys))
            .fill_null(True)
            .cum_sum()
            .alias("__sid")
        )
        .group_by([*keys, "__sid"], maintain_order=True)
        .agg(pl.col("__t").min().alias("ws"), (pl.col("__t").max() + gap_ms).alias("we"), *aggs)
        .drop("__sid")
    )
