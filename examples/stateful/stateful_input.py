"""The input and parameters shared by the stateful examples (a helper, not a job).

``payments(params)`` is the deterministic generator with two derived columns:
``country`` (the card's home country, or, at one merchant in ten, another one)
and ``device_id`` (= ``card_id``, for the heartbeat example). The rows depend
only on the parameters, so a run, a crash and a restart, or any split into
batches read the same log.

Params: ``rows`` (default 20000, all available at once), ``cards`` (default
50), ``event_rate`` (payments per second of event time, default 2),
``max_delay`` (disorder, default ``"20s"``), ``delay`` (the watermark delay,
default ``"30s"``), ``seed`` (default 3), ``max_records_per_batch`` (default
1000).

"""

from __future__ import annotations

import polars as pl

import microbatch as mb

START = "2026-01-01T00:00:00+00:00"
COUNTRIES = ["FR", "DE", "ES", "IT", "GB"]
ABROAD = 10


def payments(params: dict[str, str]) -> mb.Stream:
    """Generated payments with ``country`` and ``device_id``, watermarked on
    ``event_time`` with ``delay``."""
    stream = mb.generate(
        rows_per_second=None,
        event_rate=float(params.get("event_rate", "2")),
        total_rows=int(params.get("rows", "20000")),
        cards=int(params.get("cards", "50")),
        max_delay=params.get("max_delay", "20s"),
        seed=int(params.get("seed", "3")),
        start=START,
        max_records_per_batch=int(params.get("max_records_per_batch", "1000")),
    )
    return with_country(stream).with_watermark("event_time", params.get("delay", "30s"))


def with_country(stream: mb.Stream) -> mb.Stream:
    """``country`` from the merchant number, ``device_id`` = ``card_id``."""
    return stream.with_columns(*derived_columns())


def derived_columns() -> list[pl.Expr]:
    """The ``country`` and ``device_id`` expressions (for a DataFrame, too)."""
    merchant = pl.col("merchant").str.slice(2).cast(pl.Int64)
    home = pl.col("card_id") % len(COUNTRIES)
    # one merchant in ABROAD is in another country than the card's home
    abroad = (home + 1 + merchant % (len(COUNTRIES) - 1)) % len(COUNTRIES)
    index = pl.when(merchant % ABROAD == 0).then(abroad).otherwise(home)
    return [
        index.replace_strict(list(range(len(COUNTRIES))), COUNTRIES, return_dtype=pl.String)
        .alias("country"),
        pl.col("card_id").alias("device_id"),
    ]
