"""Deprecated alias of :mod:`sinks.kafka_client`, the one home of the Kafka
client helpers (``check_config``, ``client_log``, ``redact``, ...).

``from sinks.kafka_common import redact`` still works and emits a
``DeprecationWarning``; the name is removed in microbatch 0.3. ``sinks`` never
imports ``microbatch``, so this shim warns through :mod:`sinks._moved` (plain
:func:`warnings.warn`, in the message format of ``microbatch/_deprecation.py``).
"""

from __future__ import annotations

from typing import Any

import sinks.kafka_client as _client
from sinks._moved import forward


def __getattr__(name: str) -> Any:
    """Any public name of :mod:`sinks.kafka_client`, with a ``DeprecationWarning``."""
    return forward(__name__, _client, name)
