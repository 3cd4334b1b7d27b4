"""The built-in demo job: the fraud scenario on generated card payments, no services needed.

Used by ``microbatch demo`` (which also starts a local webhook receiver), and a
job file like any other::

    microbatch run microbatch/demo.py --checkpoint chk/demo --trigger 1s \\
        --param output=out/alerts --param rows_per_second=5000 \\
        [--param webhook=http://127.0.0.1:8000/alerts]

The pipeline is ``jobs/fraud_alerts.py``'s rule on the embedded generator:
``mb.generate`` (4 partitions, 200,000 Zipf-skewed cards, payments up to 5 s out
of order, 0.5 % uploaded from a phone up to an hour late) -> amounts as exact
decimals -> watermark 10 s -> per card and 1-minute window of event time, 3 or
more payments -> an alert **at once**, in the batch of the third payment
(``fire_once``), even for an hour-late window -> the webhook (one POST per
alert, ``Idempotency-Key`` = ``alert_id``) and a local Delta table of alerts
(one row per ``alert_id``, corrected as more payments of its minute arrive).
Payments more than an hour late go to ``<output>-late`` (Delta) with their
reason, never silently dropped.
"""

from __future__ import annotations

import polars as pl

import microbatch as mb
from sinks.base import Sink
from sinks.delta import DeltaSink
from sinks.fanout import FanOutSink
from sinks.routed import Routed

DEFAULT_OUTPUT = "demo-output/alerts"
DEFAULT_ROWS_PER_SECOND = 5_000.0
MIN_PAYMENTS = 3
"""A card with at least this many payments in one window of event time alerts."""
WINDOW = "1m"
ALLOWED_LATENESS = "1h"
MONEY = pl.Decimal(18, 2)
"""Amounts are money: exact decimal cents, so totals are exact and the same in
every replay and every batch split."""


def transactions(*, rows_per_second: float, seed: int = 0) -> mb.Stream:
    """The demo's input: generated card payments, arriving in real time.

    A batch holds at most 5 seconds' worth of rows, so a restart after a long
    pause catches up in bounded batches instead of one huge one.
    """
    return mb.generate(
        rows_per_second=rows_per_second,
        partitions=4,
        cards=200_000,
        max_delay="5s",
        late_fraction=0.005,
        late_by=("1m", "1h"),
        seed=seed,
        max_records_per_batch=max(1, int(rows_per_second * 5)),
    ).with_columns(pl.col("amount").cast(MONEY))


def pipeline(tx: mb.Stream) -> mb.Stream:
    """Cards with ``MIN_PAYMENTS`` or more payments inside one window, alerted once,
    as soon as it holds; later payments of a fired window as ``revision`` 1, 2..."""
    return (
        tx.with_watermark("event_time", "10s")
        .group_by(mb.window("event_time", WINDOW, allowed_lateness=ALLOWED_LATENESS),
                  "card_id")
        .agg(pl.len().alias("payments"), pl.col("amount").sum().alias("total_amount"))
        .fire_once(pl.col("payments") >= MIN_PAYMENTS, corrections=True)
        .with_columns(
            pl.format("{}-{}", pl.col("card_id"), pl.col("window_start").dt.epoch("ms"))
            .alias("alert_id")
        )
    )


def sinks(output: str, webhook: str | None) -> Sink:
    """With ``webhook``, one POST per alert, and the alert table (MERGEd by alert
    id), at the same time: a page does not wait for the table, and the batch's
    sink step costs the slower of the two, not their sum."""
    routes: list[Sink] = []
    if webhook:
        from sinks.webhook import WebhookSink

        routes.append(Routed(WebhookSink(webhook, key="alert_id"),
                             where=pl.col("revision") == 0))
    routes.append(Routed(DeltaSink(output, merge_keys="alert_id"), output_mode="update",
                         key_columns=("alert_id",)))
    return FanOutSink(routes, concurrent=True)


def build(params: dict[str, str]) -> mb.DataStreamWriter:
    """The demo as a job: params ``output``, ``rows_per_second``, ``seed``, ``webhook``
    (all optional)."""
    try:
        rate = float(params.get("rows_per_second", DEFAULT_ROWS_PER_SECOND))
        seed = int(params.get("seed", "0"))
    except ValueError as exc:
        raise mb.JobError(
            f"demo: rows_per_second must be a number and seed an integer ({exc})"
        ) from None
    output = params.get("output", DEFAULT_OUTPUT)
    late = DeltaSink(f"{output.rstrip('/')}-late")
    stream = pipeline(transactions(rows_per_second=rate, seed=seed).on_late(late))
    return stream.write_to(sinks(output, params.get("webhook")))
