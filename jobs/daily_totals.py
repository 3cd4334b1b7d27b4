"""Daily totals per card for finance: late ledger corrections absorbed, any day restatable.

Reads the rows appended to the ``input`` Delta table (``event_time``,
``card_id``, ``amount``, ...), version by version, and keeps one row per UTC
day and card in the ``output`` Delta table -- ``day``, ``window_start``,
``window_end``, ``card_id``, ``transactions``, ``total_amount``,
``max_amount`` (exact decimals) -- MERGEd by (``day``, ``card_id``) in every
batch that changes it (update mode, exactly once through Delta app
transactions)::

    microbatch run jobs/daily_totals.py --checkpoint chk/daily --trigger 1m \\
        --param input=lake/transactions --param output=lake/daily_totals

A correction booked days later (a refund, a chargeback: a row whose
``event_time`` is in an old day) updates that day's row as long as it arrives
within ``allowed_lateness`` (``7d``) of the watermark (the newest event time
minus ``watermark``, ``1h``); later ones go to ``late_output``
(``<output>-late``), with their reason, never silently dropped.

Restating one day from the lakehouse, without touching the others (one Delta
commit that replaces exactly the rows of that day, Delta's replaceWhere)::

    microbatch backfill jobs/daily_totals.py --checkpoint chk/restate-0103 \\
        --param input=lake/transactions --param output=lake/daily_totals \\
        --replace-where "day = '2026-01-03'"

Optional params: ``watermark``, ``allowed_lateness``, ``late_output``,
``max_files_per_batch``, ``starting_version``, ``optimize_every`` (compact the
output every N batches), and ``storage.KEY=VALUE`` for delta-rs storage options
of the tables (``--param storage.AWS_ENDPOINT_URL=http://127.0.0.1:9000`` ...).
"""

from __future__ import annotations

import polars as pl

import microbatch as mb
from sinks.delta import DeltaSink

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
    late = params.get("late_output") or f"{params['output'].rstrip('/')}-late"
    daily = (
        tx.filter(pl.col("card_id").is_not_null(), pl.col("amount").is_not_null())
        .with_columns(pl.col("amount").cast(MONEY))
        .on_late(DeltaSink(late, storage_options=storage))
        .with_watermark("event_time", params.get("watermark", "1h"))
        .group_by(mb.window("event_time", "1d",
                            allowed_lateness=params.get("allowed_lateness", "7d")), "card_id")
        .agg(
            pl.len().alias("transactions"),
            pl.col("amount").sum().alias("total_amount"),
            pl.col("amount").max().alias("max_amount"),
        )
        .with_columns(pl.col("window_start").dt.date().alias("day"))
        .select("day", pl.exclude("day"))
    )
    return daily.write_delta(
        params["output"],
        output_mode="update",
        merge_keys=["day", "card_id"],
        storage_options=storage,
        optimize_every=int(optimize) if optimize else None,
    )
