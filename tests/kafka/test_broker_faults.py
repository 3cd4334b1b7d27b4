"""External faults of the Kafka broker, timed to the moment that matters.

The broker here is this module's own (not the session's, which other tests
share): a real KRaft broker started by the broker helper (``scripts.kafka_broker``),
SIGKILLed (``kill -9`` of the JVM) or SIGSTOPped, and restarted on the same
log directory and port. The moment comes from the engine's own lifecycle
points (:mod:`microbatch.engine.faults`): the test wraps the function the
engine calls at each point and does its damage to the broker there, e.g.
right after batch 3 was written ahead, before its records are read.

Every case ends with the output compared to a one-shot oracle: every record
exactly once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from kafka_helpers import ROOT, consume_all, produce_json

import microbatch as mb
from microbatch.engine import execution
from microbatch.exceptions import SourceError
from scripts import kafka_broker
from sinks.exceptions import SinkError

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SCHEMA = {"event_id": pl.Int64, "card_id": pl.Int64, "amount": pl.Float64}
SMALL_FETCHES = {"max.partition.fetch.bytes": 2048, "queued.min.messages": 20,
                 "fetch.queue.backoff.ms": 5}
"""Consumer settings that keep the prefetch small (the defaults prefetch whole batches),
without waiting 1 s (``fetch.queue.backoff.ms``'s default) each time the queue is full."""
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


class OwnBroker:
    """A broker that only this module uses, so it may be killed and frozen."""

    def __init__(self, local: kafka_broker.LocalBroker) -> None:
        self.local = local
        self.directory = local.directory
        assert local.bootstrap is not None, "running_broker yields a started broker"
        self.bootstrap = local.bootstrap
        self.restarts: list[float] = []
        """Seconds each restart took (from the call to a broker that answers)."""

    @property
    def pid(self) -> int:
        return int((self.directory / "broker.pid").read_text())

    def kill(self) -> None:
        """``kill -9`` the broker's JVM and wait until it is gone."""
        pid = self.pid
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                return
            if state == "Z":
                return
            time.sleep(0.02)
        raise AssertionError(f"the broker {pid} survived SIGKILL")

    def start(self) -> None:
        t0 = time.monotonic()
        assert self.local.start() == self.bootstrap, \
            "the restarted broker moved to another address"
        self.restarts.append(time.monotonic() - t0)

    def new_topic(self, partitions: int = 3) -> str:
        from sinks.kafka_client import create_topics

        name = f"f-{uuid.uuid4().hex[:10]}"
        create_topics(self.bootstrap, [name], partitions=partitions, replication_factor=1)
        return name


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnBroker]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        reason = "no Java 17+ on PATH (needed to run the Kafka broker)"
        if IN_CI:
            pytest.fail(f"Kafka tests cannot run in CI: {reason}", pytrace=False)
        pytest.skip(f"!!! KAFKA TESTS SKIPPED: {reason} !!!")
    # running_broker sends SIGCONT before it stops the broker: never left frozen
    with kafka_broker.running_broker(tmp_path_factory.mktemp("faulty-broker")) as local:
        yield OwnBroker(local)


@pytest.fixture
def at_point(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, int, Callable[[], None]], None]:
    """``at_point(point, batch_id, action)``: run ``action`` once, in the query's
    thread, when the engine reaches ``point`` of ``batch_id`` (then go on)."""
    original = execution.fault_point
    armed: dict[tuple[str, int], Callable[[], None]] = {}

    def hooked(name: str, batch_id: int) -> None:
        action = armed.pop((name, batch_id), None)
        if action is not None:
            action()
        original(name, batch_id)

    monkeypatch.setattr(execution, "fault_point", hooked)

    def arm(point: str, batch_id: int, action: Callable[[], None]) -> None:
        armed[(point, batch_id)] = action

    return arm


def produce_small_batches(bootstrap: str, topic: str, rows: list[dict[str, object]]) -> None:
    """Rows as JSON, round-robin over 3 partitions, in record batches of at most 1 KiB
    (a fetch returns at least one whole record batch, so big ones defeat SMALL_FETCHES)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "batch.size": 1024, "linger.ms": 1,
                         "enable.idempotence": True})
    for i, row in enumerate(rows):
        producer.produce(topic, json.dumps(row).encode(), partition=i % 3)
        if i % 1000 == 999:
            producer.poll(0)
    assert producer.flush(60) == 0


def events(n: int, start: int = 0) -> list[dict[str, object]]:
    return [{"event_id": i, "card_id": i % 7, "amount": float(i % 50)}
            for i in range(start, start + n)]


def later(seconds: float, action: Callable[[], None]) -> threading.Thread:
    """Run ``action`` on a thread after ``seconds`` (an outage's end)."""
    def run() -> None:
        time.sleep(seconds)
        action()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def status(chk: Path) -> dict[str, Any]:
    """``microbatch status CHK --json``, the command an operator runs."""
    done = subprocess.run([sys.executable, "-m", "microbatch.cli", "status", str(chk), "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def source_query(broker: OwnBroker, topic: str, out: Path, chk: Path, *,
                 broker_timeout: str = "60s") -> mb.StreamingQuery:
    # the default trigger (back to back, no read-ahead): batch N's read starts only
    # after batch N was written ahead, and the consumer prefetches at most ~2 KiB a
    # partition, so at after_write_ahead@N most of batch N is still on the broker
    return (
        mb.read_kafka(topic, bootstrap=broker.bootstrap, schema=SCHEMA,
                      max_records_per_batch=600, broker_timeout=broker_timeout,
                      config=SMALL_FETCHES)
        .select("event_id", "card_id", "amount", "partition", "offset")
        .write_parquet(out)
        .start(chk)
    )


def assert_each_once(out: Path, n: int) -> None:
    got = mb.parquet_table(out)
    oracle = pl.DataFrame(events(n), schema=SCHEMA)
    assert got.height == n
    assert got.select(list(SCHEMA)).sort("event_id").equals(oracle)


def test_broker_sigkilled_mid_source_read_then_restarted(
    broker: OwnBroker, at_point: Callable[..., None], tmp_path: Path
) -> None:
    """Batch 2's range is recorded, part of it already prefetched by the consumer,
    the rest on a broker that is SIGKILLed: the read waits (librdkafka reconnects),
    the restarted broker serves the rest from its log, each record lands once."""
    topic = broker.new_topic(3)
    n = 3_000
    produce_small_batches(broker.bootstrap, topic, events(n))
    out, chk = tmp_path / "out", tmp_path / "chk"
    restarted: list[threading.Thread] = []

    def kill() -> None:
        broker.kill()
        restarted.append(later(1.0, broker.start))

    at_point("after_write_ahead", 2, kill)
    q = source_query(broker, topic, out, chk)
    try:
        q.process_all_available(timeout=120)
        assert q.exception is None
        progress = [r for r in q.recent_progress if r["batch_id"] == 2]
    finally:
        q.stop()
    assert restarted, "the fault point was not reached"
    restarted[0].join(60)
    assert_each_once(out, n)
    # the read of batch 2 waited for the broker to come back: the fault was mid-read
    assert progress[0]["duration_ms"]["read"] >= 1000.0
    assert progress[0]["input_rows"] == 600


def test_broker_sigkilled_during_transactional_sink_commit(
    broker: OwnBroker, at_point: Callable[..., None], tmp_path: Path
) -> None:
    """Kafka -> Kafka, exactly once: the broker dies between the batch's records and
    its commit (send_offsets + commit_transaction). Whatever the transaction's fate,
    a read_committed consumer sees every record once after the query finishes."""
    source, target = broker.new_topic(3), broker.new_topic(3)
    n = 3_000
    produce_json(broker.bootstrap, source, events(n), partitions=[i % 3 for i in range(n)])
    chk = tmp_path / "chk"
    restarted: list[threading.Thread] = []

    def kill() -> None:
        broker.kill()
        restarted.append(later(1.0, broker.start))

    def start() -> mb.StreamingQuery:
        return (
            mb.read_kafka(source, bootstrap=broker.bootstrap, schema=SCHEMA,
                          max_records_per_batch=600, broker_timeout="60s")
            .select("event_id", "card_id", "amount")
            .write_kafka(target, bootstrap=broker.bootstrap, key="card_id",
                         config={"transaction.timeout.ms": 10_000})
            .start(chk, trigger="available-now")
        )

    at_point("sink.after_data", 2, kill)
    q = start()
    failed = None
    try:
        # bounded: each transaction call gives up 5 s past transaction.timeout.ms
        assert q.await_termination(90), "the query hangs in the sink"
    except mb.QueryTerminatedError:
        failed = q.exception
    assert restarted, "the fault point was not reached"
    restarted[0].join(60)
    if failed is not None:  # the transaction could not be completed: a clear error
        assert isinstance(failed, SinkError), failed
        assert "of batch 2" in str(failed)
        assert "nothing of it is visible to read_committed consumers" in str(failed)
        assert start().await_termination(120)
    print(f"broker killed in the commit: {type(failed).__name__ if failed else 'rode it out'}"
          f" ({failed}); restart took {broker.restarts[-1]:.1f}s")
    got = [json.loads(m.value()) for m in consume_all(broker.bootstrap, target)]
    assert sorted(r["event_id"] for r in got) == list(range(n))
    # and nothing of an aborted attempt leaks to read_uncommitted either, beyond batch 2
    raw = consume_all(broker.bootstrap, target, read_committed=False)
    assert len(raw) - n <= 600


def test_broker_frozen_longer_than_the_timeouts_fails_clearly_then_recovers(
    broker: OwnBroker, at_point: Callable[..., None], tmp_path: Path
) -> None:
    """SIGSTOP of the broker for longer than ``broker_timeout`` in the middle of a read:
    the batch fails with a SourceError that says where it stood and what to check,
    ``microbatch status`` shows a ``failed`` alarm; SIGCONT, restart: each record once."""
    topic = broker.new_topic(3)
    n = 3_000
    produce_small_batches(broker.bootstrap, topic, events(n))
    out, chk = tmp_path / "out", tmp_path / "chk"
    frozen: list[threading.Thread] = []

    def freeze() -> None:
        os.kill(broker.pid, signal.SIGSTOP)
        frozen.append(later(5.0, lambda: os.kill(broker.pid, signal.SIGCONT)))

    at_point("after_write_ahead", 1, freeze)
    q = source_query(broker, topic, out, chk, broker_timeout="3s")
    t0 = time.monotonic()
    try:
        ended = q.await_termination(60)
    except mb.QueryTerminatedError:
        pass
    else:  # NOTE: seen once on a fresh clone (2026-12-03); say what the batches read
        batches = [(p["batch_id"], p["input_rows"], [(s["start_offset"], s["end_offset"])
                                                     for s in p["sources"]])
                   for p in q.recent_progress]
        q.stop()
        pytest.fail(f"the query did not fail (ended={ended}, frozen={len(frozen)}); "
                    f"batches (id, rows, ranges): {batches}")
    failed_after = time.monotonic() - t0
    error = q.exception
    assert isinstance(error, SourceError), error
    message = str(error)
    assert "no records for 3s while reading" in message
    assert "is the broker up?" in message
    assert "re-read from its recorded range on restart" in message
    assert failed_after < 15  # bounded: broker_timeout (3 s), not forever
    doc = status(chk)
    assert doc["state"] == "failed"
    alarm = [a for a in doc["alarms"] if a["code"] == "failed"]
    assert alarm
    assert "batch 1" in alarm[0]["message"]
    assert "is the broker up?" in alarm[0]["message"]
    frozen[0].join(30)
    q = source_query(broker, topic, out, chk)
    try:
        q.process_all_available(timeout=120)
        assert q.exception is None
    finally:
        q.stop()
    assert_each_once(out, n)
    assert status(chk)["alarms"] == []


def test_broker_frozen_past_the_transaction_timeout_during_sink_commit(
    broker: OwnBroker, at_point: Callable[..., None], tmp_path: Path
) -> None:
    """SIGSTOP between a transaction's records and its commit, for longer than
    ``transaction.timeout.ms``: on SIGCONT the coordinator aborts the expired
    transaction, so the commit cannot succeed; the batch fails with a clear
    SinkError and an alarm, nothing of it is visible, and a restart writes each
    record once."""
    source, target = broker.new_topic(3), broker.new_topic(3)
    n = 3_000
    produce_json(broker.bootstrap, source, events(n), partitions=[i % 3 for i in range(n)])
    chk = tmp_path / "chk"
    frozen: list[threading.Thread] = []

    def freeze() -> None:
        os.kill(broker.pid, signal.SIGSTOP)
        frozen.append(later(7.0, lambda: os.kill(broker.pid, signal.SIGCONT)))

    def start() -> mb.StreamingQuery:
        return (
            mb.read_kafka(source, bootstrap=broker.bootstrap, schema=SCHEMA,
                          max_records_per_batch=600, broker_timeout="60s")
            .select("event_id", "card_id", "amount")
            .write_kafka(target, bootstrap=broker.bootstrap, key="card_id",
                         config={"transaction.timeout.ms": 3000})
            .start(chk, trigger="available-now")
        )

    at_point("sink.after_data", 1, freeze)
    q = start()
    t0 = time.monotonic()
    with pytest.raises(mb.QueryTerminatedError):
        q.await_termination(120)
    took = time.monotonic() - t0
    error = q.exception
    assert isinstance(error, SinkError), error
    assert "transaction of batch 1 failed" in str(error)
    assert "retried on restart" in str(error)
    assert took < 60
    doc = status(chk)
    assert doc["state"] == "failed"
    assert [a for a in doc["alarms"] if a["code"] == "failed"]
    frozen[0].join(30)
    assert start().await_termination(120)
    got = [json.loads(m.value()) for m in consume_all(broker.bootstrap, target)]
    assert sorted(r["event_id"] for r in got) == list(range(n))


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: ``kafka-storage format -t -xyz...`` took the id for an option and
    the broker did not start (one fresh directory in 64)."""
    draws = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=bytes(16))])
    monkeypatch.setattr(kafka_broker.uuid, "uuid4", lambda: next(draws))
    assert kafka_broker.cluster_id() == "AAAAAAAAAAAAAAAAAAAAAA"


def test_a_transaction_call_that_never_returns_fails_the_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression: librdkafka's send_offsets_to_transaction blocked for minutes past
    its timeout after the broker was SIGKILLed and restarted mid-commit; the sink
    now gives up ``_GRACE_S`` past the call's timeout with a clear error."""
    import sinks.kafka as kafka_sink

    monkeypatch.setattr(kafka_sink, "_GRACE_S", 0.2)
    sink = kafka_sink.KafkaSink("out", bootstrap="127.0.0.1:9")
    sink._call_timeout_s = 0.1
    release = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(kafka_sink.TransactionStuckError) as info:
        sink._bounded("send_offsets_to_transaction", 7, release.wait)
    release.set()
    assert time.monotonic() - t0 < 5
    message = str(info.value)
    assert "send_offsets_to_transaction of batch 7 did not return within 0s" in message
    assert "restart the query" in message
    with pytest.raises(ValueError, match="boom"):  # the call's own error is passed on
        sink._bounded("commit_transaction", 7, lambda: int("boom"))
