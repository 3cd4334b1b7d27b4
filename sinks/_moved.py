"""Old module names inside ``sinks``, kept working for one release.

``sinks`` may not import ``microbatch``, so this is the package's own small
twin of ``microbatch._deprecation.moved_names``: it calls
:func:`warnings.warn` with ``DeprecationWarning`` directly, in the same message
format (old name, new name, the removal release, the deprecating version).
"""

from __future__ import annotations

import warnings
from types import ModuleType
from typing import Any


def forward(old_module: str, new: ModuleType, name: str) -> Any:
    """Public attribute ``name`` of module ``new``, read through ``old_module``:
    warns (pointing at the reader's line) and returns it; ``AttributeError`` for
    private or unknown names."""
    if name.startswith("_") or not hasattr(new, name):
        raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
    warnings.warn(
        f"{old_module}.{name} moved to {new.__name__}.{name}; the old name will be removed in "
        "microbatch 0.3 (deprecated in microbatch 0.2.0)",
        DeprecationWarning,
        stacklevel=3,
    )
    return getattr(new, name)
