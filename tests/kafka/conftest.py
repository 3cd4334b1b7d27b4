"""A real Kafka broker for the tests under ``tests/kafka`` (marker ``kafka``).

The session fixture :func:`kafka_broker` either reuses a broker named by
``MICROBATCH_KAFKA_BOOTSTRAP`` (fast local iterations: start one with
``scripts/kafka start /tmp/kb`` and export the address), or starts one itself
with the repository's broker helper (:mod:`scripts.kafka_broker`) and stops it
at the end of the session. Under pytest-xdist the session is a worker's: each
worker that runs Kafka tests has its own broker, in its own temporary directory
on its own free ports, so topics and restarts never cross workers.

Without Java the Kafka tests are skipped locally with a loud reason; with
``CI=true`` they fail instead: CI must never pass by skipping them.
"""

from __future__ import annotations

import itertools
import os
import shutil
import uuid
from collections.abc import Callable, Iterator

import pytest
from kafka_helpers import Broker

from scripts.kafka_broker import BrokerError, LocalBroker

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"Kafka tests cannot run in CI: {reason}", pytrace=False)
    pytest.skip(f"!!! KAFKA TESTS SKIPPED: {reason} !!!")


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A running broker for the whole session (see the module docstring)."""
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
def bootstrap(kafka_broker: Broker) -> str:
    """The broker's ``host:port``."""
    return kafka_broker.bootstrap


_topics = itertools.count()


@pytest.fixture
def new_topic(bootstrap: str) -> Callable[..., str]:
    """Factory: ``new_topic(partitions=3)`` creates a fresh topic and returns its name
    once the broker's metadata shows its partitions."""
    from sinks.kafka_client import create_topics

    def make(partitions: int = 3, **config: str) -> str:
        name = f"t{next(_topics)}-{uuid.uuid4().hex[:8]}"
        create_topics(bootstrap, [name], partitions=partitions, replication_factor=1,
                      topic_config=config)
        return name

    return make
