"""Fixtures for the Delta suite: table factories, a local S3 server, crash helpers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from s3_server import S3Server, running_s3_server

# ----------------------------------------------------------------------------- S3


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """``moto_server`` on 127.0.0.1 with a free port, for the whole session."""
    with running_s3_server() as server:
        yield server
