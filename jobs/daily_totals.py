"""Daily totals per card for finance: late ledger corrections absorbed, any day restatable.

Reads the rows appended to the ``input`` Delta table (``event_time``,
``card_id``, ``amount``, ...), version by version, and keeps one row per UTC
day and card in the ``output`` Delta table -- ``day``, ``window_start``,
``window_end``, ``card_id``, ``transactions``, ``total_amount``,
``max_amount`` (exact decimals) -- MERGEd by (``day``, ``card_id``) in every
batch that changes it (update mode, exactly once through Delta app
transactions). Finance's path stays batch (correct to the cent and restatable
matters, not latency): run it every night as an available-now job, which reads
every version appended since the night before, commits and exits::

    microbatch run jobs/daily_totals.py --checkpoint chk/daily --trigger available-now \\
        --param input=lake/transactions --param output=lake/daily_totals

from cron as ``15 2 * * * cd /srv/lake && .venv/bin/microbatch run ...`` (the
whole line is in the README, "Finance").

A failed night is rerun with the same command: the checkpoint resumes at the
first uncommitted batch and a batch that already landed is a no-op, so every
version counts once. (``--trigger 1m`` keeps the same job running instead.)

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

The restatement replays the whole log on a new checkpoint with the watermark
held (no row is late in it), so the day counts every one of its rows, those in
the late table included, for any ``max_files_per_batch``; it writes nothing to
the late table. A killed one replaced nothing: rerun it on a new checkpoint.

Optional params: ``watermark``, ``allowed_lateness``, ``late_output``,
``max_files_per_batch``, ``starting_version``, ``optimize_every`` (compact the
output every N batches), and ``storage.KEY=VALUE`` for delta-rs storage options
of the tables (``--param storage.AWS_ENDPOINT_URL=http://127.0.0.1:9000`` ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

import polars as pl

import microbatch as mb
from sinks.delta import DeltaSink

MONEY = pl.Decimal(18, 2)
"""Amounts are summed as exact decimal cents: a replay or a backfill split into
other batches gives the same totals to the cent (floats would differ in the
last bits)."""


@dataclass(frozen=True)
class Params:
    """The job's parameters (``--param NAME=VALUE``)."""

    input: Annotated[str, "the transactions Delta table"]
    output: Annotated[str, "the daily totals Delta table"]
    watermark: Annotated[str, "watermark delay behind the newest event time"] = "1h"
    allowed_lateness: Annotated[str, "how late a correction still updates its day"] = "7d"
    late_output: Annotated[str | None, "Delta table of too-late rows (<output>-late)"] = None
    max_files_per_batch: Annotated[int | None, "files per batch"] = None
    starting_version: Annotated[int | None, "first version of input to read"] = None
    optimize_every: Annotated[int | None, "compact the output every N batches"] = None
    storage: Annotated[dict[str, str], "delta-rs storage options of the tables"] = field(
        default_factory=dict)


def build(params: Params) -> mb.DataStreamWriter:
    """The job (see :class:`Params` and the module docstring)."""
    storage = params.storage or None
    tx = mb.read_delta(
        params.input,
        starting_version=params.starting_version,
        max_files_per_batch=params.max_files_per_batch,
        storage_options=storage,
    )
    late = params.late_output or f"{params.output.rstrip('/')}-late"
    daily = (
        tx.filter(pl.col("card_id").is_not_null(), pl.col("amount").is_not_null())
        .with_columns(pl.col("amount").cast(MONEY))
        .on_late(DeltaSink(late, storage_options=storage))
        .with_watermark("event_time", params.watermark)
        .group_by(mb.window("event_time", "1d", allowed_lateness=params.allowed_lateness),
                  "card_id")
        .agg(
            pl.len().alias("transactions"),
            pl.col("amount").sum().alias("total_amount"),
            pl.col("amount").max().alias("max_amount"),
        )
        .with_columns(pl.col("window_start").dt.date().alias("day"))
        .select("day", pl.exclude("day"))
    )
    return daily.write_delta(
        params.output,
        output_mode="update",
        merge_keys=["day", "card_id"],
        storage_options=storage,
        optimize_every=params.optimize_every,
    )
