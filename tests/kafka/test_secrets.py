"""Secrets never leak: a SASL password in a Kafka config, a secret access key in
Delta storage options (from the environment and from ``--param storage.KEY``),
a webhook bearer token (``token_env``) and a secret header are planted in real
jobs (a real broker, a local S3 server, a local webhook receiver); then the
jobs' logs (``-v``), ``microbatch status`` (text and JSON), the HTML report,
every file of the checkpoints and the message of a failing run are searched
for each of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from kafka_helpers import Broker, produce_json
from s3_server import running_s3_server

from microbatch.tools.receiver import Receiver, running

JOB = Path(__file__).resolve().with_name("job_secrets.py")
SECRETS = {
    "sasl": "sasl-PLANTED-4d1f0a",
    "s3": "s3-PLANTED-9c27e1",
    "token": "token-PLANTED-77aa31",
    "header": "header-PLANTED-e5b902",
}
pytestmark = pytest.mark.slow


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "microbatch.cli", *args], env=env,
                          capture_output=True, text=True, timeout=300)


def _leaks(text: str | bytes) -> list[str]:
    raw = text.encode() if isinstance(text, str) else text
    return [name for name, secret in SECRETS.items() if secret.encode() in raw]


def _files_leaking(root: Path) -> list[str]:
    return [f"{path}: {_leaks(path.read_bytes())}" for path in root.rglob("*")
            if path.is_file() and _leaks(path.read_bytes())]


def test_planted_secrets_appear_nowhere(
    kafka_broker: Broker, bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    env = {**os.environ, "MB_TEST_SASL": SECRETS["sasl"], "MB_TEST_WEBHOOK_TOKEN":
           SECRETS["token"], "MB_TEST_WEBHOOK_HEADER": SECRETS["header"],
           "AWS_SECRET_ACCESS_KEY": SECRETS["s3"]}
    topic = new_topic(partitions=2)
    produce_json(bootstrap, topic, [{"event_id": i, "card_id": i % 7, "amount": i * 1.5}
                                    for i in range(400)])
    texts: dict[str, str] = {}
    with running_s3_server() as s3:
        options = {**s3.options(), "AWS_SECRET_ACCESS_KEY": SECRETS["s3"]}
        storage = [f"--param=storage.{k}={v}" for k, v in options.items()]
        uri = f"s3://{s3.bucket()}/tables/tx"
        delta_chk = tmp_path / "chk-delta"
        done = _cli("-v", "run", str(JOB), "-c", str(delta_chk), "--trigger", "available-now",
                    "--param", "kind=delta", "--param", f"bootstrap={bootstrap}",
                    "--param", f"topic={topic}", "--param", f"output={uri}", *storage, env=env)
        assert done.returncode == 0, done.stderr
        texts["delta run"] = done.stdout + done.stderr
        # a failing run: the same job against an S3 endpoint nobody listens on
        wrong = [a.replace(s3.url, "http://127.0.0.1:9") for a in storage]
        failed = _cli("run", str(JOB), "-c", str(tmp_path / "chk-fail"), "--trigger",
                      "available-now", "--param", "kind=delta", "--param",
                      f"bootstrap={bootstrap}", "--param", f"topic={topic}", "--param",
                      f"output={uri}", *wrong, env=env)
        assert failed.returncode != 0
        texts["failed run"] = failed.stdout + failed.stderr

    receiver = Receiver(log=tmp_path / "received.jsonl")
    hook_chk = tmp_path / "chk-hook"
    with running(receiver) as url:
        done = _cli("-v", "run", str(JOB), "-c", str(hook_chk), "--trigger", "available-now",
                    "--param", "kind=webhook", "--param", f"url={url}/alerts", env=env)
    assert done.returncode == 0, done.stderr
    texts["webhook run"] = done.stdout + done.stderr

    for chk in (delta_chk, hook_chk):
        for args in (("status", str(chk)), ("status", str(chk), "--json")):
            shown = _cli(*args, env=env)
            assert shown.returncode == 0, shown.stderr
            texts[" ".join(args)] = shown.stdout + shown.stderr
        page = tmp_path / f"{chk.name}.html"
        report = _cli("report", str(chk), "-o", str(page), env=env)
        assert report.returncode == 0, report.stderr
        texts[f"report {chk.name}"] = page.read_text()

    # the secrets were in play: the jobs ran, the webhook was called, the failure is S3's
    assert "rows in" in texts["delta run"]
    assert (tmp_path / "received.jsonl").read_text().count("\n") > 0
    assert "127.0.0.1:9" in texts["failed run"], texts["failed run"]
    assert _leaks(f"x{SECRETS['s3']}y") == ["s3"]  # the search itself finds a secret
    leaks = {where: _leaks(text) for where, text in texts.items() if _leaks(text)}
    assert leaks == {}
    assert _files_leaking(delta_chk) + _files_leaking(hook_chk) == []
