"""Card transactions landing as files -> cleaned, projected Parquet, exactly once.

Reads every file that lands in ``input`` (Parquet by default, or
newline-delimited JSON / CSV with ``format``), drops rows that cannot be
valid payments, keeps the columns downstream consumers need and writes them
with the exactly-once Parquet sink::

    microbatch run jobs/transactions_to_parquet.py --checkpoint chk/tx --trigger 10s \\
        --param input=landing/transactions --param output=lake/transactions \\
        [--param format=json] [--param min_amount=0.01] [--param max_files_per_batch=100]

Malformed records (bad JSON, values that do not fit the schema) go to the
checkpoint's ``dead_letter/`` directory with their file, line and reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import polars as pl

import microbatch as mb

SCHEMA = {
    "event_id": pl.Int64,
    "card_id": pl.Int64,
    "merchant": pl.String,
    "amount": pl.Decimal(18, 2),  # money: exact cents
    "event_time": pl.Datetime("ms", "UTC"),
}
"""The schema of a card transaction as it lands."""

@dataclass(frozen=True)
class Params:
    """The job's parameters (``--param NAME=VALUE``)."""

    input: Annotated[str, "directory the transaction files land in"]
    output: Annotated[str, "Parquet output directory"]
    format: Annotated[Literal["parquet", "json", "csv"], "format of the files"] = "parquet"
    min_amount: Annotated[float, "smallest amount kept"] = 0.01
    max_files_per_batch: Annotated[int | None, "files per batch (none: no cap)"] = None


def build(params: Params) -> mb.DataStreamWriter:
    """The job (see :class:`Params`)."""
    tx = mb.read_files(params.input, format=params.format, schema=SCHEMA,
                       max_files_per_batch=params.max_files_per_batch)
    cleaned = (
        tx.filter(
            pl.col("event_id").is_not_null(),
            pl.col("card_id").is_not_null(),
            pl.col("event_time").is_not_null(),
            pl.col("amount") >= params.min_amount,
        )
        .with_columns(pl.col("merchant").fill_null("unknown").str.strip_chars())
        .select("event_id", "card_id", "merchant", "amount", "event_time")
    )
    return cleaned.write_parquet(params.output)
