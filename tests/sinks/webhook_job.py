"""A job file for the webhook sink's kill tests: generated rows -> POST per row.

Params: ``url`` (required), ``rows`` (2000), ``cap`` (rows per batch, 200),
``retry_for`` (``2m``).
"""

from __future__ import annotations

import polars as pl

import microbatch as mb


def build(params: dict[str, str]) -> mb.DataStreamWriter:
    rows = mb.generate(rows_per_second=None, total_rows=int(params.get("rows", "2000")),
                       seed=3, start="2026-01-01T00:00:00+00:00",
                       max_records_per_batch=int(params.get("cap", "200")))
    return (
        rows.select(pl.format("e-{}", "event_id").alias("key"), "card_id",
                    pl.col("amount").cast(pl.Decimal(18, 2)), "event_time")
        .write_webhook(params["url"], key="key", max_in_flight=16,
                       retry_for=params.get("retry_for", "2m"), backoff=("50ms", "1s"))
    )
