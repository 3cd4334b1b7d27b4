"""The shell wrapper ``scripts/kafka`` over the broker helper the tests use."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kafka_helpers import ROOT, Broker

pytestmark = pytest.mark.kafka


def test_status_prints_the_address_of_the_running_broker(kafka_broker: Broker) -> None:
    if kafka_broker.local is None:
        pytest.skip("MICROBATCH_KAFKA_BOOTSTRAP names a broker these tests did not start")
    env = {**os.environ, "MICROBATCH_PYTHON": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "kafka"), "status",
                           str(kafka_broker.local.directory)],
                          capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == kafka_broker.bootstrap


def test_status_of_a_directory_without_a_broker_exits_1(tmp_path: Path) -> None:
    env = {**os.environ, "MICROBATCH_PYTHON": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "kafka"), "status", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 1
    assert "not running" in done.stderr
