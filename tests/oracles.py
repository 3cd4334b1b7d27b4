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


def cumulating(
    rows: pl.DataFrame,
    *,
    time: str,
    keys: list[str],
    size_ms: int,
    step_ms: int,
    aggs: list[pl.Expr],
    by_row: bool = False,
) -> pl.DataFrame:
    """Every (window, keys) aggregate of cumulating windows over ``rows``: a row
    at t is in each window [p, p + j * step) of its period p = floor(t / size) *
    size that ends after t (``by_row``: the (row, window) assignments)."""
    t = pl.col(time).dt.epoch("ms")
    steps = pl.DataFrame({"__j": list(range(1, size_ms // step_ms + 1))})
    assigned = (
        rows.with_columns(((t // size_ms) * size_ms).alias("ws"), t.alias("__t"))
        .join(steps, how="cross")
        .with_columns((pl.col("ws") + pl.col("__j") * step_ms).alias("we"))
        .filter(pl.col("we") > pl.col("__t"))
        .drop("__j", "__t")
    )
    if by_row:
        return assigned
    return assigned.group_by(["ws", "we", *keys], maintain_order=True).agg(aggs)


def windows_of(spec: object, rows: pl.DataFrame, **kwargs: object) -> pl.DataFrame:
    """The oracle for a ``mb.window`` or ``mb.cumulate_window`` spec (see above)."""
    size_ms, slide_ms = spec.size_ms, spec.slide_ms  # type: ignore[attr-defined]
    if spec.cumulative:  # type: ignore[attr-defined]
        return cumulating(rows, size_ms=size_ms, step_ms=slide_ms, **kwargs)  # type: ignore[arg-type]
    return tumbling_or_hopping(rows, size_ms=size_ms, slide_ms=slide_ms, **kwargs)  # type: ignore[arg-type]


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


def cut_into_batches(
    rows: pl.DataFrame,
    *,
    batch: pl.Expr,
    time: str,
    keys: list[str],
    size_ms: int,
    delay_ms: int,
    aggs: list[pl.Expr],
) -> pl.DataFrame:
    """The append output of a tumbling-window run whose batch of each row is
    ``batch``: a row is late (dropped) when its window ends at or before the
    watermark of the earlier batches (their newest event time minus
    ``delay_ms``); the windows the final watermark closed; ``ws``/``we`` in ms."""
    t = pl.col(time).dt.epoch("ms")
    cut = rows.with_columns(batch.alias("__batch"))
    marks = (cut.group_by("__batch").agg(t.max().alias("__newest")).sort("__batch")
             .with_columns((pl.col("__newest").cum_max().shift(1) - delay_ms).alias("__wm")))
    cut = cut.join(marks.select("__batch", "__wm"), on="__batch").with_columns(
        (t // size_ms * size_ms + size_ms).alias("__we"))
    kept = cut.filter(pl.col("__wm").is_null() | (pl.col("__we") > pl.col("__wm")))
    final = cut.select(t.max()).item() - delay_ms
    found = tumbling_or_hopping(kept.drop("__batch", "__wm", "__we"), time=time, keys=keys,
                                size_ms=size_ms, slide_ms=size_ms, aggs=aggs)
    return found.filter(pl.col("we") <= final)
