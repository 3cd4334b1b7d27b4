"""Evaluates a logical plan over one batch of input rows.

Everything here is vectorized: a batch flows as Polars ``LazyFrame``s from
the sources through the steps; it is collected only where it must be seen
whole (a watermark node observing event times, a stateful operator).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from microbatch.exceptions import PlanError
from microbatch.operators.base import OperatorContext, StatefulOperator
from microbatch.operators.window_agg import WindowAggregate
from microbatch.plan import (
    AggregateNode,
    DedupeNode,
    PlanNode,
    SourceNode,
    StepNode,
    WatermarkNode,
)
from microbatch.sources.base import Source
from microbatch.watermark import PARTITION_COLUMN, WatermarkSpec, WatermarkTracker
from microbatch.windows import SessionWindowSpec
from sinks.base import OutputMode

HIDDEN = "^__mb_.*$"


def source_ids(plan: PlanNode) -> dict[int, str]:
    """Map each source object (by identity) to its stable id: its position."""
    return {id(source): str(i) for i, source in enumerate(plan.sources())}


def build_operator(
    node: AggregateNode, operator_id: str, output_mode: OutputMode
) -> StatefulOperator:
    """The runtime operator for an aggregate spec."""
    if isinstance(node.window, SessionWindowSpec):
        from microbatch.operators.session import SessionAggregate

        return SessionAggregate(
            operator_id=operator_id,
            window=node.window,
            keys=list(node.keys),
            aggs=list(node.aggs),
            output_mode=output_mode,
        )
    return WindowAggregate(
        operator_id=operator_id,
        window=node.window,
        keys=list(node.keys),
        aggs=list(node.aggs),
        output_mode=output_mode,
    )


class BatchExecutor:
    """Runs the plan of one query on each batch's input frames.

    Owns the query's stateful operators (ids ``agg-0``, ``agg-1``… in plan
    order) and its watermark tracker (nodes ``wm-0``…).
    """

    def __init__(self, plan: PlanNode, *, output_mode: OutputMode = "append") -> None:
        self.plan = plan
        self._ids = source_ids(plan)
        self._wm_ids: dict[int, str] = {}
        self._ops: dict[int, StatefulOperator] = {}
        specs: dict[str, WatermarkSpec] = {}
        for node in plan.walk():
            if isinstance(node, WatermarkNode):
                nid = f"wm-{len(specs)}"
                self._wm_ids[id(node)] = nid
                specs[nid] = node.spec
            elif isinstance(node, AggregateNode):
                op_id = f"agg-{len(self._ops)}"
                self._ops[id(node)] = build_operator(node, op_id, output_mode)
            elif isinstance(node, DedupeNode):
                from microbatch.operators.dedupe import Deduplicate

                self._ops[id(node)] = Deduplicate(
                    operator_id=f"dedupe-{len(self._ops)}",
                    subset=list(node.subset),
                    within_ms=node.within_ms,
                    time_column=node.time_column,
                )
        self.tracker = WatermarkTracker(specs)
        self.operators: list[StatefulOperator] = list(self._ops.values())

    @property
    def has_state(self) -> bool:
        return bool(self.operators)

    def open(self, state_root: Path | None, batch_id: int) -> None:
        """Bind operators to their state directories before batch ``batch_id``."""
        for op in self.operators:
            op.open(None if state_root is None else state_root / op.operator_id, batch_id)

    def execute(self, inputs: Mapping[str, pl.DataFrame], ctx: OperatorContext) -> pl.DataFrame:
        """The result rows of this batch, given each source's rows by id."""
        out = self._lazy(self.plan, inputs, ctx).collect()
        return (
            out.select(pl.exclude(HIDDEN))
            if any(c.startswith("__mb_") for c in out.columns)
            else out
        )

    def _lazy(
        self, node: PlanNode, inputs: Mapping[str, pl.DataFrame], ctx: OperatorContext
    ) -> pl.LazyFrame:
        if isinstance(node, SourceNode):
            return inputs[self._ids[id(node.source)]].lazy()
        if isinstance(node, StepNode):
            return node.step.apply(self._lazy(node.child, inputs, ctx))
        if isinstance(node, WatermarkNode):
            df = self._lazy(node.child, inputs, ctx).collect()
            self.tracker.observe(self._wm_ids[id(node)], df, ctx.timestamp_ms)
            return df.lazy()
        if isinstance(node, AggregateNode | DedupeNode):
            df = self._lazy(node.child, inputs, ctx).collect()
            df = df.select(pl.exclude(HIDDEN)) if PARTITION_COLUMN in df.columns else df
            return self._ops[id(node)].process(df, ctx).lazy()
        raise PlanError(f"the engine cannot run plan node {node.label()} yet")

    def commit(self) -> None:
        for op in self.operators:
            op.commit()

    def abort(self) -> None:
        for op in self.operators:
            op.abort()

    def has_expirable_state(self, watermark_ms: int | None) -> bool:
        return any(op.has_expirable_state(watermark_ms) for op in self.operators)

    def state_metrics(self) -> dict[str, Any]:
        return {op.operator_id: op.metrics() for op in self.operators}


def input_frame(source: Source, frame: pl.DataFrame) -> pl.DataFrame:
    """A source's rows, with its declared schema when it has no rows."""
    if frame.width == 0 and source.schema is not None:
        return source.schema.to_frame()
    return frame
