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

FORMATS = ("parquet", "json", "csv")


def build(params: dict[str, str]) -> mb.DataStreamWriter:
    """Params: ``input``, ``output`` (required); ``format``, ``min_amount``,
    ``max_files_per_batch`` (optional)."""
    missing = [key for key in ("input", "output") if not params.get(key)]
    if missing:
        raise mb.JobError(
            "transactions_to_parquet needs "
            + " and ".join(f"--param {key}=DIR" for key in missing)
        )
    fmt = params.get("format", "parquet")
    if fmt not in FORMATS:
        raise mb.JobError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    min_amount = float(params.get("min_amount", "0.01"))
    max_files = params.get("max_files_per_batch")

    tx = mb.read_files(
        params["input"],
        format=fmt,  # type: ignore[arg-type]  # checked against FORMATS above
        schema=SCHEMA,
        max_files_per_batch=int(max_files) if max_files else None,
    )
    cleaned = (
        tx.filter(
            pl.col("event_id").is_not_null(),
            pl.col("card_id").is_not_null(),
            pl.col("event_time").is_not_null(),
            pl.col("amount") >= min_amount,
        )
        .with_columns(pl.col("merchant").fill_null("unknown").str.strip_chars())
        .select("event_id", "card_id", "merchant", "amount", "event_time")
    )
    return cleaned.write_parquet(params["output"])
