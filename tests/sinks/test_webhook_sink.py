"""The webhook sink against a real local HTTP server (``microbatch.tools.receiver``).

Every key is acknowledged at least once and never carries two bodies, whatever
the receiver does: fail at random, answer slowly, throttle with ``Retry-After``,
refuse some keys for good (dead letters, not retried), go down; and whatever
happens to the job (SIGKILL at every point of the sink and at random moments).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import microbatch as mb
from microbatch.tools.receiver import Receiver, running
from sinks.base import SinkContext
from sinks.exceptions import SinkConfigError, SinkError
from sinks.webhook import WebhookSink

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("webhook_job.py")


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[Receiver, str]]:
    rec = Receiver(log=tmp_path / "received.jsonl")
    with running(rec) as url:
        yield rec, url + "/hook"


def rows(n: int, start: int = 0) -> pl.DataFrame:
    return pl.DataFrame({"alert_id": [f"a-{i}" for i in range(start, start + n)],
                         "n": list(range(start, start + n)),
                         "total": pl.Series([f"{i}.25" for i in range(n)]).cast(pl.Decimal(18, 2))})


def opened(sink: WebhookSink, chk: Path) -> WebhookSink:
    sink.open(SinkContext(query_id="q", checkpoint_dir=chk))
    return sink


def received(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "received.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_one_post_per_row_with_the_key_and_the_row_as_body(receiver, tmp_path: Path) -> None:
    _, url = receiver
    sink = opened(WebhookSink(url, key="alert_id"), tmp_path / "chk")
    batch = rows(5)
    sink.add_batch(0, batch)
    got = received(tmp_path)
    assert sorted(r["key"] for r in got) == [f"a-{i}" for i in range(5)]
    bodies = {r["key"]: json.loads(r["body"]) for r in got}
    assert bodies["a-3"] == {"alert_id": "a-3", "n": 3, "total": "3.25"}  # exact decimals
    assert sink.metrics()["posts"] == 5
    assert sink.metrics()["dead_letters"] == 0
    # the same batch again: the ledger says it was delivered; nothing is posted
    sink.add_batch(0, batch)
    again = opened(WebhookSink(url, key="alert_id"), tmp_path / "chk")  # a restart
    again.add_batch(0, batch)
    assert len(received(tmp_path)) == 5
    sink.close()
    again.close()


def test_a_replayed_batch_without_ledger_sends_the_same_bodies(receiver, tmp_path: Path) -> None:
    """A crash after the posts but before the ledger: the replay is byte-for-byte the
    same, so the receiver sees duplicates, never conflicts."""
    rec, url = receiver
    for chk in ("a", "b"):  # two checkpoints: two senders of the same batch
        sink = opened(WebhookSink(url, key="alert_id"), tmp_path / chk)
        sink.add_batch(0, rows(20))
        sink.close()
    assert rec.stats()["accepted"] == 20
    assert rec.stats()["duplicates"] == 20
    assert rec.stats()["conflicts"] == 0


def test_a_batch_without_rows_posts_nothing_and_writes_no_ledger(receiver, tmp_path: Path
                                                                 ) -> None:
    rec, url = receiver
    sink = opened(WebhookSink(url, key="alert_id"), tmp_path / "chk")
    sink.add_batch(0, rows(0))  # a no-data batch (a watermark tick)
    sink.add_batch(1, rows(2))
    sink.close()
    ledger = sorted(p.name for p in (tmp_path / "chk" / "sinks").rglob("*") if p.is_file())
    assert ledger == ["1"]
    assert rec.stats()["accepted"] == 2


def test_batch_mode_posts_json_arrays_keyed_by_their_rows(receiver, tmp_path: Path) -> None:
    rec, url = receiver
    sink = opened(WebhookSink(url, key="alert_id", batch_size=4), tmp_path / "chk")
    sink.add_batch(0, rows(10))
    sink.close()
    got = received(tmp_path)
    assert sorted(len(json.loads(r["body"])) for r in got) == [2, 4, 4]
    keys = {r["key"] for r in got}
    sink2 = opened(WebhookSink(url, key="alert_id", batch_size=4), tmp_path / "chk2")
    sink2.add_batch(0, rows(10))
    sink2.close()
    assert {r["key"] for r in received(tmp_path)} == keys  # stable keys for the same rows
    assert rec.stats()["conflicts"] == 0


def test_refused_rows_go_to_dead_letters_and_are_not_retried(tmp_path: Path) -> None:
    rec = Receiver(log=tmp_path / "received.jsonl", reject_suffix="7")
    with running(rec) as url:
        sink = opened(WebhookSink(url, key="alert_id"), tmp_path / "chk")
        sink.add_batch(0, rows(30))
        sink.close()
    dead = mb.parquet_table(tmp_path / "chk" / "dead_letter_webhook")
    assert sorted(dead["idempotency_key"].to_list()) == ["a-17", "a-27", "a-7"]
    assert set(dead["status"].to_list()) == {422}
    assert "rejected" in dead["response"][0]
    assert json.loads(dead["request_body"][0])["alert_id"] == dead["idempotency_key"][0]
    assert rec.stats()["rejected"] == 3  # one attempt each
    assert rec.stats()["accepted"] == 27


def test_failures_and_throttling_are_retried_until_acknowledged(tmp_path: Path) -> None:
    rec = Receiver(log=tmp_path / "received.jsonl", seed=5, fail_rate=0.3,
                   throttle_rate=0.1)
    with running(rec) as url:
        sink = opened(WebhookSink(url, key="alert_id", backoff=(0.01, 0.05)), tmp_path / "chk")
        started = time.monotonic()
        sink.add_batch(0, rows(60))
        took = time.monotonic() - started
        sink.close()
    stats = rec.stats()
    assert stats["accepted"] == 60
    assert stats["conflicts"] == 0
    assert stats["failed"] > 0
    assert stats["throttled"] > 0
    assert sink.metrics()["retries"] == stats["failed"] + stats["throttled"]
    assert took >= 1.0  # Retry-After: 1 was honoured (our own backoff is 50 ms at most)


def test_a_slow_receiver_gets_requests_in_parallel(tmp_path: Path) -> None:
    rec = Receiver(log=None, slow_rate=1.0, slow_s=0.5)
    with running(rec) as url:
        sink = opened(WebhookSink(url, key="alert_id", max_in_flight=10), tmp_path / "chk")
        started = time.monotonic()
        sink.add_batch(0, rows(20))
        took = time.monotonic() - started
        sink.close()
    assert rec.stats()["accepted"] == 20
    assert took < 3.0  # 20 answers of 0.5 s each, 10 at a time: ~1 s, not 10 s
    assert sink.metrics()["p50_ms"] >= 500


def test_a_receiver_that_stays_down_fails_the_batch_with_a_clear_error(tmp_path: Path) -> None:
    sink = opened(WebhookSink("http://127.0.0.1:9/x?token=s3cret", key="alert_id",
                              retry_for=0.5, backoff=(0.05, 0.1)), tmp_path / "chk")
    with pytest.raises(SinkError) as info:
        sink.add_batch(0, rows(3))
    message = str(info.value)
    assert "no acknowledgement for key" in message
    assert "next start" in message
    assert "s3cret" not in message
    assert "s3cret" not in json.dumps(sink.describe())
    ledger = list((tmp_path / "chk" / "sinks").rglob("0"))
    assert ledger == []  # not delivered: not recorded
    sink.close()


class _Headers(BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).seen.append(dict(self.headers))
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_the_bearer_token_comes_from_the_environment_and_is_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Headers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    sink = WebhookSink(url, key="alert_id", token_env="HOOK_TOKEN", headers={"X-Team": "fraud"})
    with pytest.raises(SinkConfigError, match=r"HOOK_TOKEN.*not set"):
        opened(sink, tmp_path / "chk")
    monkeypatch.setenv("HOOK_TOKEN", "tok-123-secret")
    opened(sink, tmp_path / "chk").add_batch(0, rows(2))
    sink.close()
    server.shutdown()
    server.server_close()
    assert {h["Authorization"] for h in _Headers.seen} == {"Bearer tok-123-secret"}
    assert {h["Idempotency-Key"] for h in _Headers.seen} == {"a-0", "a-1"}
    assert "tok-123-secret" not in json.dumps(sink.describe())
    assert "tok-123-secret" not in json.dumps(sink.metrics())


def test_https_certificates_are_verified_by_default(tmp_path: Path) -> None:
    sink = WebhookSink("https://127.0.0.1:9/x", key="alert_id")
    assert sink.verify is True
    with pytest.raises(SinkConfigError, match="http"):
        WebhookSink("ftp://example.com", key="alert_id")


# ------------------------------------------------------------------ kills


def _start_receiver(tmp_path: Path, **flags: object) -> tuple[subprocess.Popen[str], str]:
    args = [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]
    proc = subprocess.Popen(
        [sys.executable, "-m", "microbatch.tools.receiver", "--port", "0",
         "--log", str(tmp_path / "received.jsonl"), *args],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("listening on "), line
    return proc, line.split()[-1] + "/hook"


def _run(url: str, chk: Path, env: dict[str, str], *, kill_after: float | None = None) -> int:
    cmd = [sys.executable, "-m", "microbatch.cli", "run", str(JOB), "--checkpoint", str(chk),
           "--trigger", "available-now", "--param", f"url={url}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    if kill_after is not None:
        try:
            proc.wait(kill_after)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode in (0, -9), err[-3000:]
    return proc.returncode


@pytest.mark.crash
@pytest.mark.slow
def test_every_key_acknowledged_once_and_one_body_per_key_under_kills(tmp_path: Path) -> None:
    receiver, url = _start_receiver(tmp_path, seed=7, fail_rate=0.1, throttle_rate=0.02,
                                    slow_rate=0.02, slow_s=0.3, reject_suffix="7")
    chk = tmp_path / "chk"
    base = {k: v for k, v in os.environ.items() if not k.startswith("MICROBATCH_FAULT")}
    rng = random.Random(3)
    try:
        kills = 0
        for point in ["sink.after_data", "after_sink", "after_state_commit", "after_commit"]:
            env = {**base, "MICROBATCH_FAULT": f"{point}@{kills + 1}"}
            kills += _run(url, chk, env) == -9
        for _ in range(3):  # random moments, most of them in the middle of posting
            kills += _run(url, chk, base, kill_after=rng.uniform(0.8, 2.5)) == -9
        assert _run(url, chk, base) == 0
    finally:
        receiver.terminate()
        receiver.wait(10)
        assert receiver.stdout is not None
        receiver.stdout.close()
    assert kills >= 5
    got = received(tmp_path)
    keys = {f"e-{i}" for i in range(2000)}
    rejected = {k for k in keys if k.endswith("7")}
    bodies: dict[str, set[str]] = {}
    for r in got:
        bodies.setdefault(r["key"], set()).add(r["sha256"])
    assert set(bodies) == keys - rejected  # every key acknowledged
    assert all(len(b) == 1 for b in bodies.values())  # never two bodies for one key
    assert not any(r["status"] == 409 for r in got)
    dead = mb.parquet_table(chk / "dead_letter_webhook")
    assert sorted(dead["idempotency_key"].to_list()) == sorted(rejected)  # each exactly once
