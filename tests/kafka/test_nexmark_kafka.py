"""The Nexmark events written to Kafka topics read back as the generator's frames, and a
query over the topics equals its one-shot oracle."""

from __future__ import annotations

import uuid
from pathlib import Path

import polars as pl

import microbatch as mb
from benchmarks.nexmark.data import NexmarkDataset
from benchmarks.nexmark.generator import STREAMS, NexmarkConfig
from benchmarks.nexmark.kafka import produce, topic_name
from benchmarks.nexmark.queries import QUERIES
from benchmarks.nexmark.run import verdict


def collect(stream: mb.Stream, checkpoint: Path) -> pl.DataFrame:
    """Every row the stream emits in an available-now run (windows flushed at the end)."""
    parts: list[pl.DataFrame] = []

    def keep(df: pl.DataFrame, _batch: int) -> None:
        parts.append(df)

    stream.foreach_batch(keep).start(checkpoint=checkpoint, trigger="available-now",
                                     flush_at_end=True).await_termination()
    return pl.concat(parts)


def test_nexmark_topics_hold_the_events_and_feed_a_query(bootstrap: str, tmp_path: Path) -> None:
    ds = NexmarkDataset(2_000, 500, NexmarkConfig(rate=200, seed=5), root=tmp_path).ensure()
    prefix = f"nexmark-{uuid.uuid4().hex[:8]}"
    written = produce(ds, bootstrap, prefix=prefix, partitions=2)
    assert written == {topic_name(prefix, s): ds.scan(s).select(pl.len()).collect().item()
                       for s in STREAMS}

    def reader(stream: str) -> mb.Stream:
        return mb.read_kafka(topic_name(prefix, stream), bootstrap=bootstrap, format="json",
                             schema=ds.schema(stream), metadata_columns=())

    for stream in STREAMS:
        got = collect(reader(stream), tmp_path / f"chk-{stream}")
        want = ds.scan(stream).collect()
        assert got.sort(got.columns).equals(want.sort(want.columns)), stream

    query = QUERIES["q11"]
    sessions = query.build({"bid": lambda: reader("bid")}, ds.config)
    oracle = query.oracle({s: ds.scan(s) for s in query.inputs}, ds.config).collect()
    assert verdict(query, collect(sessions, tmp_path / "chk-q11"), oracle) is None
