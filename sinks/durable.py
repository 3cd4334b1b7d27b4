"""Deprecated alias of :mod:`statestore.durable`, the one durable-write layer.

Up to 0.2 ``sinks`` kept a copy of the layer here; the copy had its own
recorder and fsync switch, so the engine and the crash explorer had to drive
both. Sinks now import :mod:`statestore.durable` (one of the two modules of
``statestore`` they may import, with the error root). ``from sinks.durable import write_atomic``
still works and emits a ``DeprecationWarning``; the name is removed in 0.3.

``sinks`` never imports ``microbatch``, so this shim warns through
:mod:`sinks._moved` (plain :func:`warnings.warn`, in the message format of
``microbatch/_deprecation.py``).
"""

from __future__ import annotations

from typing import Any

import statestore.durable as _durable
from sinks._moved import forward


def __getattr__(name: str) -> Any:
    """Any public name of :mod:`statestore.durable`, with a ``DeprecationWarning``."""
    return forward(__name__, _durable, name)
