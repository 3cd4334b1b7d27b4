"""``q3-session``: 30-second session windows per card (see :mod:`benchmarks.windowed`)."""

from __future__ import annotations

import polars as pl

import microbatch as mb
from benchmarks.windowed import AGGS, WindowCase, make_workload, session_reference

GAP = "30s"
GAP_MS = 30_000


def oneshot(lf: pl.LazyFrame) -> pl.LazyFrame:
    """All sessions at once: sort by card and time, start a session after a gap."""
    starts = (
        (pl.col("card_id") != pl.col("card_id").shift(1))
        | (pl.col("event_time") - pl.col("event_time").shift(1) > pl.duration(seconds=30))
    ).fill_null(True)
    return (
        lf.select("card_id", "event_time", "amount")
        .sort("card_id", "event_time")
        .with_columns(starts.cum_sum().alias("session"))
        .group_by("session")
        .agg(
            pl.col("card_id").first(),
            pl.col("event_time").min().alias("window_start"),
            (pl.col("event_time").max() + pl.duration(seconds=30)).alias("window_end"),
            *AGGS,
        )
    )


CASE = WindowCase(
    name="q3-session",
    description="30-second session windows per card_id, append mode",
    window=lambda: mb.session_window("event_time", GAP),
    oneshot=oneshot,
    reference=session_reference(GAP_MS),
)
WORKLOAD = make_workload(CASE)
