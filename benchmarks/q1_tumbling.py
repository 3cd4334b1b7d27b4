"""``q1-tumbling``: 1-minute tumbling windows per card (see :mod:`benchmarks.windowed`)."""

from __future__ import annotations

import polars as pl

import microbatch as mb
from benchmarks.windowed import AGGS, WindowCase, make_workload, window_reference

MINUTE_MS = 60_000


def oneshot(lf: pl.LazyFrame) -> pl.LazyFrame:
    """All windows at once: truncate event time to the minute, group."""
    return (
        lf.group_by(pl.col("event_time").dt.truncate("1m").alias("window_start"), "card_id")
        .agg(*AGGS)
        .with_columns((pl.col("window_start") + pl.duration(minutes=1)).alias("window_end"))
    )


CASE = WindowCase(
    name="q1-tumbling",
    description="1-minute tumbling windows per card_id, append mode",
    window=lambda: mb.window("event_time", "1m"),
    oneshot=oneshot,
    reference=window_reference(MINUTE_MS, MINUTE_MS),
    sql="""
        SELECT window_start, window_end, card_id, COUNT(*) AS n, SUM(amount) AS amount
        FROM TABLE(TUMBLE(TABLE tx, DESCRIPTOR(event_time), INTERVAL '1' MINUTE))
        GROUP BY window_start, window_end, card_id
    """,
    pipelined=True,
)
WORKLOAD = make_workload(CASE)
