"""The Kafka sink against a real broker: transactions, replays, kill -9, dedupe headers."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from kafka_helpers import consume_all, run_with_kills

import microbatch as mb
from sinks.base import SinkContext
from sinks.kafka import KafkaSink

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).parent / "job_generated_to_kafka.py"


def frame(lo: int, hi: int) -> pl.DataFrame:
    ids = list(range(lo, hi))
    return pl.DataFrame({"event_id": ids, "card_id": [i % 5 for i in ids]})


def test_each_batch_is_one_transaction_and_a_replay_is_a_noop(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(3)
    sink = KafkaSink(topic, bootstrap=bootstrap, key="card_id")
    sink.open(SinkContext(query_id="q-replay"))
    sink.add_batch(0, frame(0, 100))
    sink.add_batch(1, frame(100, 250))
    sink.add_batch(1, frame(100, 250))  # replay after a crash: no-op
    sink.add_batch(0, frame(0, 100))
    assert sink.last_committed_batch() == 1
    sink.close()
    again = KafkaSink(topic, bootstrap=bootstrap, key="card_id")
    again.open(SinkContext(query_id="q-replay"))  # a restart: fences, then reads the marker
    again.add_batch(1, frame(100, 250))
    again.add_batch(2, frame(250, 260))
    assert again.skipped_batches == 1
    again.close()
    msgs = consume_all(bootstrap, topic)
    ids = sorted(json.loads(m.value())["event_id"] for m in msgs)
    assert ids == list(range(260))
    by_key: dict[bytes, set[int]] = {}
    for m in msgs:
        by_key.setdefault(m.key(), set()).add(m.partition())
    assert all(len(parts) == 1 for parts in by_key.values())  # a key stays on one partition


def test_kill9_at_random_moments_read_committed_sees_each_record_once(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(3)
    rows = 40_000
    chk = tmp_path / "chk"
    cmd = [sys.executable, "-m", "microbatch.cli", "run", str(JOB), "--checkpoint", str(chk),
           "--trigger", "available-now", "--param", f"bootstrap={bootstrap}",
           "--param", f"topic={topic}", "--param", f"rows={rows}",
           "--param", "max_records_per_batch=500"]
    kills = run_with_kills(cmd, chk, tmp_path / "stderr.log", random.Random(11), kills=4)
    assert kills == 4
    committed = consume_all(bootstrap, topic)
    ids = [json.loads(m.value())["event_id"] for m in committed]
    assert len(ids) == rows, f"{len(ids) - rows:+d} records"
    assert sorted(ids) == list(range(rows))
    everything = consume_all(bootstrap, topic, read_committed=False)
    assert len(everything) >= rows  # aborted attempts are there, invisible to read_committed


@pytest.mark.parametrize("point", ["sink.after_data", "sink.after_commit"])
def test_self_kill_inside_the_sink_then_restart(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path, point: str
) -> None:
    topic = new_topic(2)
    chk = tmp_path / "chk"
    cmd = [sys.executable, "-m", "microbatch.cli", "run", str(JOB), "--checkpoint", str(chk),
           "--trigger", "available-now", "--param", f"bootstrap={bootstrap}",
           "--param", f"topic={topic}", "--param", "rows=3000",
           "--param", "max_records_per_batch=500"]
    env = {**os.environ, "MICROBATCH_FAULT": f"{point}@2"}
    first = subprocess.run(cmd, env=env, capture_output=True, timeout=120, cwd=ROOT, check=False)
    assert first.returncode == -signal.SIGKILL, first.stderr.decode()[-2000:]
    env.pop("MICROBATCH_FAULT")
    second = subprocess.run(cmd, env=env, capture_output=True, timeout=120, cwd=ROOT, check=False)
    assert second.returncode == 0, second.stderr.decode()[-2000:]
    ids = sorted(json.loads(m.value())["event_id"] for m in consume_all(bootstrap, topic))
    assert ids == list(range(3000))


def test_at_least_once_records_carry_dedupe_headers(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    sink = KafkaSink(topic, bootstrap=bootstrap, delivery_guarantee="at_least_once",
                     headers={"card": "card_id"})
    sink.open(SinkContext(query_id="q-alo"))
    sink.add_batch(0, frame(0, 50))
    sink.add_batch(0, frame(0, 50))  # a replay duplicates, and the headers say so
    sink.add_batch(1, frame(50, 60))
    sink.close()
    msgs = consume_all(bootstrap, topic)
    assert len(msgs) == 110
    seen = set()
    for m in msgs:
        h = dict(m.headers())
        assert h["mb_query_id"] == b"q-alo"
        assert int(h["card"]) == json.loads(m.value())["card_id"]
        seen.add((h["mb_batch_id"], int(h["mb_row"])))
    assert len(seen) == 60


def test_secrets_never_appear_in_describe_or_progress(tmp_path: Path, table_name: str) -> None:
    secret = "hunter2-very-secret"
    config = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
              "sasl.username": "alice", "sasl.password": secret}
    sink = KafkaSink("out", bootstrap="127.0.0.1:1", config=config)
    assert secret not in json.dumps(sink.describe())
    stream = mb.read_kafka("in", bootstrap="127.0.0.1:1", schema={"x": pl.Int64},
                           config=config, broker_timeout="1s")
    source = stream.plan.sources()[0]
    text = json.dumps(source.describe())
    assert secret not in text
    assert "alice" in text  # the user name is not a secret
    with pytest.raises(mb.PlanError, match=r"bootstrap\.servers"):
        mb.read_kafka("in", bootstrap="x:1", schema={"x": pl.Int64},
                      config={"bootstrap.servers": "y:2"})
