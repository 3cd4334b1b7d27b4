"""A replay of a live Kafka run whose batches were cut by arrival: the late row
that the live run dropped (it came in a later batch than the row that moved the
watermark) is dropped by the replay too, while a backfill of the same topic cuts
one batch and counts it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from kafka_helpers import produce_json

import microbatch as mb

pytestmark = [pytest.mark.kafka]

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SCHEMA = {"card": pl.Int64, "ts": pl.Datetime("ms", "UTC"), "amount": pl.Int64}


def counts(bootstrap: str, topic: str, out: dict[int, pl.DataFrame]) -> mb.DataStreamWriter:
    def keep(df: pl.DataFrame, batch_id: int) -> None:
        if df.height:
            out[batch_id] = df.sort("window_start", "card")

    return (mb.read_kafka(topic, bootstrap=bootstrap, format="json", schema=SCHEMA)
            .with_watermark("ts", "10s")
            .group_by(mb.window("ts", "1m"), "card")
            .agg(pl.len().alias("n"), pl.col("amount").sum().alias("total"))
            .foreach_batch(keep))


def test_a_replay_reproduces_the_arrival_cut_batches_of_a_live_kafka_run(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path,
) -> None:
    topic = new_topic(partitions=1)
    waves = [[(1, 0), (1, 20), (2, 5), (1, 130)], [(1, 40), (2, 200)]]  # (card, second)
    live: dict[int, pl.DataFrame] = {}
    query = counts(bootstrap, topic, live).start(tmp_path / "live", trigger="0s")
    for i, wave in enumerate(waves):
        produce_json(bootstrap, topic, [
            {"card": c, "ts": (T0 + timedelta(seconds=s)).isoformat(), "amount": 10 * i + j}
            for j, (c, s) in enumerate(wave)])
        query.process_all_available(60)
    query.stop(60)

    replayed: dict[int, pl.DataFrame] = {}
    assert counts(bootstrap, topic, replayed).replay(
        tmp_path / "live", tmp_path / "replay").await_termination(60)
    backfill: dict[int, pl.DataFrame] = {}
    assert counts(bootstrap, topic, backfill).start(
        tmp_path / "backfill", trigger="available-now").await_termination(60)

    first_minute = pl.col("window_start") == T0
    emitted = pl.concat(live.values()).filter(first_minute & (pl.col("card") == 1))
    assert emitted["n"].to_list() == [2]  # the row at 40 s came after 130 s moved the mark
    assert replayed.keys() == live.keys()
    assert all(replayed[b].equals(live[b]) for b in live)
    counted = pl.concat(backfill.values()).filter(first_minute & (pl.col("card") == 1))
    assert counted["n"].to_list() == [3]  # one batch: not late there
