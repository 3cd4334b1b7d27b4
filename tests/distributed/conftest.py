"""One local Ray cluster for the scale-out tests.

In-process tests join it through ``ray.init`` (the engine then reuses the
connection and never shuts it down); subprocess tests get its address and
token in their environment (``ray_env``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ENGINE_TESTS = Path(__file__).resolve().parents[1] / "engine"
if str(ENGINE_TESTS) not in sys.path:  # determinism_queries: the shared query matrix
    sys.path.insert(0, str(ENGINE_TESTS))


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """The address of a local Ray cluster this process is connected to."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False, namespace="microbatch-tests",
                 _node_ip_address="127.0.0.1")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()



@pytest.fixture
def kafka_bootstrap(kafka_broker: Any) -> str:
    """The ``host:port`` of this worker's session broker (``tests/conftest.py``:
    the one the Kafka tests of this worker use too)."""
    return str(kafka_broker.bootstrap)
