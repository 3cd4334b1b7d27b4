"""The one deprecation mechanism of microbatch (in the style of Polars'
``_utils/deprecation.py``).

A public name that is renamed or moved keeps working for one release, with a
``DeprecationWarning`` pointing at the caller's line, in one message format
(``OLD moved to NEW`` or ``OLD is renamed NEW``, then the removal and the
version that deprecated it)::

    sinks.durable.write_atomic moved to statestore.durable.write_atomic; the old
    name will be removed in microbatch 0.3 (deprecated in microbatch 0.2.0)

Three tools, smallest first:

- :func:`issue_deprecation_warning`: warn with any message, tagged with the
  version that deprecated it (for a deprecated argument or value);
- :func:`moved_names`: a module-level ``__getattr__`` that answers names that
  moved to another module::

      __getattr__ = moved_names(__name__, {"OldName": "microbatch.plan.nodes:NewName"},
                                version="0.2.0")

- :func:`deprecated_alias`: the old name of a renamed function or method::

      class Stream:
          def join_interval(self, ...): ...
          join_window = deprecated_alias(join_interval, "join_window", version="0.2.0")

Internal code uses only the new names (the test suite turns warnings into
errors). ``sinks`` and ``statestore`` may not import ``microbatch``: their few
shims call :func:`warnings.warn` directly with this message format (see
``sinks/_moved.py``).
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = ["REMOVED_IN", "deprecated_alias", "issue_deprecation_warning", "moved_names"]

REMOVED_IN = "0.3"
"""The release that removes the names deprecated in this one."""

F = TypeVar("F", bound=Callable[..., Any])


def issue_deprecation_warning(message: str, *, version: str, stacklevel: int = 2) -> None:
    """Emit a ``DeprecationWarning`` saying ``message`` and the microbatch
    ``version`` that deprecated it. ``stacklevel`` counts as in
    :func:`warnings.warn` from the caller of this function: the default 2
    points at whoever called the deprecated thing."""
    warnings.warn(
        f"{message} (deprecated in microbatch {version})",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


def moved_names(
    module_name: str, moved: Mapping[str, str], *, version: str
) -> Callable[[str], Any]:
    """A module ``__getattr__`` for names that moved out of ``module_name``.

    ``moved`` maps each old name to ``"new.module:NewName"``. Reading an old
    name imports the new module, warns once per access and returns the object;
    any other missing name raises ``AttributeError`` as usual.
    """
    targets = dict(moved)

    def __getattr__(name: str) -> Any:
        target = targets.get(name)
        if target is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        new_module, _, new_name = target.partition(":")
        issue_deprecation_warning(
            f"{module_name}.{name} moved to {new_module}.{new_name}; the old name will be "
            f"removed in microbatch {REMOVED_IN}",
            version=version,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new_module), new_name)

    __getattr__.__doc__ = f"Old names of {module_name}, answered with a DeprecationWarning."
    return __getattr__


def deprecated_alias(new: F, old_name: str, *, version: str) -> F:
    """The old name ``old_name`` of function or method ``new``: calling it warns
    and calls ``new`` with the same arguments.

    In a class body it makes a deprecated method (``old = deprecated_alias(new,
    "old", version=...)``); note that it calls ``new`` itself, not an override
    of ``new`` in a subclass.
    """
    owner, _, _ = new.__qualname__.rpartition(".")
    old_qualname = f"{owner}.{old_name}" if owner else old_name
    message = (
        f"{old_qualname} is renamed {new.__qualname__}; the old name will be removed in "
        f"microbatch {REMOVED_IN}"
    )

    @functools.wraps(new)
    def alias(*args: Any, **kwargs: Any) -> Any:
        issue_deprecation_warning(message, version=version, stacklevel=2)
        return new(*args, **kwargs)

    alias.__name__ = old_name
    alias.__qualname__ = old_qualname
    alias.__doc__ = f"Deprecated alias of ``{new.__qualname__}`` (since {version})."
    return alias  # type: ignore[return-value]
