"""Helpers shared by the Kafka tests: the broker handle, producing and consuming."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts.kafka_broker import LocalBroker

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Broker:
    """The session's broker: its address and, when this session started it, its handle."""

    bootstrap: str
    local: LocalBroker | None
    start_seconds: float

    @property
    def restartable(self) -> bool:
        """True when the tests own the broker and may stop and start it."""
        return self.local is not None

    def stop(self) -> None:
        assert self.local is not None
        self.local.stop()

    def start(self) -> None:
        assert self.local is not None
        assert self.local.start() == self.bootstrap, \
            "the restarted broker moved to another address"


def produce(
    bootstrap: str,
    topic: str,
    values: Sequence[bytes | None],
    *,
    partitions: Sequence[int] | None = None,
    keys: Sequence[bytes | None] | None = None,
) -> None:
    """Write ``values`` (to the given partitions, in order) and wait for every delivery."""
    from confluent_kafka import Producer

    errors: list[Any] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "enable.idempotence": True})
    for i, value in enumerate(values):
        kwargs: dict[str, Any] = {}
        if partitions is not None:
            kwargs["partition"] = partitions[i]
        if keys is not None:
            kwargs["key"] = keys[i]
        while True:
            try:
                producer.produce(topic, value,
                                 on_delivery=lambda err, _m: errors.append(err) if err else None,
                                 **kwargs)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0
    assert not errors, errors


def produce_json(bootstrap: str, topic: str, rows: Sequence[dict[str, Any]],
                 *, partitions: Sequence[int] | None = None) -> None:
    """Write each row as one JSON value."""
    produce(bootstrap, topic, [json.dumps(r).encode() for r in rows], partitions=partitions)


def consume_all(bootstrap: str, topic: str, *, read_committed: bool = True,
                idle_s: float = 2.0) -> list[Any]:
    """Every message of ``topic`` from the beginning (stops when all partitions hit their end)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}",
        "enable.auto.commit": False, "enable.partition.eof": True,
        "isolation.level": "read_committed" if read_committed else "read_uncommitted",
    })
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        parts = sorted(meta.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        done: set[int] = set()
        out: list[Any] = []
        idle_since = time.monotonic()
        while len(done) < len(parts) and time.monotonic() - idle_since < 30:
            for m in consumer.consume(10_000, timeout=0.5):
                idle_since = time.monotonic()
                if m.error() is not None:
                    if m.error().code() == -191:  # _PARTITION_EOF
                        done.add(m.partition())
                    continue
                out.append(m)
        return out
    finally:
        consumer.close()


def run_with_kills(cmd: list[str], chk: Path, log: Path, rng: random.Random, *,
                   kills: int) -> int:
    """Run ``cmd`` to completion, SIGKILLing it ``kills`` times a few batches after a
    random number of new commits (so every kill lands mid-run); the kill count."""
    done = 0
    for _ in range(kills + 5):
        commits = chk / "commits"
        before = len(list(commits.iterdir())) if commits.exists() else 0
        target = before + rng.randint(2, 12)
        with log.open("wb") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT)
            while done < kills and proc.poll() is None:
                if commits.exists() and len(list(commits.iterdir())) >= target:
                    time.sleep(rng.uniform(0, 0.05))
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    done += 1
                    break
                time.sleep(0.005)
            else:
                proc.wait(timeout=120)
                assert proc.returncode == 0, log.read_text()
                return done
    raise AssertionError("the job did not finish")
