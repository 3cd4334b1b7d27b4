"""The built-in demo job: generated card transactions, tagged, written as Parquet.

Used by ``microbatch demo``, and a job file like any other::

    microbatch run microbatch/demo.py --checkpoint chk/demo --trigger 1s \\
        --param output=out/transactions --param rows_per_second=20000

Pipeline: ``mb.generate`` (4 partitions, 10,000 cards, events up to 5 s out
of order, 0.5 % late) -> ``amount_band`` and ``suspicious`` columns -> drop
micro-payments -> ``write_parquet``. It needs no external service.

Keep the pipeline in :func:`pipeline` so it is easy to grow (it will become
the windowed fraud-alert pipeline); :func:`build` only reads parameters.
"""

from __future__ import annotations

import polars as pl

import microbatch as mb

DEFAULT_OUTPUT = "demo-output/transactions"
DEFAULT_ROWS_PER_SECOND = 20_000.0
SUSPICIOUS_AMOUNT = 500.0
"""Single payments at or above this amount are flagged ``suspicious``."""
MIN_AMOUNT = 1.0
"""Payments below this (card-verification probes) are dropped."""


def transactions(*, rows_per_second: float, seed: int = 0) -> mb.Stream:
    """The demo's input: generated card transactions, arriving in real time.

    A batch holds at most 5 seconds' worth of rows, so a restart after a long
    pause catches up in bounded batches instead of one huge one.
    """
    return mb.generate(
        rows_per_second=rows_per_second,
        partitions=4,
        cards=10_000,
        max_delay="5s",
        late_fraction=0.005,
        seed=seed,
        max_records_per_batch=max(1, int(rows_per_second * 5)),
    )


def pipeline(tx: mb.Stream) -> mb.Stream:
    """Stateless enrichment: an amount band, a suspicious flag, no micro-payments."""
    amount = pl.col("amount")
    return tx.with_columns(
        pl.when(amount < 10)
        .then(pl.lit("small"))
        .when(amount < 100)
        .then(pl.lit("medium"))
        .when(amount < SUSPICIOUS_AMOUNT)
        .then(pl.lit("large"))
        .otherwise(pl.lit("very large"))
        .alias("amount_band"),
        (amount >= SUSPICIOUS_AMOUNT).alias("suspicious"),
    ).filter(amount >= MIN_AMOUNT)


def build(params: dict[str, str]) -> mb.DataStreamWriter:
    """The demo as a job: params ``output``, ``rows_per_second``, ``seed`` (all optional)."""
    try:
        rate = float(params.get("rows_per_second", DEFAULT_ROWS_PER_SECOND))
        seed = int(params.get("seed", "0"))
    except ValueError as exc:
        raise mb.JobError(
            f"demo: rows_per_second must be a number and seed an integer ({exc})"
        ) from None
    stream = pipeline(transactions(rows_per_second=rate, seed=seed))
    return stream.write_parquet(params.get("output", DEFAULT_OUTPUT))
