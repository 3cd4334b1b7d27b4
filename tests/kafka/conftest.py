"""A real Kafka broker for the tests under ``tests/kafka`` (marker ``kafka``).

The session fixture ``kafka_broker`` (in ``tests/conftest.py``, so that the
scale-out tests share a worker's broker too) either reuses a broker named by
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
import uuid
from collections.abc import Callable

import pytest
from kafka_helpers import Broker


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
