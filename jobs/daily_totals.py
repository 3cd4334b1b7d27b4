"""Daily totals per card, from a Delta table of card transactions to a Delta table.

Reads the rows appended to the ``input`` Delta table (``event_time``,
``card_id``, ``amount``, ...), version by version, and writes one row per
card and UTC day -- ``window_start``, ``window_end``, ``card_id``,
``transactions``, ``total_amount``, ``max_amount`` -- once the watermark
(max event time seen minus ``watermark``, default 1h) has passed the day's
end (append mode, exactly once through Delta app transactions)::

    microbatch backfill jobs/daily_totals.py --checkpoint chk/daily-replay \\
        --param input=lake/transactions --param output=lake/daily_totals_replay

    microbatch run jobs/daily_totals.py --checkpoint chk/daily --trigger 1m \\
        --param input=lake/transactions --param output=lake/daily_totals

Optional params: ``watermark`` (``1h``), ``max_files_per_batch``,
``starting_version``, ``optimize_every`` (compact the output every N
batches), and ``storage.KEY=VALUE`` for delta-rs storage options of both
tables (``--param storage.AWS_ENDPOINT_URL=http://127.0.0.1:9000`` ...).

Days still open when a backfill ends (the last ``watermark`` of event time)
are not written; the next run writes them once the watermark passes.
"""

from __future__ import annotations

import polars as pl

import microbatch as mb

MONEY = pl.Decimal(18, 2)
"""Amounts are summed as exact decimal cents: a replay or a backfill split into
other batches gives the same totals to the cent (floats would differ in the
last bits)."""


def build(params: dict[str, str]) -> mb.DataStreamWriter:
    """Params: ``input``, ``output`` (required); see the module docstring."""
    missing = [key for key in ("input", "output") if not params.get(key)]
    if missing:
        raise mb.JobError(
            "daily_totals needs " + " and ".join(f"--param {key}=TABLE" for key in missing)
        )
    storage = {k.removeprefix("storage."): v for k, v in params.items()
               if k.startswith("storage.")} or None
    max_files = params.get("max_files_per_batch")
    start = params.get("starting_version")
    optimize = params.get("optimize_every")
    tx = mb.read_delta(
        params["input"],
        starting_version=int(start) if start else None,
        max_files_per_batch=int(max_files) if max_files else None,
        storage_options=storage,
    )
    daily = (
        tx.filter(pl.col("card_id").is_not_null(), pl.col("amount").is_not_null())
        .with_columns(pl.col("amount").cast(MONEY))
        .with_watermark("event_time", params.get("watermark", "1h"))
        .group_by(mb.window("event_time", "1d"), "card_id")
        .agg(
            pl.len().alias("transactions"),
            pl.col("amount").sum().alias("total_amount"),
            pl.col("amount").max().alias("max_amount"),
        )
    )
    return daily.write_delta(
        params["output"],
        output_mode="append",
        storage_options=storage,
        optimize_every=int(optimize) if optimize else None,
    )
