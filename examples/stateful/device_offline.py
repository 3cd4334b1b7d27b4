"""A device silent for 5 minutes: an event-time timer raises an ``offline`` event.

Heartbeats (``device_id``, ``event_time``) are taken per device in event-time
order (``event_time_order=True``). A silence of more than 5 minutes between two
heartbeats gives ``offline`` at the last heartbeat + 5 min and ``online`` at
the next heartbeat. The silence after the latest heartbeat is caught by a
timer at that heartbeat + 5 min: it fires when the watermark passes it, even
if no row of the device ever comes again (or no row at all: an idle query
still runs the batch that fires it). Each event's ``event_key``
(``<device>-<status>-<epoch ms>``) is the same on every replay. ::

    microbatch run examples/stateful/device_offline.py --checkpoint chk/devices \\
        --trigger available-now --param output=out/devices
"""

from __future__ import annotations

import polars as pl
from stateful_input import payments

import microbatch as mb

SILENCE_MS = 5 * 60_000
STATE = {"last_seen_ms": pl.Int64, "offline_at_ms": pl.Int64}
OUTPUT = {
    "event_key": pl.String,
    "device_id": pl.Int64,
    "status": pl.String,
    "at": pl.Datetime("ms", "UTC"),
}


def silences(inp: mb.StateInput) -> mb.StateOutput:
    """Gaps between heartbeats, and expired silence timers, for all devices at once."""
    stored = inp.state.select(
        "device_id", pl.col("last_seen_ms").alias("t"), "offline_at_ms",
        pl.lit(False).alias("new"))
    beats = inp.rows.select(
        "device_id", pl.col("event_time").dt.epoch("ms").alias("t"), pl.lit(True).alias("new"))
    seq = pl.concat([stored, beats], how="diagonal").with_columns(
        pl.col("t").shift().over("device_id").alias("prev_t"),
        # an offline already raised by the timer (only the stored row carries it)
        pl.col("offline_at_ms").shift().over("device_id").alias("raised"),
    )
    gaps = seq.filter(pl.col("new") & (pl.col("t") - pl.col("prev_t") > SILENCE_MS))
    went_offline = gaps.filter(
        pl.col("raised").is_null() | (pl.col("raised") != pl.col("prev_t") + SILENCE_MS)
    ).select("device_id", (pl.col("prev_t") + SILENCE_MS).alias("at_ms"),
             pl.lit("offline").alias("status"))
    came_back = gaps.select("device_id", pl.col("t").alias("at_ms"),
                            pl.lit("online").alias("status"))
    latest = seq.group_by("device_id", maintain_order=True).agg(
        pl.col("t").last().alias("last_seen_ms"),
        pl.col("new").any().alias("heard"),
        pl.col("offline_at_ms").first().alias("offline_at_ms"),
    )
    # a timer is current when it is the latest heartbeat's: no heartbeat came since
    fired = inp.timers.join(latest, on="device_id").filter(
        (pl.col("timer_ms") == pl.col("last_seen_ms") + SILENCE_MS)
        & (pl.col("offline_at_ms").is_null() | (pl.col("offline_at_ms") != pl.col("timer_ms")))
    ).select("device_id", pl.col("timer_ms").alias("at_ms"), pl.lit("offline").alias("status"))
    events = pl.concat([went_offline, came_back, fired]).sort("device_id", "at_ms", "status")
    state = latest.join(fired.select("device_id", "at_ms"), on="device_id", how="left").select(
        "device_id", "last_seen_ms",
        pl.coalesce(
            "at_ms",  # raised now
            pl.when(pl.col("heard")).then(None).otherwise(pl.col("offline_at_ms")),
        ).alias("offline_at_ms"),
    )
    timers = latest.filter("heard").select(
        "device_id", (pl.col("last_seen_ms") + SILENCE_MS).alias("timer_ms"))
    return mb.StateOutput(
        rows=events.select(
            pl.format("{}-{}-{}", "device_id", "status", "at_ms").alias("event_key"),
            "device_id", "status",
            pl.from_epoch("at_ms", time_unit="ms").dt.replace_time_zone("UTC").alias("at"),
        ),
        upserts=state,
        timers=timers,
    )


def rule(stream: mb.Stream) -> mb.Stream:
    """``stream`` (``device_id``, ``event_time``, watermarked) -> offline/online events."""
    return stream.group_by("device_id").transform_with_state(
        silences, state_schema=STATE, output_schema=OUTPUT,
        time_column="event_time", event_time_order=True)


def build(params: dict[str, str]) -> mb.DataStreamWriter:
    return rule(payments(params).select("device_id", "event_time")).write_parquet(
        params["output"])
