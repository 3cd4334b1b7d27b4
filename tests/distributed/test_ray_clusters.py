"""Scaled-out jobs on the clusters users run: one the engine starts itself (no
address), and a two-node cluster (two raylets on 127.0.0.1 started with
``ray start --head`` and ``ray start --address``, token authentication on)."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_scale_out_crashes import _assert_exactly_the_oracle, _run_args

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def _raylets() -> set[int]:
    return {pid for pid, cmd in _processes().items()
            if "raylet" in cmd and "--raylet_socket" in cmd}


def _processes() -> dict[int, str]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                raw = (entry / "cmdline").read_bytes()
                out[int(entry.name)] = raw.replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
    return out


def _parents() -> dict[int, int]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                out[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return out


def _stop_cluster(marker: str) -> None:
    """SIGTERM then SIGKILL every process of the cluster whose temp dir is
    ``marker``, and their children (``ray stop`` would stop every Ray here)."""
    procs, parents = _processes(), _parents()
    pids = {pid for pid, cmd in procs.items() if marker in cmd}
    grew = True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in pids} - pids
        pids |= more
        grew = bool(more)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        time.sleep(2.0)


@pytest.fixture
def two_node_cluster() -> Iterator[tuple[str, dict[str, str]]]:
    """(address, environment) of a head and a worker raylet on this machine."""
    temp = tempfile.mkdtemp(prefix="mbray", dir="/tmp")  # short: Ray's socket paths
    token = Path(temp) / "token"
    token.write_text(secrets.token_hex(32))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
           "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    common = ["--num-cpus=1", "--disable-usage-stats"]
    try:
        subprocess.run([str(BIN / "ray"), "start", "--head", f"--port={port}",
                        "--include-dashboard=false", f"--temp-dir={temp}", *common],
                       env=env, check=True, capture_output=True, timeout=120)
        subprocess.run([str(BIN / "ray"), "start", f"--address=127.0.0.1:{port}", *common],
                       env=env, check=True, capture_output=True, timeout=120)
        yield f"127.0.0.1:{port}", env
    finally:
        _stop_cluster(temp)


def test_a_job_runs_on_two_nodes(
    two_node_cluster: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    address, env = two_node_cluster
    out, chk = tmp_path / "out", tmp_path / "chk"
    done = subprocess.run(
        [sys.executable, "-m", "microbatch.cli", "-v",
         *_run_args(out, chk, "session", 2, address)],
        env=env, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr
    placed = re.search(r"2 Ray workers on nodes \[([^\]]*)\] own 4 shards", done.stderr)
    assert placed is not None, done.stderr[-3000:]
    assert len(set(placed.group(1).split(", "))) == 2, done.stderr[-3000:]
    _assert_exactly_the_oracle(out, "session", tmp_path)


def test_without_an_address_the_engine_starts_and_stops_a_local_cluster(tmp_path: Path) -> None:
    before = _raylets()
    env = {**os.environ}
    for name in ("RAY_ADDRESS", "MICROBATCH_FAULT", "MICROBATCH_FAULT_ONCE"):
        env.pop(name, None)
    out, chk = tmp_path / "out", tmp_path / "chk"
    done = subprocess.run(
        [sys.executable, "-m", "microbatch.cli", *_run_args(out, chk, "window", 2, None)],
        env=env, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr
    _assert_exactly_the_oracle(out, "window", tmp_path)
    assert _raylets() - before == set(), "the local Ray cluster outlived the job"


def test_on_its_own_local_cluster_a_killed_worker_and_driver_lose_nothing(
    tmp_path: Path,
) -> None:
    """The harness's case: --workers 2 without an address, a Ray worker process
    SIGKILLed mid-batch, then the driver SIGKILLed (its cluster dies with it), then
    a restart that starts a new local cluster."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
    fired = tmp_path / "fired"
    fired.mkdir()
    out, chk = tmp_path / "out", tmp_path / "chk"
    args = [sys.executable, "-m", "microbatch.cli", *_run_args(out, chk, "session", 2, None)]
    killed = subprocess.run(args, env={**env, "MICROBATCH_FAULT": "worker.reduce@3,after_sink@6",
                                       "MICROBATCH_FAULT_ONCE": str(fired)},
                            capture_output=True, text=True, timeout=240)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert sorted(p.name for p in fired.iterdir()) == ["after_sink@6", "worker.reduce@3"]
    env.pop("MICROBATCH_FAULT", None)
    env.pop("MICROBATCH_FAULT_ONCE", None)
    again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stderr
    _assert_exactly_the_oracle(out, "session", tmp_path)
