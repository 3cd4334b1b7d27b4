"""Deprecated alias of :mod:`statestore.durable`, the one durable-write layer.

Up to 0.2 ``sinks`` kept a copy of the layer here; the copy had its own
recorder and fsync switch, so the engine and the crash explorer had to drive
both. Sinks now import :mod:`statestore.durable` (the one module of
``statestore`` they may import). ``from sinks.durable import write_atomic``
still works and emits a ``DeprecationWarning``; the name is removed in 0.3.

``sinks`` never imports ``microbatch``, so this shim calls :func:`warnings.warn`
itself, with the message format of ``microbatch/_deprecation.py``.
"""

from __future__ import annotations

import warnings
from typing import Any

import statestore.durable as _durable

_NEW = "statestore.durable"


def __getattr__(name: str) -> Any:
    """Any public name of :mod:`statestore.durable`, with a ``DeprecationWarning``."""
    if name.startswith("_") or not hasattr(_durable, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"sinks.durable.{name} moved to {_NEW}.{name}; the old name will be removed in "
        "microbatch 0.3 (deprecated in microbatch 0.2.0)",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(_durable, name)
