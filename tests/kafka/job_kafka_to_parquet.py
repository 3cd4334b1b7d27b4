"""Test job: a Kafka topic of JSON events -> Parquet, for kill -9 tests.

Params: ``bootstrap``, ``topic``, ``output`` (required), ``max_records_per_batch``.
"""

from __future__ import annotations

import polars as pl

import microbatch as mb

SCHEMA = {"event_id": pl.Int64, "card_id": pl.Int64, "amount": pl.Float64}


def build(params: dict[str, str]) -> mb.DataStreamWriter:
    tx = mb.read_kafka(
        params["topic"], bootstrap=params["bootstrap"], schema=SCHEMA,
        max_records_per_batch=int(params.get("max_records_per_batch", "500")),
    )
    return (
        tx.filter(pl.col("amount") >= 20)
        .select("event_id", "card_id", "amount", "partition", "offset")
        .write_parquet(params["output"])
    )
