"""Which operator runs each stateful plan node: one registry, filled by the
operator modules themselves.

An operator module registers the builder of its node class once, beside the
operator::

    @builds(DedupeNode)
    def build_dedupe(node: DedupeNode, operator_id: str, mode: OutputMode) -> StatefulOperator:
        return Deduplicate(operator_id=operator_id, ...)

:func:`build_operator` imports every module of :mod:`microbatch.operators`
the first time it is called (they register on import), so the engine, the
scale-out code and the tests keep no list of node classes: a new
:class:`~microbatch.plan.nodes.StatefulNode` subclass needs its spec, its
node, its operator module (with the builder) and its ``Stream`` method, and
nothing else (CONTRIBUTING.md, "A stateful operator").
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from typing import Any, TypeVar

from microbatch.exceptions import PlanError
from microbatch.operators.base import StatefulOperator
from microbatch.plan.nodes import StatefulNode
from microbatch.types import OutputMode

__all__ = ["Builder", "build_operator", "builds", "registered"]

N = TypeVar("N", bound=StatefulNode)
Builder = Callable[[N, str, OutputMode], StatefulOperator]
"""``builder(node, operator_id, output_mode) -> operator``: the runtime operator of
one node. ``output_mode`` is the mode this node's output runs in (the query's,
or what its parent node asks of it: ``StatefulNode.child_output_mode``)."""

_BUILDERS: dict[type[StatefulNode], Callable[[Any, str, OutputMode], StatefulOperator]] = {}


def builds(node_type: type[N]) -> Callable[[Builder[N]], Builder[N]]:
    """Register the decorated function as the builder of ``node_type``'s operator.

    One builder per node class: a second registration of another function for
    the same class is a programming error and raises ``TypeError``.
    """

    def register(builder: Builder[N]) -> Builder[N]:
        known = _BUILDERS.get(node_type)
        if known is not None and known.__qualname__ != builder.__qualname__:
            raise TypeError(
                f"{node_type.__name__} already has an operator builder "
                f"({known.__module__}.{known.__qualname__}); one node class, one builder"
            )
        _BUILDERS[node_type] = builder
        return builder

    return register


@functools.cache
def _load_operator_modules() -> None:
    """Import every module of :mod:`microbatch.operators` once: each registers
    the builders it defines."""
    import microbatch.operators as package

    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")


def registered() -> dict[type[StatefulNode], Callable[[Any, str, OutputMode], StatefulOperator]]:
    """Every node class with a builder (all operator modules loaded)."""
    _load_operator_modules()
    return dict(_BUILDERS)


def build_operator(
    node: StatefulNode, operator_id: str, output_mode: OutputMode
) -> StatefulOperator:
    """The runtime operator of ``node``, with the id that names its state directory."""
    _load_operator_modules()
    builder = _BUILDERS.get(type(node))
    if builder is None:
        raise PlanError(
            f"no operator is registered for the plan node {type(node).__name__} "
            f"({node.label()}): its operator module must register one with "
            "@microbatch.operators.registry.builds"
        )
    return builder(node, operator_id, output_mode)
