"""Evaluates a logical plan over one batch of input rows.

Everything here is vectorized: a batch flows as one Polars ``LazyFrame``
from the sources through the steps and is collected once.
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

from microbatch.exceptions import PlanError
from microbatch.plan import PlanNode, SourceNode, StepNode
from microbatch.sources.base import Source


def source_ids(plan: PlanNode) -> dict[int, str]:
    """Map each source object (by identity) to its stable id: its position."""
    return {id(source): str(i) for i, source in enumerate(plan.sources())}


class BatchExecutor:
    """Runs the plan of one query on each batch's input frames."""

    def __init__(self, plan: PlanNode) -> None:
        self.plan = plan
        self._ids = source_ids(plan)

    def execute(self, inputs: Mapping[str, pl.DataFrame]) -> pl.DataFrame:
        """The result rows of this batch, given each source's rows by id."""
        return self._lazy(self.plan, inputs).collect()

    def _lazy(self, node: PlanNode, inputs: Mapping[str, pl.DataFrame]) -> pl.LazyFrame:
        if isinstance(node, SourceNode):
            return inputs[self._ids[id(node.source)]].lazy()
        if isinstance(node, StepNode):
            return node.step.apply(self._lazy(node.child, inputs))
        raise PlanError(f"the engine cannot run plan node {node.label()} yet")


def input_frame(source: Source, frame: pl.DataFrame) -> pl.DataFrame:
    """A source's rows, with its declared schema when it has no rows."""
    if frame.width == 0 and source.schema is not None:
        return source.schema.to_frame()
    return frame
