"""``q2-hopping``: 5-minute windows sliding by 1 minute, per card
(see :mod:`benchmarks.windowed`)."""

from __future__ import annotations

import polars as pl

import microbatch as mb
from benchmarks.windowed import AGGS, WindowCase, make_workload, window_reference

SIZE_MIN, SLIDE_MIN = 5, 1


def oneshot(lf: pl.LazyFrame) -> pl.LazyFrame:
    """All windows at once: explode each row's window starts, group."""
    last = pl.col("event_time").dt.truncate(f"{SLIDE_MIN}m")
    starts = pl.concat_list(
        [last - pl.duration(minutes=i * SLIDE_MIN) for i in range(SIZE_MIN // SLIDE_MIN)]
    )
    return (
        lf.with_columns(starts.alias("window_start"))
        .explode("window_start")
        .group_by("window_start", "card_id")
        .agg(*AGGS)
        .with_columns((pl.col("window_start") + pl.duration(minutes=SIZE_MIN)).alias("window_end"))
    )


CASE = WindowCase(
    name="q2-hopping",
    description="5-minute windows sliding by 1 minute per card_id, append mode",
    window=lambda: mb.window("event_time", f"{SIZE_MIN}m", slide=f"{SLIDE_MIN}m"),
    oneshot=oneshot,
    reference=window_reference(SIZE_MIN * 60_000, SLIDE_MIN * 60_000),
)
WORKLOAD = make_workload(CASE)
