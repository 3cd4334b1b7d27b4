"""Evaluates a logical plan over one batch of input rows.

Everything here is vectorized: a batch flows as Polars ``LazyFrame``s from
the sources through the steps; it is collected only where it must be seen
whole (a watermark node observing event times, a stateful operator).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from microbatch._deprecation import moved_names
from microbatch.checkpoint.files import make_dirs
from microbatch.engine.state_backend import BACKEND_FILE, record_backend
from microbatch.engine.watermark import PARTITION_COLUMN, WatermarkSpec, WatermarkTracker
from microbatch.exceptions import IncompatibleCheckpointError, PlanError
from microbatch.frames import collect
from microbatch.operators.base import OperatorContext, StatefulOperator, check_operator_set
from microbatch.operators.join_state import BinaryOperator
from microbatch.operators.registry import build_operator
from microbatch.plan.nodes import (
    JOIN_NODES,
    AggregateJoinNode,
    AggregateNode,
    PlanNode,
    ProcessingTimeNode,
    SourceNode,
    StatefulNode,
    StaticJoinNode,
    StepNode,
    WatermarkNode,
)
from microbatch.plan.schemas import output_schema
from microbatch.sources.base import Source
from microbatch.types import OutputMode

HIDDEN = "^__mb_.*$"
SHARD_FILE = "shards.json"
"""``state/shards.json``: a scaled-out query's shard count and key, fixed for
the checkpoint's life (:mod:`microbatch.distributed.sharding`)."""


def source_ids(plan: PlanNode) -> dict[int, str]:
    """Map each source object (by identity) to its stable id: its position."""
    return {id(source): str(i) for i, source in enumerate(plan.sources())}


def build_operators(plan: PlanNode, output_mode: OutputMode) -> dict[int, StatefulOperator]:
    """The runtime operator of every stateful node (``id(node)`` -> operator).

    NOTE: ids are ``<node.kind>-<i>``, ``i`` counting the stateful nodes before
    it in ``plan.walk()``: they name state directories in existing checkpoints.
    A node runs in the output mode its stateful parent asks of it
    (``child_output_mode``: an aggregation under ``fire_once`` emits every
    change; in ``changelog`` mode it emits those changes as a changelog), else
    in the query's.
    """
    modes: dict[int, OutputMode] = {}
    ops: dict[int, StatefulOperator] = {}
    for node in plan.walk():
        if not isinstance(node, StatefulNode):
            continue
        if node.child_output_mode is not None:
            child_mode: OutputMode = node.child_output_mode
            if output_mode == "changelog" and child_mode == "update":
                child_mode = "changelog"  # the same rows, with their preimages
            modes.update(dict.fromkeys(map(id, node.children), child_mode))
        operator_id = f"{node.kind}-{len(ops)}"
        ops[id(node)] = build_operator(node, operator_id, modes.get(id(node), output_mode))
    return ops


class BatchExecutor:
    """Runs the plan of one query on each batch's input frames.

    Owns the query's stateful operators (ids ``agg-0``, ``agg-1``… in plan
    order) and its watermark tracker (nodes ``wm-0``…).
    """

    def __init__(
        self, plan: PlanNode, *, output_mode: OutputMode = "append", state_backend: str = "memory"
    ) -> None:
        self.plan = plan
        self.state_backend = state_backend
        """Where the operators keep keyed state (:mod:`microbatch.engine.state_backend`)."""
        self._ids = source_ids(plan)
        self._wm_ids: dict[int, str] = {}
        self._ops = build_operators(plan, output_mode)
        specs: dict[str, WatermarkSpec] = {}
        for node in plan.walk():
            if isinstance(node, WatermarkNode):
                nid = f"wm-{len(specs)}"
                self._wm_ids[id(node)] = nid
                specs[nid] = node.spec
        validate_joins(plan, output_mode)
        self.tracker = WatermarkTracker(specs)
        self.operators: list[StatefulOperator] = list(self._ops.values())
        # a node's position in plan.walk(): the same in every process given the plan
        self.positions: dict[int, int] = {id(node): i for i, node in enumerate(plan.walk())}
        self._exchanged: Mapping[tuple[int, int], pl.DataFrame] = {}
        # steps over input of a schema unknown at build time: a batch of such a
        # source may have no columns at all (every record a dead letter), and a
        # step naming a column cannot apply to it; the empty batch passes on
        self._may_lack_columns = {
            id(node) for node in plan.walk()
            if isinstance(node, StepNode) and output_schema(node.child) is None
        }

    def node_ids(self) -> dict[int, str]:
        """Plan node (``id(node)``) -> its id here: ``agg-0``, ``wm-0``, or a
        source's position; what views label the plan with."""
        ids = {id(node): self._ids[id(node.source)] for node in self.plan.walk()
               if isinstance(node, SourceNode)}
        ids.update(self._wm_ids)
        ids.update({key: op.operator_id for key, op in self._ops.items()})
        return ids

    @property
    def has_state(self) -> bool:
        return bool(self.operators)

    def operator_at(self, position: int) -> StatefulOperator:
        """The operator of the stateful node at ``position`` in ``plan.walk()``."""
        node = list(self.plan.walk())[position]
        return self._ops[id(node)]

    def open(self, state_root: Path | None, batch_id: int) -> None:
        """Bind operators to their state directories before batch ``batch_id``."""
        if state_root is not None:
            refuse_sharded(state_root)
            check_operator_set(state_root, batch_id, self.operators)
        for op in self.operators:
            op.state_backend = self.state_backend
            op_dir = None if state_root is None else state_root / op.operator_id
            if op_dir is not None and (
                self.state_backend != "memory" or (op_dir / BACKEND_FILE).exists()
            ):
                make_dirs(op_dir)
                record_backend(op_dir, self.state_backend)
            op.open(op_dir, batch_id)

    def execute(
        self,
        inputs: Mapping[str, pl.DataFrame],
        ctx: OperatorContext,
        exchanged: Mapping[tuple[int, int], pl.DataFrame] | None = None,
    ) -> pl.DataFrame:
        """The result rows of this batch, given each source's rows by id.

        ``exchanged`` gives the input rows of stateful nodes directly, by
        (position in ``plan.walk()``, input side): a shard of a scaled-out query
        receives them from the workers that ran the stateless steps.
        """
        self._exchanged = exchanged or {}
        try:
            out = collect(self._lazy(self.plan, inputs, ctx))
        finally:
            self._exchanged = {}
        return (
            out.select(pl.exclude(HIDDEN))
            if any(c.startswith("__mb_") for c in out.columns)
            else out
        )

    def stateless_inputs(
        self,
        frontier: list[tuple[int, int]],
        inputs: Mapping[str, pl.DataFrame],
        ctx: OperatorContext,
    ) -> dict[tuple[int, int], pl.DataFrame]:
        """The input rows of the stateful nodes at ``frontier`` (position, side):
        their subtrees hold only stateless steps and watermark nodes."""
        nodes = list(self.plan.walk())
        return {
            (pos, side): collect(self._lazy(nodes[pos].children[side], inputs, ctx))
            for pos, side in frontier
        }

    def _input(
        self, node: PlanNode, side: int, inputs: Mapping[str, pl.DataFrame], ctx: OperatorContext
    ) -> pl.DataFrame:
        got = self._exchanged.get((self.positions[id(node)], side))
        if got is not None:
            return got
        return collect(self._lazy(node.children[side], inputs, ctx))

    def _lazy(
        self, node: PlanNode, inputs: Mapping[str, pl.DataFrame], ctx: OperatorContext
    ) -> pl.LazyFrame:
        if isinstance(node, SourceNode):
            return inputs[self._ids[id(node.source)]].lazy()
        if isinstance(node, StepNode):
            child = self._lazy(node.child, inputs, ctx)
            if id(node) in self._may_lack_columns and not _visible_columns(child):
                return child
            return node.step.apply(child)
        if isinstance(node, WatermarkNode):
            child = self._lazy(node.child, inputs, ctx)
            if isinstance(node, ProcessingTimeNode):
                child = child.with_columns(processing_time(ctx).alias(node.spec.column))
            df = collect(child)
            self.tracker.observe(self._wm_ids[id(node)], df, ctx.timestamp_ms)
            return df.lazy()
        if isinstance(node, StatefulNode):
            frames = [
                self._input(node, side, inputs, ctx)
                if node.keeps_hidden_columns
                else self._visible(node, side, inputs, ctx)
                for side in range(len(node.children))
            ]
            op = self._ops[id(node)]
            if len(frames) == 1:
                return op.process(frames[0], ctx).lazy()
            assert isinstance(op, BinaryOperator)
            return op.process_pair(frames[0], frames[1], ctx).lazy()
        if isinstance(node, AggregateJoinNode):
            left, right = (self._visible(node, side, inputs, ctx) for side in (0, 1))
            return aggregate_join(left, right, node).lazy()
        raise PlanError(f"the engine cannot run plan node {node.label()} yet")

    def _visible(
        self, node: PlanNode, side: int, inputs: Mapping[str, pl.DataFrame], ctx: OperatorContext
    ) -> pl.DataFrame:
        """An input's rows of this batch without the engine's hidden columns."""
        df = self._input(node, side, inputs, ctx)
        return df.select(pl.exclude(HIDDEN)) if PARTITION_COLUMN in df.columns else df

    def commit(self) -> None:
        for op in self.operators:
            op.commit()

    def abort(self) -> None:
        for op in self.operators:
            op.abort()

    def has_expirable_state(self, watermark_ms: int | None) -> bool:
        return any(op.has_expirable_state(watermark_ms) for op in self.operators)

    def due(self, now_ms: int, watermark_ms: int | None) -> bool:
        """A timer or TTL of some operator is due at ``now_ms`` and ``watermark_ms``."""
        return any(op.due(now_ms, watermark_ms) for op in self.operators)

    def state_metrics(self) -> dict[str, Any]:
        return {op.operator_id: op.metrics() for op in self.operators}

    def batch_profile(self) -> dict[str, Any] | None:
        """``None``: the batch ran here (its step times are the record's)."""
        return None

    def close(self) -> None:
        """Release the operators' state (the databases of an on-disk backend)."""
        for op in self.operators:
            op.close()


def refuse_sharded(state_root: Path) -> None:
    """Refuse to run a checkpoint of a scaled-out query in one process: its
    state is split into shards that only the Ray executor reads."""
    path = state_root / SHARD_FILE
    if path.exists():
        raise IncompatibleCheckpointError(
            f"the checkpoint {state_root.parent} was written by a query scaled out on Ray: its "
            f"state is split into shards ({path}). Run it with --workers N (or "
            "writer.start(executor=mb.RayExecutor(...))), or start on a new checkpoint directory."
        )


def aggregate_join(
    left: pl.DataFrame, right: pl.DataFrame, node: AggregateJoinNode
) -> pl.DataFrame:
    """Join two windowed aggregations' rows of this batch (no state needed).

    NOTE: both inputs are append-mode aggregations over the same window under
    the query's one watermark, so a window's row leaves both of them in the
    same batch (the first whose watermark reaches the window's end), and the
    batch's rows alone give the complete join of every window they close.
    """
    on = list(node.spec.on)
    if not left.width or not right.width:  # an input that never had a row has no columns
        known = left if left.width else right
        if not known.width:
            return pl.DataFrame()
        empty = known.select(on).head(0)
        left, right = (left if left.width else empty), (right if right.width else empty)
    out = left.join(
        right,
        on=on,
        how=node.spec.how,
        suffix=node.spec.suffix,
        coalesce=True,
        maintain_order="left_right",
    )
    if out.height > 1:
        return out.sort(on, maintain_order=True, nulls_last=True)
    return out


def validate_joins(plan: PlanNode, mode: OutputMode) -> None:
    """Refuse joins that cannot run in ``mode``: a stream-stream join needs final
    input rows, so an aggregation below it must run in append mode."""
    if mode == "append":
        return
    for node in plan.walk():
        if not isinstance(node, JOIN_NODES) or isinstance(node, StaticJoinNode):
            continue
        below = [n for child in node.children for n in child.walk()]
        if any(isinstance(n, AggregateNode) for n in below):
            raise PlanError(
                f"output_mode={mode!r}: the join {node.label()!r} has an aggregation below it, "
                "whose rows are final only in append mode (in update mode a window's row is "
                "re-emitted as it changes, and the join would match every version). Use "
                "output_mode='append', or aggregate after the join."
            )


def processing_time(ctx: OperatorContext) -> pl.Expr:
    """The batch's processing time as a ``Datetime("ms", "UTC")`` literal: its
    recorded timestamp, raised to the watermark in force (a clock that stepped
    back never makes the batch's own rows late). Both are in ``offsets/N``, so
    a re-run of the batch gives the same value."""
    ms = ctx.timestamp_ms if ctx.watermark_ms is None else max(ctx.timestamp_ms, ctx.watermark_ms)
    return pl.lit(ms, pl.Int64).cast(pl.Datetime("ms")).dt.replace_time_zone("UTC")


def input_frame(source: Source, frame: pl.DataFrame) -> pl.DataFrame:
    """A source's rows, with its declared schema when it has no rows."""
    if frame.width == 0 and source.schema is not None:
        return source.schema.to_frame()
    return frame


if not TYPE_CHECKING:  # mypy would take every missing name for a moved one
    __getattr__ = moved_names(
        __name__,
        {
            "window_join": "microbatch.engine.batch_executor:aggregate_join",
        },
        version="0.2.0",
    )
    """Builders live beside their operators (:mod:`microbatch.operators.registry`)."""


def _visible_columns(frame: pl.LazyFrame) -> list[str]:
    """The frame's columns other than the engine's hidden ``__mb_*`` ones."""
    return [c for c in frame.collect_schema() if not c.startswith("__mb_")]
