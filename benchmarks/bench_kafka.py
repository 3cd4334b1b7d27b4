"""Kafka source throughput vs a raw confluent-kafka consume loop, in the same run.

    .venv/bin/python benchmarks/bench_kafka.py [--records 1000000] [--bootstrap HOST:PORT]

Without ``--bootstrap`` it starts its own broker with ``scripts/kafka_broker.py`` (in a
temporary directory) and stops it at the end. It writes ``--records`` JSON
card transactions (``mb.generate`` rows, ~110 bytes each) to a fresh topic
of ``--partitions`` partitions, then measures, each ``--repeat`` times (best
and median reported):

- ``raw consume``: a confluent-kafka consumer with the source's fetch
  settings reading every record and touching its value: no decoding, no
  Arrow (the floor for any Python Kafka reader on this machine);
- ``raw consume, librdkafka defaults``: the same with default fetch settings;
- ``source.read``: ``KafkaSource.read`` over the whole topic in batches of
  ``--batch`` records: fetch, per-partition ordering, bulk JSON decode into
  the schema, metadata columns;
- ``decode only``: ``decode_values`` over the same values already in memory
  (the cost of decoding per million records);
- ``query``: ``mb.read_kafka(...)`` -> no-op sink with ``available-now``: the
  whole engine (write-ahead, plan, commit, progress) on top.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import microbatch as mb  # noqa: E402
from benchmarks.harness import markdown_table, median  # noqa: E402
from microbatch.sources.base import SourceContext  # noqa: E402
from microbatch.sources.generator import GeneratorSource  # noqa: E402
from microbatch.sources.kafka import CONSUMER_DEFAULTS, KafkaSource  # noqa: E402
from microbatch.sources.kafka_decode import decode_values  # noqa: E402
from scripts.kafka_broker import running_broker  # noqa: E402

SCHEMA = {"event_id": pl.Int64, "card_id": pl.Int64, "merchant": pl.String,
          "amount": pl.Float64, "event_time": pl.Datetime("ms", "UTC")}


def produce(bootstrap: str, topic: str, records: int, partitions: int) -> float:
    """Write ``records`` JSON events round-robin over partitions; seconds taken."""
    from confluent_kafka import Producer

    from sinks.kafka_client import create_topics

    create_topics(bootstrap, [topic], partitions=partitions, replication_factor=1)
    time.sleep(1)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "batch.size": 1_000_000, "compression.type": "lz4",
                         "queue.buffering.max.messages": 1_000_000})
    src = GeneratorSource(rows_per_second=None, total_rows=records, start="2026-01-01T00:00:00Z")
    t0 = time.perf_counter()
    chunk = 200_000
    for lo in range(0, records, chunk):
        values = src.rows(lo, min(records, lo + chunk), origin_ms=0).write_ndjson().encode()
        lines = values.splitlines()
        for p in range(partitions):
            pending = [{"value": v} for v in lines[p::partitions]]
            while pending:
                producer.produce_batch(topic, pending, partition=p)
                pending = [{"value": m["value"]} for m in pending if "_error" in m]
                producer.poll(0.05 if pending else 0)
    assert producer.flush(120) == 0
    return time.perf_counter() - t0


def raw_consume(bootstrap: str, topic: str, partitions: int, records: int, *,
                tuned: bool) -> float:
    """Seconds to consume every record, touching each value (no decoding)."""
    from confluent_kafka import Consumer, TopicPartition

    cfg = {"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
           "enable.auto.commit": False, "enable.partition.eof": True}
    if tuned:
        cfg.update({k: v for k, v in CONSUMER_DEFAULTS.items() if k != "isolation.level"})
    consumer = Consumer(cfg)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen = eof = 0
    t0 = time.perf_counter()
    while eof < partitions:
        for m in consumer.consume(100_000, timeout=0.2):
            if m.error() is not None:
                eof += 1
            else:
                m.value()
                seen += 1
    elapsed = time.perf_counter() - t0
    consumer.close()
    assert seen == records, (seen, records)
    return elapsed


def source_read(bootstrap: str, topic: str, records: int, batch: int) -> tuple[float, list[bytes]]:
    """Seconds for KafkaSource.read over the topic in capped batches; one batch's values."""
    src = KafkaSource(topic, bootstrap=bootstrap, schema=SCHEMA, max_records_per_batch=batch)
    src.open(SourceContext("0", None))
    start = src.initial_offset()
    rows = 0
    t0 = time.perf_counter()
    while True:
        end = src.latest_offset(start)
        if src.compare(end, start) <= 0:
            break
        rows += src.read(start, end).data.height
        src.commit(end)
        start = end
    elapsed = time.perf_counter() - t0
    # values of the first batch, for the decode-only measurement
    first = src.initial_offset()
    sample = src.read(first, src.latest_offset(first))
    src.close()
    assert rows == records, (rows, records)
    values = sample.data.select(pl.exclude("key", "topic", "partition", "offset", "timestamp"))
    return elapsed, values.write_ndjson().encode().splitlines()


def decode_only(values: list[bytes]) -> float:
    """Seconds per million values for decode_values alone."""
    gc.disable()
    try:
        t0 = time.perf_counter()
        decoded = decode_values(values, format="json", schema=pl.Schema(SCHEMA))
        elapsed = time.perf_counter() - t0
    finally:
        gc.enable()
    assert decoded.data.height == len(values)
    return elapsed / len(values) * 1_000_000


def query(bootstrap: str, topic: str, records: int, batch: int) -> float:
    """Seconds for a whole available-now query into a no-op sink."""
    seen = []
    with tempfile.TemporaryDirectory() as chk:
        q = mb.read_kafka(topic, bootstrap=bootstrap, schema=SCHEMA,
                          max_records_per_batch=batch).foreach_batch(
            lambda df, _b: seen.append(df.height)).start(checkpoint=chk,
                                                         trigger="available-now")
        t0 = time.perf_counter()
        q.await_termination(600)
        elapsed = time.perf_counter() - t0
    assert sum(seen) == records
    return elapsed


def measure(repeat: int, fn: Callable[[], float]) -> list[float]:
    """``fn``'s own seconds (it times the part that matters), ``repeat`` times."""
    return [fn() for _ in range(repeat)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--batch", type=int, default=250_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bootstrap", default=None)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap
        if bootstrap is None:
            bootstrap = stack.enter_context(running_broker()).bootstrap
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        n = args.records
        produced = produce(bootstrap, topic, n, args.partitions)
        print(f"produced {n:,} records to {args.partitions} partitions in {produced:.1f}s "
              f"({n / produced:,.0f} rec/s)\n")
        results: list[tuple[str, list[float]]] = []
        results.append(("raw consume (tuned fetch)", measure(
            args.repeat, lambda: raw_consume(bootstrap, topic, args.partitions, n, tuned=True))))
        results.append(("raw consume (librdkafka defaults)", measure(
            args.repeat, lambda: raw_consume(bootstrap, topic, args.partitions, n, tuned=False))))
        values: list[bytes] = []

        def read() -> float:
            nonlocal values
            elapsed, values = source_read(bootstrap, topic, n, args.batch)
            return elapsed

        results.append((f"KafkaSource.read, {args.batch:,}/batch", measure(args.repeat, read)))
        results.append((f"query -> no-op sink, {args.batch:,}/batch", measure(
            args.repeat, lambda: query(bootstrap, topic, n, args.batch))))
        decode = measure(args.repeat, lambda: decode_only(values))
        base = min(results[0][1])
        print("\n".join(markdown_table(
            ("measurement", "best s", "median s", "rec/s (best)", "vs raw"),
            [(name, f"{min(times):.2f}", f"{median(times):.2f}", f"{n / min(times):,.0f}",
              f"{min(times) / base:.2f}x") for name, times in results],
            align="lrrrr")))
        print(f"\ndecode only (JSON -> 5 typed columns, incl. ISO datetimes): "
              f"{min(decode):.2f} s per million records (median {median(decode):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
