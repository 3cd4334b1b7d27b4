"""A windowed and a session aggregation of generated payments, to Parquet
(the scale-out crash tests run it with and without ``--workers``).

Params: ``output``; ``kind`` (``window`` or ``session``, default window);
``rows`` (default 30000); ``batch`` (rows per batch, default 1500).
"""

from __future__ import annotations

import polars as pl

import microbatch as mb


def build(params: dict[str, str]) -> mb.DataStreamWriter:
    stream = mb.generate(
        rows_per_second=None, total_rows=int(params.get("rows", "30000")), cards=200,
        partitions=3, seed=11, start="2026-01-01T00:00:00+00:00",
        max_records_per_batch=int(params.get("batch", "1500")), late_fraction=0.01,
        late_by=("5s", "1m"),
    ).with_watermark("event_time", "5s")
    if params.get("kind", "window") == "session":
        grouped = stream.group_by(mb.session_window("event_time", gap="3s"), "card_id")
    else:
        grouped = stream.group_by(mb.window("event_time", "10s"), "card_id")
    return grouped.agg(
        pl.len().alias("n"), pl.col("amount").sum().alias("total")
    ).write_parquet(params["output"])
