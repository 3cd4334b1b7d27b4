"""Geo-velocity: a card used in two countries within 10 minutes.

Each card's payments are taken in event-time order (``event_time_order=True``:
rows wait for the watermark, so disorder within the delay and the split into
batches do not change the result). A payment whose previous payment of the
same card was in another country at most 10 minutes earlier raises an alert
whose ``alert_id`` (``geo-<card>-<event_id>``) is the same on every replay.
State per card: the time and country of its latest payment. ::

    microbatch run examples/stateful/geo_velocity.py --checkpoint chk/geo \\
        --trigger available-now --param output=out/geo
"""

from __future__ import annotations

import polars as pl
from stateful_input import payments

import microbatch as mb

WITHIN_MS = 10 * 60_000
STATE = {"last_ms": pl.Int64, "last_country": pl.String}
OUTPUT = {
    "alert_id": pl.String,
    "card_id": pl.Int64,
    "event_id": pl.Int64,
    "event_time": pl.Datetime("ms", "UTC"),
    "country": pl.String,
    "previous_country": pl.String,
    "previous_time": pl.Datetime("ms", "UTC"),
}


def two_countries(inp: mb.StateInput) -> mb.StateOutput:
    """All cards at once: each payment against the card's previous one."""
    if inp.rows.is_empty():
        return mb.StateOutput()
    previous = inp.state.select(
        "card_id", pl.col("last_ms").alias("t"), pl.col("last_country").alias("country"),
        pl.lit(False).alias("new"))
    payments = inp.rows.select(
        "card_id", pl.col("event_time").dt.epoch("ms").alias("t"), "country", "event_id",
        pl.lit(True).alias("new"))
    # per card: its stored latest payment first, then the new ones in event-time order
    seq = pl.concat([previous, payments], how="diagonal").with_columns(
        pl.col("t").shift().over("card_id").alias("prev_t"),
        pl.col("country").shift().over("card_id").alias("prev_country"),
    )
    alerts = seq.filter(
        pl.col("new") & (pl.col("country") != pl.col("prev_country"))
        & (pl.col("t") - pl.col("prev_t") <= WITHIN_MS)
    ).select(
        pl.format("geo-{}-{}", "card_id", "event_id").alias("alert_id"),
        "card_id", "event_id",
        pl.from_epoch("t", time_unit="ms").dt.replace_time_zone("UTC").alias("event_time"),
        "country", pl.col("prev_country").alias("previous_country"),
        pl.from_epoch("prev_t", time_unit="ms").dt.replace_time_zone("UTC")
        .alias("previous_time"),
    )
    latest = seq.group_by("card_id", maintain_order=True).last().select(
        "card_id", pl.col("t").alias("last_ms"), pl.col("country").alias("last_country"))
    return mb.StateOutput(rows=alerts, upserts=latest)


def rule(stream: mb.Stream, *, state_ttl: str = "1h") -> mb.Stream:
    """``stream`` (``card_id``, ``country``, ``event_id``, ``event_time``, watermarked)
    -> alerts. A card idle for ``state_ttl`` of event time is forgotten (it cannot
    alert with its next payment anyway, which is more than 10 minutes later)."""
    return stream.group_by("card_id").transform_with_state(
        two_countries, state_schema=STATE, output_schema=OUTPUT,
        time_column="event_time", event_time_order=True, ttl=state_ttl, ttl_time="event")


def build(params: dict[str, str]) -> mb.DataStreamWriter:
    return rule(payments(params)).write_parquet(params["output"])
