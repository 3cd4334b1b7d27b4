"""A session-like running total per card, forgotten by TTL after 30 minutes idle.

Each payment gets the card's running total of the current spending session:
a session ends when the card has no payment for 30 minutes of event time, and
the next payment starts a new total. ``ttl="30m"`` with ``ttl_time="event"``
removes a card's state once the watermark is 30 minutes past its latest
payment, so the state holds only the cards active in the last 30 minutes, not
every card ever seen; the results do not change (any later payment starts a new
session anyway). ::

    microbatch run examples/stateful/running_total.py --checkpoint chk/totals \\
        --trigger available-now --param output=out/totals
"""

from __future__ import annotations

import polars as pl
from stateful_input import payments

import microbatch as mb

GAP_MS = 30 * 60_000
STATE = {"total": pl.Float64, "last_ms": pl.Int64}
OUTPUT = {
    "card_id": pl.Int64,
    "event_id": pl.Int64,
    "event_time": pl.Datetime("ms", "UTC"),
    "amount": pl.Float64,
    "session_total": pl.Float64,
}


def session_totals(inp: mb.StateInput) -> mb.StateOutput:
    """Cumulative sums per card and session, the stored total as the first term."""
    if inp.rows.is_empty():
        return mb.StateOutput()
    stored = inp.state.select("card_id", pl.col("last_ms").alias("t"),
                              pl.col("total").alias("amount"), pl.lit(False).alias("new"))
    rows = inp.rows.select("card_id", "event_id", "event_time",
                           pl.col("event_time").dt.epoch("ms").alias("t"), "amount",
                           pl.lit(True).alias("new"))
    seq = pl.concat([stored, rows], how="diagonal")
    gap = pl.col("t") - pl.col("t").shift().over("card_id")
    seq = seq.with_columns((gap > GAP_MS).fill_null(True).cum_sum().over("card_id")
                           .alias("session"))
    # NOTE: cum_sum adds in sequence, so the stored total + later amounts is the same
    # float as one pass over the whole history
    seq = seq.with_columns(pl.col("amount").cum_sum().over("card_id", "session")
                           .alias("session_total"))
    latest = seq.group_by("card_id", maintain_order=True).agg(
        pl.col("session_total").last().alias("total"), pl.col("t").last().alias("last_ms"))
    return mb.StateOutput(
        rows=seq.filter("new").select(*OUTPUT),
        upserts=latest,
    )


def rule(stream: mb.Stream) -> mb.Stream:
    """``stream`` (``card_id``, ``event_id``, ``event_time``, ``amount``, watermarked)
    -> each payment with its session total."""
    return stream.group_by("card_id").transform_with_state(
        session_totals, state_schema=STATE, output_schema=OUTPUT, time_column="event_time",
        event_time_order=True, ttl="30m", ttl_time="event")


def build(params: dict[str, str]) -> mb.DataStreamWriter:
    return rule(payments(params)).write_parquet(params["output"])
