"""Fraud alerts: 3 or more card transactions in one minute of event time, alerted at once.

The design brief's scenario, as one job with one rule:

- **Input**: card transactions (``event_id``, ``card_id``, ``merchant``,
  ``amount``, ``event_time``) from a Kafka topic (JSON values), or replayed from a
  directory of Parquet files (the lakehouse log; arrival order = file mtime).
- **Rule**: per card and 1-minute tumbling window of *event time* (the payment's
  own timestamp, not its arrival), 3 or more transactions. It fires **early**: in
  the batch where the third transaction arrives, not when the minute closes
  (``fire_once``), and once per window, across crashes and replays.
- **Lateness**: the watermark trails the newest event time by ``delay`` (10 s);
  a transaction up to ``allowed_lateness`` (1 h) late still counts, and can
  raise the alert of its old window when it arrives (mobile clients upload an
  hour late); later ones go to ``late_output`` with their reason, counted.
- **Output**, fanned out from the one rule: the alert, once, to a Kafka topic
  (one transaction per batch) and to an HTTP webhook (``Idempotency-Key`` = the
  alert id, the same body on every redelivery); and a Delta table of alerts,
  one row per ``alert_id``, MERGEd with every later change of the window
  (``revision``), so it ends with the window's final count and total.

An alert is ``alert_id`` (``<card>-<window start in epoch ms>``: deterministic,
the key that keeps a retry from paging twice), ``card_id``, ``window_start``,
``window_end``, ``transactions``, ``total_amount``, ``max_amount`` (exact
decimals), ``first_event_time``, ``last_event_time`` and ``revision`` (0 in the
page; the table's latest)::

    microbatch run jobs/fraud_alerts.py --checkpoint chk/fraud --trigger 1s \\
        --param bootstrap=127.0.0.1:9092 --param topic=transactions \\
        --param output=lake/fraud_alerts --param webhook=http://127.0.0.1:8000/alerts

Params, declared by :class:`Params` (``microbatch run jobs/fraud_alerts.py --help``
lists them; the contract is checked by a harness outside the repo; keep the names):
``input=DIR`` (Parquet files) or ``bootstrap=HOST:PORT`` and ``topic``
(``transactions``); ``max_files_per_batch`` (files) / ``max_records_per_batch``
(Kafka, 50000); ``delay`` (``10s``); ``allowed_lateness`` (``1h``);
``webhook=URL`` (omitted: no webhook; ``webhook_token_env`` names an
environment variable with a bearer token); ``output`` (the Delta table,
``lake/fraud_alerts``); ``late_output`` (a Delta table, ``<output>-late``);
``alerts_topic`` (``fraud-alerts``, only with ``bootstrap``);
``output_format`` (``delta``, or ``iceberg``: the alert and late tables are
Apache Iceberg tables, see :func:`table_sink`) and ``catalog`` (the Iceberg
catalog: ``sqlite:///PATH.db``, ``http://HOST:PORT`` for a REST catalog, or a
configured name).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import polars as pl

import microbatch as mb
from sinks.base import Sink
from sinks.delta import DeltaSink
from sinks.fanout import FanOutSink
from sinks.kafka import KafkaSink
from sinks.routed import Routed

MONEY = pl.Decimal(18, 2)
SCHEMA = {
    "event_id": pl.Int64,
    "card_id": pl.Int64,
    "merchant": pl.String,
    "amount": MONEY,
    "event_time": pl.Datetime("ms", "UTC"),
}
"""A card transaction as it arrives. ``amount`` is money: decoded from JSON text
or Parquet as an exact decimal, so alert totals are exact sums."""
MIN_TRANSACTIONS = 3
WINDOW = "1m"
DELAY = "10s"
ALLOWED_LATENESS = "1h"
START = "2026-01-01T00:00:00+00:00"
PAGE = pl.col("revision") == 0
"""The rows that page (the webhook, the alerts topic): the firing, not its corrections."""


@dataclass(frozen=True)
class Params:
    """The job's parameters (``--param NAME=VALUE``; the names are a contract)."""

    input: Annotated[str | None, "directory of Parquet transaction files"] = None
    bootstrap: Annotated[str | None, "Kafka HOST:PORT (instead of input)"] = None
    topic: Annotated[str, "Kafka topic of the transactions"] = "transactions"
    max_files_per_batch: Annotated[int | None, "files per batch (input)"] = None
    max_records_per_batch: Annotated[int, "records per batch (Kafka)"] = 50_000
    delay: Annotated[str, "watermark delay behind the newest event time"] = DELAY
    allowed_lateness: Annotated[str, "how late a transaction still counts"] = ALLOWED_LATENESS
    webhook: Annotated[str | None, "URL the alerts are POSTed to"] = None
    webhook_token_env: Annotated[str | None, "env variable holding the webhook's token"] = None
    output: Annotated[str, "table of alerts: a path (or, with output_format=iceberg, "
                      "namespace.table)"] = "lake/fraud_alerts"
    late_output: Annotated[str | None, "table of too-late rows (<output>-late)"] = None
    alerts_topic: Annotated[str, "Kafka topic of the alerts (with bootstrap)"] = "fraud-alerts"
    output_format: Annotated[str, "table format of output and late_output: delta or iceberg"] = (
        "delta")
    catalog: Annotated[str | None, "Iceberg catalog (output_format=iceberg): sqlite:///PATH.db, "
                       "http://HOST:PORT or a configured name; default sqlite:///<output's "
                       "directory>/iceberg.db"] = None


def transactions(params: Params) -> mb.Stream:
    """The transactions: Parquet files (``input``) or a Kafka topic (``bootstrap``)."""
    if params.input:
        return mb.read_files(params.input, format="parquet", schema=SCHEMA,
                             max_files_per_batch=params.max_files_per_batch)
    if not params.bootstrap:
        raise mb.JobError(
            "fraud_alerts reads --param input=DIR (Parquet files) or "
            "--param bootstrap=HOST:PORT --param topic=NAME (Kafka)"
        )
    return mb.read_kafka(params.topic, bootstrap=params.bootstrap, format="json",
                         schema=SCHEMA, max_records_per_batch=params.max_records_per_batch)


def alerts(tx: mb.Stream, *, delay: str = DELAY, allowed_lateness: str = ALLOWED_LATENESS,
           ) -> mb.Stream:
    """The rule: cards with ``MIN_TRANSACTIONS`` or more in one window, fired once,
    as soon as it holds, with corrections of the fired window as ``revision`` 1, 2..."""
    return (
        tx.with_watermark("event_time", delay)
        .group_by(mb.window("event_time", WINDOW, allowed_lateness=allowed_lateness),
                  "card_id")
        .agg(
            pl.len().alias("transactions"),
            pl.col("amount").sum().alias("total_amount"),
            pl.col("amount").max().alias("max_amount"),
            pl.col("event_time").min().alias("first_event_time"),
            pl.col("event_time").max().alias("last_event_time"),
        )
        .fire_once(pl.col("transactions") >= MIN_TRANSACTIONS, corrections=True)
        .with_columns(
            pl.format("{}-{}", pl.col("card_id"), pl.col("window_start").dt.epoch("ms"))
            .alias("alert_id")
        )
        .select("alert_id", pl.exclude("alert_id"))
    )


def alert_sinks(params: Params) -> Sink:
    """The pages (the webhook and the alerts topic: revision 0 only) and the alert
    table (every revision, MERGEd by alert id), written at the same time.

    NOTE: a page's latency is the product: it never waits for the table's commit,
    and the batch's sink step costs its slowest sink instead of their sum. Each
    sink is idempotent on the batch id and the batch commits only after all of
    them finished: a failure in any fails the batch, and its re-run sends the
    same pages again (same keys, same bodies) and skips what already landed."""
    routes: list[Sink] = []
    if params.webhook:
        from sinks.webhook import WebhookSink

        hook = WebhookSink(params.webhook, key="alert_id", token_env=params.webhook_token_env)
        routes.append(Routed(hook, where=PAGE))
    if params.bootstrap:
        topic = KafkaSink(params.alerts_topic, bootstrap=params.bootstrap, key="card_id",
                          delivery_guarantee="exactly_once")
        routes.append(Routed(topic, where=PAGE))
    routes.append(Routed(table_sink(params, params.output, merge_keys="alert_id"),
                         output_mode="update", key_columns=("alert_id",)))
    return FanOutSink(routes, concurrent=True)


def build(params: Params) -> mb.DataStreamWriter:
    """The job (see :class:`Params` and the module docstring)."""
    late = table_sink(params, params.late_output or late_table_name(params))
    rule = alerts(transactions(params).on_late(late), delay=params.delay,
                  allowed_lateness=params.allowed_lateness)
    return rule.write_to(alert_sinks(params))


def late_table_name(params: Params) -> str:
    """``<output>-late`` beside a path; ``<namespace>.<table>_late`` for an Iceberg
    identifier (SQL engines would need a hyphenated name quoted)."""
    if params.output_format == "iceberg" and "/" not in params.output:
        return f"{params.output}_late"
    return f"{params.output.rstrip('/')}-late"


def table_sink(params: Params, table: str, *, merge_keys: str | None = None) -> Sink:
    """The Delta or Iceberg table ``table`` (``output_format``), exactly once per batch.

    With ``output_format=iceberg``, ``table`` is either an Iceberg identifier
    (``namespace.name``, in ``catalog``) or a path ``DIR/NAME``: then the table
    ``default.NAME`` lives at exactly that path (its ``metadata/`` and ``data/``
    under it, readable by DuckDB's ``iceberg_scan`` or PyIceberg's
    ``StaticTable``), registered in ``catalog`` or, by default, in the SQLite
    catalog ``DIR/iceberg.db``."""
    if params.output_format == "delta":
        return DeltaSink(table, merge_keys=merge_keys)
    if params.output_format != "iceberg":
        raise mb.JobError(f"output_format must be delta or iceberg, not {params.output_format!r}")
    from sinks.iceberg import IcebergSink

    if "/" not in table and "." in table:
        catalog = params.catalog or "sqlite:///lake/iceberg.db"
        return IcebergSink(table, catalog=catalog, merge_keys=merge_keys)
    path = Path(table).expanduser().absolute()
    catalog = params.catalog or f"sqlite:///{path.parent}/iceberg.db"
    ident = "default." + path.name.replace("-", "_")
    return IcebergSink(ident, catalog=catalog, merge_keys=merge_keys, location=path.as_uri())


# --------------------------------------------------------------------------- producer


def generated_transactions(*, rows: int, seed: int = 0, cards: int = 2_000,
                           late_fraction: float = 0.01, events_per_second: float = 50.0,
                           late_by: tuple[str, str] = ("1m", "1h"),
                           start: str = START) -> pl.DataFrame:
    """Deterministic card transactions (``mb.generate``'s rows) in arrival order:
    ``events_per_second`` of event time, up to 5 s of disorder, ``late_fraction``
    of them ``late_by`` late (a phone uploading what it queued)."""
    from microbatch.sources.generator import GeneratorSource

    src = GeneratorSource(rows_per_second=events_per_second, total_rows=rows, seed=seed,
                          cards=cards, late_fraction=late_fraction, late_by=late_by,
                          start=start)
    origin = src.initial_offset()["start_ms"]
    return src.rows(0, rows, origin_ms=origin).with_columns(pl.col("amount").cast(MONEY))


def write_files(directory: str | os.PathLike[str], data: pl.DataFrame, *, files: int) -> int:
    """Land ``data`` (in arrival order) as ``files`` Parquet files whose mtimes
    follow that order, one second apart, as the file source reads them."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    base_ns = 1_767_225_600 * 10**9  # 2026-01-01: deterministic, whatever the wall clock
    size = -(-data.height // files)
    for i in range(files):
        path = out / f"tx-{i:05d}.parquet"
        tmp = path.with_name(f".{path.name}.tmp")
        data.slice(i * size, size).write_parquet(tmp)
        os.utime(tmp, ns=(base_ns + i * 10**9, base_ns + i * 10**9))
        tmp.rename(path)
    return files


def produce_transactions(bootstrap: str, topic: str = "transactions", *, rows: int = 100_000,
                         partitions: int = 3, seed: int = 0, cards: int = 2_000,
                         late_fraction: float = 0.01, events_per_second: float = 50.0,
                         late_by: tuple[str, str] = ("1m", "1h"),
                         rate: float | None = None, chunk: int = 50_000,
                         config: dict[str, Any] | None = None) -> int:
    """Write generated transactions as JSON (keyed by card) to ``topic``.

    Creates the topic with ``partitions`` partitions when missing. With
    ``rate`` (rows per second of wall time) it paces itself like live
    traffic; otherwise it writes as fast as the broker takes. Returns the
    number of records written; raises ``RuntimeError`` on a delivery error.
    """
    from confluent_kafka import Producer

    from sinks.kafka_client import create_topics

    base = {**(config or {}), "bootstrap.servers": bootstrap}
    create_topics(base, [topic], partitions=partitions, exist_ok=True)
    data = generated_transactions(rows=rows, seed=seed, cards=cards, late_fraction=late_fraction,
                                  events_per_second=events_per_second, late_by=late_by)
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
    """``python jobs/fraud_alerts.py produce --bootstrap HOST:PORT [--rows N] ...`` writes
    generated transactions to Kafka; ``files --dir DIR [--rows N] [--files K]`` lands
    them as Parquet files (the lakehouse log) for ``--param input=DIR``."""
    parser = argparse.ArgumentParser(description="generated card transactions, for the job")
    sub = parser.add_subparsers(dest="command", required=True)
    produce = sub.add_parser("produce", help="to a Kafka topic")
    produce.add_argument("--bootstrap", required=True)
    produce.add_argument("--topic", default="transactions")
    produce.add_argument("--partitions", type=int, default=3)
    produce.add_argument("--rate", type=float, default=None,
                         help="rows per second of wall time (default: as fast as possible)")
    files = sub.add_parser("files", help="as Parquet files in a directory")
    files.add_argument("--dir", required=True)
    files.add_argument("--files", type=int, default=20)
    for command in (produce, files):
        command.add_argument("--rows", type=int, default=100_000)
        command.add_argument("--seed", type=int, default=0)
        command.add_argument("--late-fraction", type=float, default=0.01)
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    if args.command == "files":
        data = generated_transactions(rows=args.rows, seed=args.seed,
                                      late_fraction=args.late_fraction, late_by=("1m", "2h"))
        write_files(args.dir, data, files=args.files)
        print(f"wrote {args.rows} transactions in {args.files} files to {args.dir}")
        return 0
    n = produce_transactions(args.bootstrap, args.topic, rows=args.rows,
                             partitions=args.partitions, seed=args.seed,
                             late_fraction=args.late_fraction, rate=args.rate)
    print(f"wrote {n} transactions to {args.topic} in {time.monotonic() - t0:.1f}s "
          f"({datetime.now().isoformat(timespec='seconds')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
