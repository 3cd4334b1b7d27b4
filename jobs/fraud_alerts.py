"""Fraud alerts: card transactions on Kafka -> alerts to Kafka and to a table, exactly once.

Rule: a card with 3 or more transactions inside one 1-minute tumbling window of
event time. Transactions arrive as JSON on a Kafka topic (``card_id``,
``amount``, ``event_time`` ISO-8601, ``merchant``, ``event_id``), some of them
up to an hour late. The watermark trails the newest event time by 30 s per
Kafka partition; a window's alert is emitted once, when the watermark passes
the window's end. Transactions whose window had already closed go to the
late side output (a Parquet directory), never silently dropped.

Each alert carries a deterministic ``alert_id`` (card and window start), and
goes to (a) a Kafka topic, one transaction per batch (read it with
``isolation.level=read_committed``), and (b) a Delta table (a Parquet
directory with ``--param table_format=parquet``), each exactly once per batch
id. A replay of the same log gives the same alerts::

    python jobs/fraud_alerts.py produce --bootstrap 127.0.0.1:9092 --rows 200000
    microbatch run jobs/fraud_alerts.py --checkpoint chk/fraud --trigger 10s \\
        --param bootstrap=127.0.0.1:9092 --param output=lake/fraud_alerts

Params: ``bootstrap`` (required), ``topic`` (``transactions``),
``alerts_topic`` (``fraud-alerts``), ``output`` (``lake/fraud_alerts``),
``late_output`` (``<output>-late``), ``table_format`` (``delta`` or
``parquet``), ``max_records_per_batch`` (``50000``).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from typing import Any

import polars as pl

import microbatch as mb
from sinks.base import Sink
from sinks.fanout import FanOutSink
from sinks.kafka import KafkaSink
from sinks.parquet import ParquetSink

SCHEMA = {
    "event_id": pl.Int64,
    "card_id": pl.Int64,
    "merchant": pl.String,
    "amount": pl.Decimal(18, 2),
    "event_time": pl.Datetime("ms", "UTC"),
}
"""A card transaction as it is on the topic (JSON). ``amount`` is money: decoded
from the JSON text as an exact decimal, so alert totals are exact sums."""
MIN_TRANSACTIONS = 3
WINDOW = "1m"
WATERMARK_DELAY = "30s"
START = "2026-01-01T00:00:00+00:00"


def transactions(bootstrap: str, topic: str, *, max_records_per_batch: int | None = 50_000,
                 config: dict[str, Any] | None = None) -> mb.Stream:
    """The transactions topic as a stream (value columns plus Kafka metadata)."""
    return mb.read_kafka(topic, bootstrap=bootstrap, format="json", schema=SCHEMA,
                         max_records_per_batch=max_records_per_batch, config=config)


def alerts(tx: mb.Stream) -> mb.Stream:
    """Cards with ``MIN_TRANSACTIONS`` or more transactions in one window, with an ``alert_id``."""
    return (
        tx.with_watermark("event_time", WATERMARK_DELAY)
        .group_by(mb.window("event_time", WINDOW), "card_id")
        .agg(
            pl.len().alias("transactions"),
            pl.col("amount").sum().alias("total_amount"),
            pl.col("amount").max().alias("max_amount"),
        )
        .filter(pl.col("transactions") >= MIN_TRANSACTIONS)
        .with_columns(
            pl.format("{}-{}", pl.col("card_id"), pl.col("window_start").dt.epoch("ms"))
            .alias("alert_id")
        )
    )


def alert_sinks(params: dict[str, str], bootstrap: str) -> Sink:
    """The alerts topic (a Kafka transaction per batch) and the alerts table."""
    output = params.get("output", "lake/fraud_alerts")
    table: Sink
    if params.get("table_format", "delta") == "delta":
        from sinks.delta import DeltaSink

        table = DeltaSink(output)
    else:
        table = ParquetSink(output)
    topic = KafkaSink(params.get("alerts_topic", "fraud-alerts"), bootstrap=bootstrap,
                      key="card_id", delivery_guarantee="exactly_once")
    return FanOutSink([topic, table])


def build(params: dict[str, str]) -> mb.DataStreamWriter:
    """The job (see the module docstring for the params)."""
    bootstrap = params.get("bootstrap")
    if not bootstrap:
        raise mb.JobError("fraud_alerts needs --param bootstrap=HOST:PORT")
    try:
        cap = int(params.get("max_records_per_batch", "50000"))
    except ValueError:
        raise mb.JobError("max_records_per_batch must be an integer") from None
    output = params.get("output", "lake/fraud_alerts")
    late = ParquetSink(params.get("late_output", f"{output.rstrip('/')}-late"))
    tx = transactions(bootstrap, params.get("topic", "transactions"), max_records_per_batch=cap)
    return alerts(tx.on_late(late)).write_to(alert_sinks(params, bootstrap))


# --------------------------------------------------------------------------- producer


def generated_transactions(*, rows: int, seed: int = 0, cards: int = 2_000,
                           late_fraction: float = 0.01, events_per_second: float = 50.0,
                           start: str = START) -> pl.DataFrame:
    """Deterministic card transactions (``mb.generate``'s rows): ``events_per_second``
    of event time, up to 5 s of disorder, ``late_fraction`` of them 1 minute to
    1 hour late."""
    from microbatch.sources.generator import GeneratorSource

    src = GeneratorSource(rows_per_second=events_per_second, total_rows=rows, seed=seed,
                          cards=cards, late_fraction=late_fraction, late_by=("1m", "1h"),
                          start=start)
    origin = src.initial_offset()["start_ms"]
    return src.rows(0, rows, origin_ms=origin)


def produce_transactions(bootstrap: str, topic: str = "transactions", *, rows: int = 100_000,
                         partitions: int = 3, seed: int = 0, cards: int = 2_000,
                         late_fraction: float = 0.01, events_per_second: float = 50.0,
                         rate: float | None = None, chunk: int = 50_000,
                         config: dict[str, Any] | None = None) -> int:
    """Write generated transactions as JSON (keyed by card) to ``topic``.

    Creates the topic with ``partitions`` partitions when missing. With
    ``rate`` (rows per second of wall time) it paces itself like live
    traffic; otherwise it writes as fast as the broker takes. Returns the
    number of records written; raises ``RuntimeError`` on a delivery error.
    """
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    base = {**(config or {}), "bootstrap.servers": bootstrap}
    admin = AdminClient(base)
    if topic not in admin.list_topics(timeout=30).topics:
        fut = admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic]
        try:
            fut.result(30)
        except Exception as exc:  # created meanwhile by someone else is fine
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    data = generated_transactions(rows=rows, seed=seed, cards=cards, late_fraction=late_fraction,
                                  events_per_second=events_per_second)
    producer = Producer({**base, "linger.ms": 20, "compression.type": "lz4",
                         "enable.idempotence": True})
    errors: list[str] = []
    t0 = time.monotonic()
    for lo in range(0, rows, chunk):
        part = data.slice(lo, chunk)
        values = part.write_ndjson().encode().splitlines()
        keys = part["card_id"].cast(pl.String).cast(pl.Binary).to_list()
        messages = [{"value": v, "key": k} for v, k in zip(values, keys, strict=True)]
        pending = messages
        while pending:
            producer.produce_batch(topic, pending,
                                   on_delivery=lambda e, _m: errors.append(str(e)) if e else None)
            pending = [{"value": m["value"], "key": m["key"]} for m in pending if "_error" in m]
            producer.poll(0.05 if pending else 0)
        if rate:
            ahead = (lo + len(part)) / rate - (time.monotonic() - t0)
            if ahead > 0:
                producer.flush(ahead)
                time.sleep(max(0.0, (lo + len(part)) / rate - (time.monotonic() - t0)))
    if producer.flush(60) or errors:
        raise RuntimeError(f"producing to {topic}: {len(errors)} delivery error(s): {errors[:3]}")
    return rows


def main(argv: list[str] | None = None) -> int:
    """``python jobs/fraud_alerts.py produce --bootstrap HOST:PORT [--rows N] ...``."""
    parser = argparse.ArgumentParser(description="write generated card transactions to Kafka")
    sub = parser.add_subparsers(dest="command", required=True)
    produce = sub.add_parser("produce")
    produce.add_argument("--bootstrap", required=True)
    produce.add_argument("--topic", default="transactions")
    produce.add_argument("--rows", type=int, default=100_000)
    produce.add_argument("--partitions", type=int, default=3)
    produce.add_argument("--seed", type=int, default=0)
    produce.add_argument("--late-fraction", type=float, default=0.01)
    produce.add_argument("--rate", type=float, default=None,
                         help="rows per second of wall time (default: as fast as possible)")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    n = produce_transactions(args.bootstrap, args.topic, rows=args.rows,
                             partitions=args.partitions, seed=args.seed,
                             late_fraction=args.late_fraction, rate=args.rate)
    print(f"wrote {n} transactions to {args.topic} in {time.monotonic() - t0:.1f}s "
          f"({datetime.now().isoformat(timespec='seconds')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
