"""Fixtures for the Iceberg suite: a SQLite catalog per test, the local S3 server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from s3_server import S3Server, running_s3_server


@pytest.fixture
def catalog_uri(tmp_path: Path) -> str:
    """A SQL catalog on a new SQLite file (its warehouse beside it)."""
    return f"sqlite:///{tmp_path}/lake/catalog.db"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """``moto_server`` on 127.0.0.1 with a free port, for the whole session."""
    with running_s3_server() as server:
        yield server
