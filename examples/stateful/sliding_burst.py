"""The sliding fraud rule: 3 or more payments of a card in any 60 seconds.

Not a tumbling window: the 60 s slide with each payment. Per card, in
event-time order (``event_time_order=True``), a payment is the third in 60 s
when the payment two before it is less than 60 s older. The alert fires on
the payment that starts a burst (the previous payment was not one), so a long
burst raises one alert, with the deterministic ``alert_id``
``burst-<card>-<event_id>``. State per card: the times of its last two
payments and whether the last one was in a burst. ::

    microbatch run examples/stateful/sliding_burst.py --checkpoint chk/burst \\
        --trigger available-now --param output=out/burst
"""

from __future__ import annotations

import polars as pl
from stateful_input import payments

import microbatch as mb

SPAN_MS = 60_000
COUNT = 3
STATE = {"t1": pl.Int64, "t2": pl.Int64, "in_burst": pl.Boolean}
"""``t1`` the latest payment's time, ``t2`` the one before, ``in_burst`` of ``t1``."""
OUTPUT = {
    "alert_id": pl.String,
    "card_id": pl.Int64,
    "event_id": pl.Int64,
    "event_time": pl.Datetime("ms", "UTC"),
    "burst_start": pl.Datetime("ms", "UTC"),
}


def bursts(inp: mb.StateInput) -> mb.StateOutput:
    """Every card's new payments against its last two, vectorized with ``over``."""
    if inp.rows.is_empty():
        return mb.StateOutput()
    state = inp.state
    older = state.select("card_id", pl.col("t2").alias("t"), pl.lit(None, pl.Boolean)
                         .alias("known"), pl.lit(False).alias("new"))
    last = state.select("card_id", pl.col("t1").alias("t"), pl.col("in_burst").alias("known"),
                        pl.lit(False).alias("new"))
    rows = inp.rows.select("card_id", "event_id", pl.col("event_time").dt.epoch("ms")
                           .alias("t"), pl.lit(True).alias("new"))
    # per card: t2, t1, then the new payments in event-time order
    back = COUNT - 1
    seq = pl.concat([older, last, rows], how="diagonal").with_columns(
        pl.col("t").shift(back).over("card_id").alias("start"))
    seq = seq.with_columns(
        pl.when("new").then((pl.col("t") - pl.col("start") < SPAN_MS).fill_null(False))
        .otherwise(pl.col("known").fill_null(False)).alias("burst"))
    seq = seq.with_columns(
        pl.col("burst").shift().over("card_id").fill_null(False).alias("was_burst"))
    alerts = seq.filter(pl.col("new") & pl.col("burst") & ~pl.col("was_burst")).select(
        pl.format("burst-{}-{}", "card_id", "event_id").alias("alert_id"),
        "card_id", "event_id",
        pl.from_epoch("t", time_unit="ms").dt.replace_time_zone("UTC").alias("event_time"),
        pl.from_epoch("start", time_unit="ms").dt.replace_time_zone("UTC").alias("burst_start"),
    )
    latest = seq.group_by("card_id", maintain_order=True).agg(
        pl.col("t").last().alias("t1"), pl.col("t").slice(-2, 1).first().alias("t2"),
        pl.col("burst").last().alias("in_burst"))
    return mb.StateOutput(rows=alerts, upserts=latest)


def rule(stream: mb.Stream) -> mb.Stream:
    """``stream`` (``card_id``, ``event_id``, ``event_time``, watermarked) -> alerts.
    A card idle for 10 minutes of event time is forgotten: its last two payments
    can no longer be within 60 s of a new one."""
    return stream.group_by("card_id").transform_with_state(
        bursts, state_schema=STATE, output_schema=OUTPUT, time_column="event_time",
        event_time_order=True, ttl="10m", ttl_time="event")


def build(params: dict[str, str]) -> mb.DataStreamWriter:
    return rule(payments(params)).write_parquet(params["output"])
