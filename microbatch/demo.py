"""The built-in demo job: fraud alerts on generated card transactions.

Used by ``microbatch demo``, and a job file like any other::

    microbatch run microbatch/demo.py --checkpoint chk/demo --trigger 1s \\
        --param output=out/alerts --param rows_per_second=5000

Pipeline (the design scenario): ``mb.generate`` (4 partitions, 200,000
Zipf-skewed cards, events up to 5 s out of order, 0.5 % arriving minutes
late) -> event-time watermark 5 s -> per card and 10-second tumbling window:
count and total -> alert where a card made 3 or more payments in the window
-> a local Delta table (one commit per batch, exactly once). Rows that arrive
after their window closed go to a side output next to the alerts
(``<output>-late``, Parquet), never silently dropped.
Each alert has a deterministic ``alert_id`` from (card, window), so a replay
can never page twice. It needs no external service.
"""

from __future__ import annotations

import polars as pl

import microbatch as mb

DEFAULT_OUTPUT = "demo-output/alerts"
DEFAULT_ROWS_PER_SECOND = 5_000.0
MIN_PAYMENTS = 3
"""A card with at least this many payments in one window of event time alerts."""
MONEY = pl.Decimal(18, 2)
"""Amounts are money: exact decimal cents, so totals are exact and the same in
every replay and every batch split."""
WINDOW = "10s"
"""The demo's window: short, so alerts show up within seconds of starting (the
fraud job in ``jobs/`` uses the real one-minute rule)."""


def transactions(*, rows_per_second: float, seed: int = 0) -> mb.Stream:
    """The demo's input: generated card transactions, arriving in real time.

    A batch holds at most 5 seconds' worth of rows, so a restart after a long
    pause catches up in bounded batches instead of one huge one.
    """
    return mb.generate(
        rows_per_second=rows_per_second,
        partitions=4,
        cards=200_000,
        max_delay="5s",
        late_fraction=0.005,
        late_by=("1m", "10m"),
        seed=seed,
        max_records_per_batch=max(1, int(rows_per_second * 5)),
    )


def pipeline(tx: mb.Stream) -> mb.Stream:
    """Cards with ``MIN_PAYMENTS`` or more payments inside one window of event time."""
    return (
        tx.with_columns(pl.col("amount").cast(MONEY))
        .with_watermark("event_time", "5s")
        .group_by(mb.window("event_time", WINDOW), "card_id")
        .agg(pl.len().alias("payments"), pl.col("amount").sum().alias("total_amount"))
        .filter(pl.col("payments") >= MIN_PAYMENTS)
        .with_columns(
            pl.format("{}-{}", pl.col("card_id"), pl.col("window_start").dt.epoch("s"))
            .alias("alert_id")
        )
    )


def build(params: dict[str, str]) -> mb.DataStreamWriter:
    """The demo as a job: params ``output``, ``rows_per_second``, ``seed`` (all optional)."""
    try:
        rate = float(params.get("rows_per_second", DEFAULT_ROWS_PER_SECOND))
        seed = int(params.get("seed", "0"))
    except ValueError as exc:
        raise mb.JobError(
            f"demo: rows_per_second must be a number and seed an integer ({exc})"
        ) from None
    output = params.get("output", DEFAULT_OUTPUT)
    from sinks.parquet import ParquetSink

    late = ParquetSink(f"{output.rstrip('/')}-late")
    stream = pipeline(transactions(rows_per_second=rate, seed=seed))
    return stream.on_late(late).write_delta(output)
