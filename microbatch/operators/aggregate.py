"""Which operator runs a ``group_by(...).agg(...)`` node: tumbling/hopping
windows and plain keys (:mod:`~microbatch.operators.window_agg`), sessions
(:mod:`~microbatch.operators.session`), or, over a changelog input, the
retracting aggregation (:mod:`~microbatch.operators.retract_agg`)."""

from __future__ import annotations

from microbatch.operators.base import StatefulOperator
from microbatch.operators.registry import builds
from microbatch.operators.retract_agg import RetractingAggregate
from microbatch.operators.session import SessionAggregate
from microbatch.operators.window_agg import WindowAggregate
from microbatch.plan.nodes import AggregateNode
from microbatch.plan.windows import SessionWindowSpec
from microbatch.types import OutputMode

__all__ = ["build_aggregate"]


@builds(AggregateNode)
def build_aggregate(node: AggregateNode, operator_id: str, mode: OutputMode) -> StatefulOperator:
    """The operator of an aggregation node, chosen by its window and its input."""
    if isinstance(node.window, SessionWindowSpec):
        return SessionAggregate(
            operator_id=operator_id,
            window=node.window,
            keys=list(node.keys),
            aggs=list(node.aggs),
            output_mode=mode,
        )
    if node.retracts:
        return RetractingAggregate(
            operator_id=operator_id, keys=list(node.keys), aggs=list(node.aggs), output_mode=mode
        )
    return WindowAggregate(
        operator_id=operator_id,
        window=node.window,
        keys=list(node.keys),
        aggs=list(node.aggs),
        output_mode=mode,
        ttl_ms=node.ttl_ms,
    )
