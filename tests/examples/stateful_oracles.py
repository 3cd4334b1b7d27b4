"""One-shot Polars answers for the stateful examples, from the whole input at once.

Written apart from the examples' streaming functions: each takes every input
row (in arrival order) and the final watermark, sorts each key's rows by event
time (ties in arrival order) and applies the rule's definition directly.
"""

from __future__ import annotations

import polars as pl

MIN = 60_000


def released(rows: pl.DataFrame, watermark_ms: int) -> pl.DataFrame:
    """The rows the watermark has passed, with ``t`` (epoch ms), in (t, arrival) order."""
    return (
        rows.with_row_index("arrival")
        .with_columns(pl.col("event_time").dt.epoch("ms").alias("t"))
        .filter(pl.col("t") <= watermark_ms)
        .sort("t", "arrival")
    )


def geo_velocity(rows: pl.DataFrame, watermark_ms: int) -> pl.DataFrame:
    """Payments whose card's previous payment was in another country <= 10 min before."""
    s = released(rows, watermark_ms).with_columns(
        pl.col("t").shift().over("card_id").alias("prev_t"),
        pl.col("country").shift().over("card_id").alias("prev_c"),
    )
    hit = s.filter((pl.col("country") != pl.col("prev_c")) & (pl.col("t") - pl.col("prev_t")
                                                              <= 10 * MIN))
    return hit.select(
        pl.format("geo-{}-{}", "card_id", "event_id").alias("alert_id"),
        "card_id", "event_id", "country", pl.col("prev_c").alias("previous_country"))


def device_offline(rows: pl.DataFrame, watermark_ms: int) -> pl.DataFrame:
    """offline at last + 5 min and online at the next heartbeat for every silence
    > 5 min; offline after the latest heartbeat when last + 5 min <= watermark."""
    silence = 5 * MIN
    s = released(rows, watermark_ms).with_columns(
        pl.col("t").shift().over("device_id").alias("prev_t"),
        pl.col("t").shift(-1).over("device_id").alias("next_t"),
    )
    gaps = s.filter(pl.col("t") - pl.col("prev_t") > silence)
    tail = s.filter(pl.col("next_t").is_null() & (pl.col("t") + silence <= watermark_ms))
    events = pl.concat([
        gaps.select("device_id", (pl.col("prev_t") + silence).alias("at"),
                    pl.lit("offline").alias("status")),
        gaps.select("device_id", pl.col("t").alias("at"), pl.lit("online").alias("status")),
        tail.select("device_id", (pl.col("t") + silence).alias("at"),
                    pl.lit("offline").alias("status")),
    ])
    return events.select(pl.format("{}-{}-{}", "device_id", "status", "at").alias("event_key"),
                         "device_id", "status")


def sliding_burst(rows: pl.DataFrame, watermark_ms: int) -> pl.DataFrame:
    """The first payment of each run of payments that are each the 3rd within 60 s."""
    s = released(rows, watermark_ms).with_columns(
        ((pl.col("t") - pl.col("t").shift(2).over("card_id")) < MIN).fill_null(False)
        .alias("burst"))
    s = s.with_columns(pl.col("burst").shift().over("card_id").fill_null(False).alias("before"))
    return s.filter(pl.col("burst") & ~pl.col("before")).select(
        pl.format("burst-{}-{}", "card_id", "event_id").alias("alert_id"), "card_id", "event_id")


def running_total(rows: pl.DataFrame, watermark_ms: int) -> pl.DataFrame:
    """Each payment with the sum of its card's session so far (a gap > 30 min
    starts a session)."""
    s = released(rows, watermark_ms)
    new_session = (pl.col("t") - pl.col("t").shift().over("card_id") > 30 * MIN).fill_null(True)
    s = s.with_columns(new_session.cum_sum().over("card_id").alias("session"))
    return s.select("card_id", "event_id", "amount",
                    pl.col("amount").cum_sum().over("card_id", "session").alias("session_total"))
