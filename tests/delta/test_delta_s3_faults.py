"""The Delta sink on S3 when the store fails: 500, 503, SlowDown, a connection
cut in the middle of the commit (real processes: moto, and a fault-injecting
proxy in front of it, ``tests/s3_fault_proxy.py``).

What retries: delta-rs's object store client (``object_store``) retries 5xx
answers, SlowDown and cut connections itself, with exponential backoff, up to
``max_retries`` times and for at most ``retry_timeout`` (storage options;
defaults 10 and 3 minutes). The sink adds no retry of its own: when the store
stays down, the batch fails with a SinkError, ``microbatch status`` shows the
``failed`` alarm, and the next start commits the batch once (the table's app
transaction says whether an interrupted commit landed).

moto keeps its objects in memory: the proxy is what gets killed, never moto.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from delta_helpers import operations
from s3_server import S3Server

import microbatch as mb
from sinks.exceptions import SinkError

pytestmark = [pytest.mark.delta, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PROXY = ROOT / "tests" / "s3_fault_proxy.py"
ROWS, CAP = 4_000, 1_000
PARAMS = {"total_rows": ROWS, "rows_per_second": None, "seed": 3, "cards": 20,
          "max_records_per_batch": CAP, "start": "2026-01-01T00:00:00+00:00"}
COMMIT = r"PUT .*/_delta_log/0*[2-9]\.json"
"""The PUT of a data commit's log entry (version 0 creates the table, 1 is batch 0)."""
RETRIES = {"max_retries": "3", "retry_timeout": "20s", "timeout": "10s",
           "backoff_config.init_backoff": "100ms", "backoff_config.max_backoff": "1s"}
"""object_store's retry bounds and request timeout for these tests (shorter than the
defaults: 10 retries, 3 minutes, 30 s)."""


class Proxy:
    """``tests/s3_fault_proxy.py`` as a process, restartable on the same port."""

    def __init__(self, upstream: str, directory: Path) -> None:
        self.upstream, self.directory = upstream, directory
        self.control, self.log = directory / "faults.json", directory / "requests.jsonl"
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(PROXY), "--upstream", self.upstream, "--port", str(self.port),
             "--control", str(self.control), "--log", str(self.log)],
            stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("listening on "), line
        self.port = int(line.rsplit(":", 1)[1])

    def kill(self) -> None:
        if self.proc is not None:
            assert self.proc.stdout is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self.proc.stdout.close()
            self.proc = None

    def inject(self, match: str, answer: str, count: int = -1) -> None:
        self.control.write_text(json.dumps({"match": match, "answer": answer, "count": count}))

    def clear(self) -> None:
        self.control.unlink(missing_ok=True)

    def requests(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def proxy(s3_server: S3Server, tmp_path: Path) -> Iterator[Proxy]:
    p = Proxy(s3_server.url, tmp_path)
    p.start()
    try:
        yield p
    finally:
        p.kill()


def options(s3_server: S3Server, proxy: Proxy) -> dict[str, str]:
    return {**s3_server.options(), "AWS_ENDPOINT_URL": proxy.url, **RETRIES}


def start(uri: str, opts: dict[str, str], chk: Path) -> mb.StreamingQuery:
    return (mb.generate(**PARAMS).select("event_id", "card_id", "amount")
            .write_delta(uri, storage_options=opts).start(chk, trigger="available-now"))


def assert_each_once(uri: str, s3_server: S3Server) -> None:
    direct = s3_server.options()  # read back around the proxy
    got = pl.read_delta(uri, storage_options=direct)
    assert sorted(got["event_id"].to_list()) == list(range(ROWS))
    assert operations(uri, direct).count("WRITE") == ROWS // CAP


def status(chk: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "microbatch.cli", "status", str(chk), "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


@pytest.mark.parametrize("answer", ["500", "503", "slowdown"])
def test_transient_errors_on_the_commit_are_retried_with_backoff(
    s3_server: S3Server, proxy: Proxy, tmp_path: Path, answer: str
) -> None:
    uri = f"s3://{s3_server.bucket()}/t"
    proxy.inject(COMMIT, answer, count=2)  # two failures, then the store answers again
    assert start(uri, options(s3_server, proxy), tmp_path / "chk").await_termination(120)
    injected = [r for r in proxy.requests() if r["answer"] == answer]
    assert len(injected) == 2
    assert_each_once(uri, s3_server)


def test_a_store_that_stays_down_fails_the_batch_clearly_then_a_restart_commits_once(
    s3_server: S3Server, proxy: Proxy, tmp_path: Path
) -> None:
    uri, chk = f"s3://{s3_server.bucket()}/t", tmp_path / "chk"
    opts = options(s3_server, proxy)
    proxy.inject(COMMIT, "slowdown")  # every commit PUT, for good
    q = start(uri, opts, chk)
    t0 = time.monotonic()
    with pytest.raises(mb.QueryTerminatedError):
        q.await_termination(120)
    took = time.monotonic() - t0
    error = q.exception
    assert isinstance(error, SinkError), error
    message = str(error)
    assert re.search(r"cannot write batch 1 to Delta table s3://", message), message
    assert "retried on the next start" in message
    assert "only if the table does not hold it yet" in message
    injected = sum(r["answer"] == "slowdown" for r in proxy.requests())
    assert injected == 1 + int(RETRIES["max_retries"])  # the first try and its retries
    assert took < 60
    doc = status(chk)
    assert doc["state"] == "failed"
    assert [a for a in doc["alarms"] if a["code"] == "failed"]
    proxy.clear()
    assert start(uri, opts, chk).await_termination(120)
    assert_each_once(uri, s3_server)
    assert status(chk)["alarms"] == []


@pytest.mark.parametrize("when", ["hang_before", "hang_after"])
def test_proxy_killed_mid_commit_then_restarted(
    s3_server: S3Server, proxy: Proxy, tmp_path: Path, when: str
) -> None:
    """The commit PUT of batch 1 is held (``hang_before``: it never reached the
    store; ``hang_after``: the store has it, the answer is lost), then the proxy is
    SIGKILLed and started again on the same port. The client's retry or the next
    start decides, through the table's app transaction: batch 1 lands once."""
    uri, chk = f"s3://{s3_server.bucket()}/t", tmp_path / "chk"
    opts = options(s3_server, proxy)
    proxy.inject(COMMIT, when, count=1)
    q = start(uri, opts, chk)
    deadline = time.monotonic() + 60
    while not any(r["answer"] == when for r in proxy.requests()):
        assert time.monotonic() < deadline, "the commit PUT never came"
        assert q.exception is None, q.exception
        time.sleep(0.02)
    proxy.kill()
    proxy.clear()  # the restarted proxy answers the retry (it would hold it again)
    proxy.start()
    failed = None
    try:
        assert q.await_termination(120)
    except mb.QueryTerminatedError:
        failed = q.exception
    if failed is not None:
        assert isinstance(failed, SinkError), failed
        assert "cannot write batch 1" in str(failed)
        with contextlib.suppress(Exception):
            assert status(chk)["state"] == "failed"
        assert start(uri, opts, chk).await_termination(120)
    commits = [r["answer"] for r in proxy.requests()
               if re.search(COMMIT, f"{r['method']} {r['path']}")]
    print(f"{when}: {'failed, restarted' if failed else 'rode it out'}; commit PUTs: {commits}")
    assert_each_once(uri, s3_server)


def test_endpoint_killed_after_the_commit_landed_and_down_for_good_then_back(
    s3_server: S3Server, proxy: Proxy, tmp_path: Path
) -> None:
    """The store has batch 1's commit, the answer is lost and the endpoint stays
    down: the batch fails clearly (it cannot say whether the commit landed); once
    the endpoint is back, the restart finds batch 1 in the table's app transaction
    and does not commit it again."""
    uri, chk = f"s3://{s3_server.bucket()}/t", tmp_path / "chk"
    opts = options(s3_server, proxy)
    proxy.inject(COMMIT, "hang_after", count=1)
    q = start(uri, opts, chk)
    deadline = time.monotonic() + 60
    while not any(r["answer"] == "hang_after" for r in proxy.requests()):
        assert time.monotonic() < deadline, "the commit PUT never came"
        time.sleep(0.02)
    proxy.kill()
    with pytest.raises(mb.QueryTerminatedError):
        q.await_termination(120)
    error = q.exception
    assert isinstance(error, SinkError), error
    assert "cannot write batch 1" in str(error)
    assert "only if the table does not hold it yet" in str(error)
    doc = status(chk)
    assert doc["state"] == "failed"
    assert [a for a in doc["alarms"] if a["code"] == "failed"]
    proxy.clear()
    proxy.start()
    assert start(uri, opts, chk).await_termination(120)
    assert_each_once(uri, s3_server)  # batch 1 once: one WRITE per batch
