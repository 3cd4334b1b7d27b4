"""Shared fixtures: small factories with sensible defaults, and the split of the
suite over pytest-xdist workers.

``make test`` runs the suite on two xdist workers: a test runs on whichever
worker is free, except the tests of a group in :data:`GROUPS`, which run one
after another on one worker because they share something expensive or
exclusive (a Ray cluster, a module's own broker). Session fixtures (the Kafka
broker, the S3 server) are per worker: each worker has its own
``tmp_path_factory`` base directory and picks free ports.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_names = itertools.count()

GROUPS = {
    # one local Ray cluster (2-3 s to start, 2 CPUs' worth of workers) serves every
    # scale-out test; test_ray_clusters also checks that no raylet outlives a job,
    # which only holds when no other Ray test runs beside it
    "tests/distributed/": "ray",
    # a module fixture: the broker these tests kill and freeze
    "tests/kafka/test_broker_faults.py": "kafka-faults",
    # a module fixture: the reference output of every determinism query
    "tests/engine/test_determinism.py": "determinism",
    # a module fixture: the live finance job whose day is restated
    "tests/delta/test_restate_caps.py": "restate-caps",
    # a module fixture: the rebuild, promote and handover workflow
    "tests/delta/test_promote.py": "promote",
    # a module fixture: the live run and the replay every test compares
    "tests/cli/test_replay.py": "replay",
    # the session's Iceberg REST catalog server: started on one worker, not on both
    "tests/iceberg/test_iceberg_rest_catalog.py": "iceberg-rest",
}
"""Node id prefix (from the repository root) -> the group whose tests share a worker."""


def group_of(nodeid: str) -> str | None:
    """The :data:`GROUPS` entry of a test, or ``None`` when it may run anywhere."""
    for prefix, group in GROUPS.items():
        if nodeid.startswith(prefix):
            return group
    return None


LONG_FIRST = ("tests/test_readme.py", "tests/jobs/")
"""Node id prefixes of single tests that each run a minute or near it (the README
walkthrough, the jobs under kills). Collected last by name, they started when
the other worker had nothing left, and it idled until they finished; they are
moved to the front of the collection (whole files, their order kept), so the
scheduler deals them out among the first single tests."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the :data:`LONG_FIRST` tests first (a stable reorder: files and the
    tests inside them keep their relative order)."""
    items.sort(key=lambda item: not item.nodeid.startswith(LONG_FIRST))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Load scheduling where each test is its own unit of work, except that the
    tests of a group are one unit (largest first, as xdist's loadscope).

    NOTE: not ``--dist loadgroup`` with ``xdist_group`` marks: pytest-xdist 3.8
    groups by rewriting ``item._nodeid``, which pytest 9 no longer reads, so
    the marks are silently ignored there.
    """
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid) or nodeid

    return GroupScheduling(config, log)


IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
KAFKA_TESTS = Path(__file__).resolve().parent / "kafka"


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"Kafka tests cannot run in CI: {reason}", pytrace=False)
    pytest.skip(f"!!! KAFKA TESTS SKIPPED: {reason} !!!")


@pytest.fixture(autouse=True)
def _logger_levels_restored() -> Iterator[None]:
    """Each test starts with the ``microbatch`` loggers as the last one found them:
    a test that runs the CLI in this process (``CliRunner``) gets its logging set
    up, which quiets ``microbatch.api.query`` for the rest of the process and
    hid a later test's warning depending on which tests shared its worker."""
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
               if name.startswith("microbatch")]
    before = [(lg, lg.level, lg.propagate, lg.disabled) for lg in loggers]
    yield
    for lg, level, propagate, disabled in before:
        lg.setLevel(level)
        lg.propagate = propagate
        lg.disabled = disabled
    known = {id(lg) for lg in loggers}
    for name in list(logging.root.manager.loggerDict):
        lg = logging.getLogger(name)
        if name.startswith("microbatch") and id(lg) not in known:
            lg.setLevel(logging.NOTSET)  # NOTE: made during the test: back to the default


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A running Kafka broker for the whole session of this (xdist) worker, for
    ``tests/kafka`` and the scale-out tests alike (see ``tests/kafka/conftest.py``):
    a ``kafka_helpers.Broker``."""
    if str(KAFKA_TESTS) not in sys.path:
        sys.path.insert(0, str(KAFKA_TESTS))
    from kafka_helpers import Broker

    from scripts.kafka_broker import BrokerError, LocalBroker

    external = os.environ.get("MICROBATCH_KAFKA_BOOTSTRAP")
    if external:
        from confluent_kafka.admin import AdminClient

        try:
            AdminClient({"bootstrap.servers": external}).list_topics(timeout=10)
        except Exception as exc:
            pytest.fail(f"MICROBATCH_KAFKA_BOOTSTRAP={external} does not answer: {exc}")
        yield Broker(external, None, 0.0)
        return
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        _unavailable("no Java 17+ on PATH (needed to run the Kafka broker); install a JDK, "
                     "or set MICROBATCH_KAFKA_BOOTSTRAP to a running broker")
    local = LocalBroker(tmp_path_factory.mktemp("kafka-broker"))
    try:
        bootstrap = local.start()
    except BrokerError as exc:
        pytest.fail(f"the Kafka broker did not start: {exc}", pytrace=False)
    try:
        yield Broker(bootstrap, local, local.start_seconds)
    finally:
        local.stop()


@pytest.fixture
def table_name() -> str:
    """A fresh memory-sink table name per test."""
    return f"t{next(_names)}"


@pytest.fixture
def chk(tmp_path: Path) -> Path:
    """A checkpoint directory path (not yet created)."""
    return tmp_path / "chk"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Any]:
    """``moto_server`` on 127.0.0.1 with a free port, once per xdist worker: the
    S3-compatible store of the Delta and Iceberg object-storage tests."""
    from s3_server import running_s3_server

    with running_s3_server() as server:
        yield server
