"""The Nexmark events into Kafka: one topic per stream (``<prefix>-person``,
``-auction``, ``-bid``, the three views the Parquet directories hold), one JSON
value per event, in event order within each partition.

Each file's frame is encoded to newline-delimited JSON in one Polars call;
``confluent-kafka`` then takes one ``produce`` call per record (its API has no
batch call). This loads a topic for a benchmark; it is not on the engine's path.
The engine reads it back with ``mb.read_kafka(topic, format="json",
schema=dataset.schema(stream))``.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from benchmarks.nexmark.data import NexmarkDataset
from benchmarks.nexmark.generator import STREAMS


def topic_name(prefix: str, stream: str) -> str:
    """The topic of ``stream`` (``person``, ``auction`` or ``bid``)."""
    return f"{prefix}-{stream}"


def produce(ds: NexmarkDataset, bootstrap: str, *, prefix: str = "nexmark",
            partitions: int = 1, config: dict[str, Any] | None = None) -> dict[str, int]:
    """Write every event of ``ds`` to its stream's topic (created with ``partitions``
    partitions if missing; records spread round-robin by position, so each partition
    is in event order); returns the records written per topic, all delivered."""
    from confluent_kafka import Producer

    from sinks.kafka_client import create_topics

    topics = [topic_name(prefix, s) for s in STREAMS]
    create_topics(bootstrap, topics, partitions=partitions, replication_factor=1, exist_ok=True)
    errors: list[Any] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "enable.idempotence": True, **(config or {})})
    written = dict.fromkeys(topics, 0)
    for stream in STREAMS:
        topic = topic_name(prefix, stream)
        for path in sorted(ds.stream_dir(stream).glob("part-*.parquet")):
            lines = pl.read_parquet(path).write_ndjson().encode().splitlines()
            for value in lines:
                part = written[topic] % partitions
                while True:
                    try:
                        producer.produce(topic, value, partition=part, on_delivery=lambda e, _m:
                                         errors.append(e) if e else None)
                        break
                    except BufferError:
                        producer.poll(0.1)
                written[topic] += 1
    if producer.flush(120) != 0 or errors:
        raise RuntimeError(f"Kafka did not take every Nexmark record: {errors[:3]}")
    return written
