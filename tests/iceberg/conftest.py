"""Fixtures of the Iceberg tests (``tests/iceberg``): a SQLite catalog per test and a
local REST catalog server; the S3 server is the suite's (``tests/conftest.py``)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.iceberg_rest import RestCatalog, RestCatalogError, running_catalog


@pytest.fixture
def catalog_uri(tmp_path: Path) -> str:
    """A SQLite catalog (``sqlite:///.../iceberg.db``) with a ``db`` namespace."""
    from sinks.iceberg_catalog import resolve_catalog

    uri = f"sqlite:///{tmp_path}/lake/iceberg.db"
    resolve_catalog(uri).create_namespace("db")
    return uri


# ------------------------------------------------------------- REST catalog server
# One real Iceberg REST catalog (Apache Iceberg's own REST test server on a SQLite
# JDBC catalog, scripts/iceberg_rest.py) per xdist worker that asks for it, on a
# free loopback port, stopped at the end of the session. Its jars are fetched from
# Maven Central into ~/.cache/microbatch on first use (as the Kafka broker's).


@pytest.fixture(scope="session")
def iceberg_rest_catalog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestCatalog]:
    """A running REST catalog: ``.uri`` (``"http://127.0.0.1:PORT"``, what
    ``resolve_catalog`` takes), ``.warehouse`` (the local directory its tables are
    written under), ``.start_seconds``. Tests share it: use a fresh namespace each.

    Without Java the tests that use it are skipped locally with a loud reason
    (as the Kafka tests are); with ``CI=true`` they fail instead."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        reason = "no Java 17+ on PATH (needed to run the Iceberg REST catalog)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"Iceberg REST tests cannot run in CI: {reason}", pytrace=False)
        pytest.skip(f"!!! ICEBERG REST TESTS SKIPPED: {reason} !!!")
    try:
        with running_catalog(tmp_path_factory.mktemp("iceberg-rest")) as rest:
            yield rest
    except RestCatalogError as exc:
        pytest.fail(f"the Iceberg REST catalog did not start: {exc}", pytrace=False)


# ------------------------------------------------------------- end REST catalog server
