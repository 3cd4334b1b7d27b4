"""A windowed count and sum of generated payments (no late rows) into Delta or
Parquet: the worker-writes tests run it in fresh processes with ``--workers``.

Params: ``output``; ``sink`` (``delta`` or ``parquet``, default delta);
``mode`` (the Delta output mode, default append).
"""

from __future__ import annotations

import polars as pl

import microbatch as mb

ROWS, BATCH = 12_000, 2_000
START = "2026-01-01T00:00:00+00:00"


def payments() -> mb.Stream:
    """Generated payments without late rows (disorder within the watermark's delay)."""
    return mb.generate(rows_per_second=None, total_rows=ROWS, cards=50, partitions=2,
                       seed=5, start=START, max_records_per_batch=BATCH, max_delay="2s",
                       event_rate=200)


def windowed(stream: mb.Stream) -> mb.Stream:
    """Count and integer sum of cents per 10-second window and card."""
    return (
        stream.with_columns((pl.col("amount") * 100).round(0).cast(pl.Int64).alias("cents"))
        .with_watermark("event_time", "5s")
        .group_by(mb.window("event_time", "10s"), "card_id")
        .agg(pl.len().alias("n"), pl.col("cents").sum().alias("cents"))
    )


def build(params: dict[str, str]) -> mb.DataStreamWriter:
    rows = windowed(payments())
    if params.get("sink", "delta") == "parquet":
        return rows.write_parquet(params["output"])
    return rows.write_delta(params["output"],
                            output_mode=params.get("mode", "append"))  # type: ignore[arg-type]
