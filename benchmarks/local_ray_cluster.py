"""A multi-node Ray cluster on this machine, for the scale-out benchmark.

``ray start --head`` and ``ray start --address`` once per extra node, each
raylet with its own ``--num-cpus`` (a node is a raylet: its own object store
and scheduler, so objects between workers on different nodes travel over
loopback TCP as they would over a network). Stopped by killing exactly the
processes of its temp dir (``ray stop`` would stop every Ray on the machine).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _processes_of(marker: str) -> set[int]:
    """Processes whose command line names ``marker``, and their children."""
    cmd: dict[int, str] = {}
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
            stat = (entry / "stat").read_text()
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found = {pid for pid, line in cmd.items() if marker in line}
    grew = True
    while grew:
        more = {pid for pid, ppid in parent.items() if ppid in found} - found
        found |= more
        grew = bool(more)
    return found


@contextlib.contextmanager
def local_cluster(nodes: int, cpus_per_node: int) -> Iterator[str]:
    """The address of a ``nodes``-node Ray cluster on 127.0.0.1 (stopped on exit),
    with token authentication (this process's environment gets the token)."""
    temp = tempfile.mkdtemp(prefix="mbray", dir="/tmp")  # NOTE: short: Ray's socket paths
    port = _free_port()
    token = Path(temp) / "token"  # NOTE: token auth on, as Ray's default; nodes share it
    token.write_text(secrets.token_hex(32))
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **auth}
    env.pop("RAY_ADDRESS", None)
    os.environ.update(auth)  # NOTE: this process joins the cluster as its driver
    common = [f"--num-cpus={cpus_per_node}", "--disable-usage-stats"]
    try:
        subprocess.run([str(BIN / "ray"), "start", "--head", f"--port={port}",
                        "--node-ip-address=127.0.0.1", "--include-dashboard=false",
                        f"--temp-dir={temp}", *common],
                       env=env, check=True, capture_output=True, timeout=180)
        for _ in range(nodes - 1):
            subprocess.run([str(BIN / "ray"), "start", f"--address=127.0.0.1:{port}",
                            "--node-ip-address=127.0.0.1", *common],
                           env=env, check=True, capture_output=True, timeout=180)
        yield f"127.0.0.1:{port}"
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in _processes_of(temp):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            time.sleep(1.0)
