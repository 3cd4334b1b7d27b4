"""Fixtures for the Iceberg suite: a SQLite catalog per test and a local S3 server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from s3_server import S3Server, running_s3_server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """``moto_server`` on 127.0.0.1 with a free port, for the whole session."""
    with running_s3_server() as server:
        yield server


@pytest.fixture
def catalog_uri(tmp_path: Path) -> str:
    """A SQLite catalog (``sqlite:///.../iceberg.db``) with a ``db`` namespace."""
    from sinks.iceberg_catalog import resolve_catalog

    uri = f"sqlite:///{tmp_path}/lake/iceberg.db"
    resolve_catalog(uri).create_namespace("db")
    return uri
