"""A local S3-compatible server (moto) in a subprocess, for the object-storage tests.

A module, not a conftest: test modules import :class:`S3Server` from here, and
``from conftest import ...`` would pick whichever conftest was imported first.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

_buckets = itertools.count()


class S3Server:
    """A local S3-compatible server (moto) in a subprocess."""

    def __init__(self, proc: subprocess.Popen[str], url: str) -> None:
        self.proc = proc
        self.url = url

    def options(self) -> dict[str, str]:
        """delta-rs storage options for this server."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": "x",
            "AWS_SECRET_ACCESS_KEY": "x",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
            "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
        }

    def bucket(self) -> str:
        """Create a fresh bucket (plain HTTP PUT; moto does not check signatures)."""
        name = f"mb-test-{next(_buckets)}-{os.getpid()}"
        request = urllib.request.Request(f"{self.url}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
        return name


ATOMIC_MOTO = Path(__file__).with_name("atomic_moto_server.py")
"""moto_server with atomic conditional PUTs (see that module)."""


@contextlib.contextmanager
def running_s3_server() -> Iterator[S3Server]:
    """``moto_server`` on 127.0.0.1 with a free port, stopped on exit."""
    proc = subprocess.Popen(
        [sys.executable, str(ATOMIC_MOTO), "-H", "127.0.0.1", "-p", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    url = None
    deadline = time.monotonic() + 30
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        found = re.search(r"Running on (http://127\.0\.0\.1:\d+)", line)
        if found:
            url = found.group(1)
            break
    if url is None:
        proc.kill()
        pytest.fail("moto_server did not start")
    # keep draining its log so the pipe never fills up
    drain = threading.Thread(target=proc.stdout.read, daemon=True)
    drain.start()
    try:
        yield S3Server(proc, url)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        drain.join(timeout=10)
        proc.stdout.close()
