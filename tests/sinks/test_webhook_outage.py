"""A webhook receiver down for a long time in the middle of a run (real processes).

The receiver (``python -m microbatch.tools.receiver``) is SIGKILLed while a
``microbatch run`` job posts to it, and started again on the same port after
an outage. Two outcomes, both checked against every key of the input:

- the outage is shorter than the sink's ``retry_for``: the batch in flight
  keeps retrying (bounded exponential backoff, 50 ms .. 1 s) and the job rides
  it out;
- the outage is longer: the batch fails with a clear error once ``retry_for``
  is spent, ``microbatch status`` shows a ``failed`` alarm, and a restart
  after the receiver is back posts the rest.

Either way every key is acknowledged, with one body per key, and only the keys
of the batch cut short by the outage are posted twice (the ledger keeps
committed batches from being posted again).

The outage is seconds in the suite. ``MICROBATCH_LONG_OUTAGE=SECONDS`` runs the
same tests with an outage of that many seconds (and ``retry_for`` scaled
to it), e.g. ``MICROBATCH_LONG_OUTAGE=150`` for two and a half minutes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.crash]

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("webhook_job.py")
ROWS, CAP = 2000, 200
OUTAGE_S = float(os.environ.get("MICROBATCH_LONG_OUTAGE") or 3.0)
"""How long the receiver stays down."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ReceiverProcess:
    """The receiver as a separate process on a fixed port, to kill and start again."""

    def __init__(self, log: Path) -> None:
        self.log, self.port = log, free_port()
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "microbatch.tools.receiver", "--port", str(self.port),
             "--log", str(self.log)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("listening on "), line

    def kill(self) -> None:
        assert self.proc is not None
        assert self.proc.stdout is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.proc.stdout.close()
        self.proc = None


def job(url: str, chk: Path, retry_for: float) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROBATCH_FAULT")}
    return subprocess.Popen(
        [sys.executable, "-m", "microbatch.cli", "run", str(JOB), "--checkpoint", str(chk),
         "--trigger", "available-now", "--param", f"url={url}", "--param", f"rows={ROWS}",
         "--param", f"cap={CAP}", "--param", f"retry_for={round(retry_for)}s"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def delivered_batches(chk: Path) -> int:
    """Batches the sink's ledger records as delivered."""
    return sum(1 for d in (chk / "sinks").glob("webhook-*") for _ in d.iterdir()) \
        if (chk / "sinks").exists() else 0


def kill_after_batches(receiver: ReceiverProcess, chk: Path, proc: subprocess.Popen[str],
                       batches: int) -> float:
    """SIGKILL the receiver once ``batches`` batches were delivered; when it died."""
    deadline = time.monotonic() + 120
    while delivered_batches(chk) < batches:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the job delivered too few batches"
        time.sleep(0.01)
    receiver.kill()
    return time.monotonic()


def status(chk: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "microbatch.cli", "status", str(chk), "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def check_every_key_once(log: Path) -> int:
    """Every key acknowledged with one body; the number of keys posted twice
    (re-posted after the receiver, which forgets its keys when killed, came back)."""
    got = [json.loads(line) for line in log.read_text().splitlines()]
    bodies: dict[str, set[str]] = {}
    for r in got:
        assert r["status"] == 200, r
        bodies.setdefault(r["key"], set()).add(r["sha256"])
    assert set(bodies) == {f"e-{i}" for i in range(ROWS)}
    assert all(len(b) == 1 for b in bodies.values())
    return len(got) - ROWS


def test_an_outage_shorter_than_retry_for_is_ridden_out(tmp_path: Path) -> None:
    receiver, chk = ReceiverProcess(tmp_path / "received.jsonl"), tmp_path / "chk"
    receiver.start()
    retry_for = OUTAGE_S * 3 + 10
    proc = job(receiver.url, chk, retry_for)
    try:
        down_at = kill_after_batches(receiver, chk, proc, 3)
        time.sleep(OUTAGE_S)
        assert proc.poll() is None, "the job gave up during an outage shorter than retry_for"
        receiver.start()
        _, err = proc.communicate(timeout=retry_for + 120)
        assert proc.returncode == 0, err[-3000:]
        back_after = time.monotonic() - down_at
    finally:
        if proc.poll() is None:
            proc.kill()
        if receiver.proc is not None:
            receiver.kill()
    assert back_after >= OUTAGE_S
    assert "no acknowledgement" not in err
    reposted = check_every_key_once(tmp_path / "received.jsonl")
    assert reposted <= CAP  # at most the batch in flight when the receiver died
    assert status(chk)["alarms"] == []


def test_an_outage_longer_than_retry_for_fails_clearly_then_a_restart_delivers(
    tmp_path: Path,
) -> None:
    receiver, chk = ReceiverProcess(tmp_path / "received.jsonl"), tmp_path / "chk"
    receiver.start()
    retry_for = max(2.0, OUTAGE_S / 3)
    proc = job(receiver.url, chk, retry_for)
    try:
        down_at = kill_after_batches(receiver, chk, proc, 3)
        _, err = proc.communicate(timeout=retry_for + 60)
        failed_after = time.monotonic() - down_at
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "no acknowledgement for key" in err
    assert "posted again on the next start" in err
    assert failed_after <= retry_for + 15  # bounded by retry_for, not by the outage
    doc = status(chk)
    assert doc["state"] == "failed"
    alarm = [a for a in doc["alarms"] if a["code"] == "failed"]
    assert alarm
    assert "no acknowledgement for key" in alarm[0]["message"]
    time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
    receiver.start()
    try:
        again = job(receiver.url, chk, retry_for)
        _, err = again.communicate(timeout=120)
        assert again.returncode == 0, err[-3000:]
    finally:
        receiver.kill()
    reposted = check_every_key_once(tmp_path / "received.jsonl")
    assert reposted <= CAP
    assert status(chk)["alarms"] == []
