"""A windowed and a session aggregation of generated payments, to Parquet
(the scale-out crash tests run it with and without ``--workers``).

Params: ``output``; ``kind`` (``window`` or ``session``, default window);
``rows`` (default 30000); ``batch`` (rows per batch, default 1500); ``input``:
read JSON-lines payments from this directory instead, ``files`` per batch
(default 2), which the workers of a scaled-out run read themselves.
"""

from __future__ import annotations

import polars as pl

import microbatch as mb

SCHEMA = {"card_id": pl.Int64, "amount": pl.Float64, "event_time": pl.Datetime("ms", "UTC")}


def build(params: dict[str, str]) -> mb.DataStreamWriter:
    if "input" in params:
        stream = mb.read_files(
            params["input"], format="json", schema=SCHEMA,
            max_files_per_batch=int(params.get("files", "2")),
        ).with_watermark("event_time", "5s")
        return windows(stream, params)
    stream = mb.generate(
        rows_per_second=None, total_rows=int(params.get("rows", "30000")), cards=200,
        partitions=3, seed=11, start="2026-01-01T00:00:00+00:00",
        max_records_per_batch=int(params.get("batch", "1500")), late_fraction=0.01,
        late_by=("5s", "1m"),
    ).with_watermark("event_time", "5s")
    return windows(stream, params)


def windows(stream: mb.Stream, params: dict[str, str]) -> mb.DataStreamWriter:
    if params.get("kind", "window") == "session":
        grouped = stream.group_by(mb.session_window("event_time", gap="3s"), "card_id")
    else:
        grouped = stream.group_by(mb.window("event_time", "10s"), "card_id")
    return grouped.agg(
        pl.len().alias("n"), pl.col("amount").sum().alias("total")
    ).write_parquet(params["output"])
