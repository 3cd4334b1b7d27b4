"""The logical plan: an immutable tree of nodes that a stream describes.

A :class:`Stream` is a plan; nothing runs until a query starts. The
executor walks the tree once per batch, feeding each source node the rows
read for that batch. Stateless steps are Polars operations on a
``LazyFrame``, so one batch is optimized and collected as a whole.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import polars as pl

from microbatch._deprecation import moved_names
from microbatch.frames import collect
from microbatch.plan.aggregates import AggSpec
from microbatch.plan.event_time import WatermarkSpec
from microbatch.plan.joins import (
    SUFFIX,
    AggregateJoinSpec,
    AsOfJoinSpec,
    IntervalJoinSpec,
    StaticJoinSpec,
    output_columns,
)
from microbatch.plan.stateful import TransformSpec
from microbatch.plan.windows import SessionWindowSpec, WindowSpec
from microbatch.sources.base import Source


class PlanNode(ABC):
    """A node of the logical plan."""

    @property
    @abstractmethod
    def children(self) -> tuple[PlanNode, ...]:
        """Inputs of this node (empty for sources)."""

    @abstractmethod
    def label(self) -> str:
        """One line for ``explain()``."""

    def walk(self) -> Iterator[PlanNode]:
        """This node and all below it, depth first, children in order."""
        yield self
        for child in self.children:
            yield from child.walk()

    def derive_schema(self, inputs: tuple[pl.Schema, ...]) -> pl.Schema | None:
        """This node's output schema from its children's (``inputs``, in order);
        ``None`` when it is known only once a batch runs. Raises
        :class:`~microbatch.exceptions.PlanError` when the node cannot apply to
        its inputs (a column it names is missing). See
        :func:`microbatch.plan.schemas.output_schema`."""
        return None

    def shard_keys(self) -> tuple[str, ...] | None:
        """The columns whose rows of one value this node needs in one place
        (Spark's required child distribution); ``None``: row-local, any split
        of the rows will do. A scaled-out query hashes rows to shards by the
        keys every node of its plan has in common."""
        return None

    def sources(self) -> list[Source]:
        """The plan's sources in a stable order (their ids are the positions)."""
        return [node.source for node in self.walk() if isinstance(node, SourceNode)]

    def explain(self, indent: int = 0) -> str:
        """The plan as an indented tree, root first."""
        lines = ["  " * indent + self.label()]
        lines += [child.explain(indent + 1) for child in self.children]
        return "\n".join(lines)


class StatefulNode(PlanNode):
    """A plan node run by a stateful operator that keeps state across batches.

    Each subclass declares what the engine needs to know without a list of
    classes anywhere else:

    - ``kind``: the prefix of its operator id (``agg``, ``fire``, ...). The
      engine numbers stateful nodes in plan order, ``<kind>-<i>`` where ``i``
      counts every stateful node before it; the id names the operator's state
      directory (``state/<id>/``) in existing checkpoints, so neither the
      prefixes nor the numbering ever change.
    - :meth:`shard_keys`: how its input must be partitioned when scaled out.
    - ``children``: its inputs (one, or two for a stream-stream join).
    - ``child_output_mode``: the output mode its stateful child must run in
      (``None``: the query's).
    - ``keeps_hidden_columns``: its input keeps the engine's ``__mb_*``
      columns (a row-local node that passes them on).

    The operator that runs a node is registered for its class in
    :mod:`microbatch.operators.registry` by the operator's own module.
    """

    kind: ClassVar[str]
    child_output_mode: ClassVar[Literal["append", "update", "complete"] | None] = None
    keeps_hidden_columns: ClassVar[bool] = False

    def label(self) -> str:
        return f"{self.describe_node()}  [stateful]"

    @abstractmethod
    def describe_node(self) -> str:
        """One line for ``explain()``, without the ``[stateful]`` mark."""


@dataclass(frozen=True, eq=False)
class SourceNode(PlanNode):
    """Rows read from one source for the current batch."""

    source: Source

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return ()

    def derive_schema(self, inputs: tuple[pl.Schema, ...]) -> pl.Schema | None:
        schema = self.source.schema
        if schema is None:
            return None
        return pl.Schema({k: v for k, v in schema.items() if not k.startswith("__mb_")})

    def label(self) -> str:
        desc = self.source.describe()
        rest = ", ".join(f"{k}={v}" for k, v in desc.items() if k != "kind" and v is not None)
        return f"Source[{desc.get('kind', '?')}]({rest})"


@dataclass(frozen=True)
class Step:
    """A stateless operation on a batch: ``apply(lazy_frame) -> lazy_frame``."""

    name: str
    args: tuple[Any, ...]
    apply: Callable[[pl.LazyFrame], pl.LazyFrame] = field(compare=False, repr=False)
    opaque: bool = False
    """The step runs user code on collected rows (``map_batches``): its output
    schema is ``declared_schema``, or unknown until a batch runs."""
    declared_schema: pl.Schema | None = field(default=None, compare=False)

    def label(self) -> str:
        shown = ", ".join(_short(a) for a in self.args)
        return f"{self.name}({shown})"


def _short(value: Any, limit: int = 80) -> str:
    text = getattr(value, "__qualname__", None) or str(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True, eq=False)
class StepNode(PlanNode):
    """A stateless step applied to the child's rows."""

    child: PlanNode
    step: Step

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.child,)

    def derive_schema(self, inputs: tuple[pl.Schema, ...]) -> pl.Schema | None:
        from microbatch.plan.schemas import derive_step_schema

        if self.step.opaque:
            return self.step.declared_schema
        return derive_step_schema(self.step.label(), self.step.apply, inputs[0])

    def label(self) -> str:
        return self.step.label()


def map_batches_step(
    fn: Callable[[pl.DataFrame], pl.DataFrame], schema: pl.Schema | None = None
) -> Step:
    """The escape hatch: ``fn`` sees each batch as one whole ``DataFrame``;
    ``schema`` declares its output (checked on every batch when given)."""

    def apply(lf: pl.LazyFrame) -> pl.LazyFrame:
        out = fn(collect(lf))
        if not isinstance(out, pl.DataFrame):
            raise TypeError(
                f"map_batches function {_short(fn)} returned {type(out).__name__}; "
                "it must return a polars DataFrame"
            )
        if schema is not None and out.schema != schema:
            raise TypeError(
                f"map_batches function {_short(fn)} returned columns {dict(out.schema)}; "
                f"it declared schema={dict(schema)}"
            )
        return out.lazy()

    return Step("map_batches", (fn,), apply, opaque=True, declared_schema=schema)


def expr_step(name: str, method: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Step:
    """A step that calls ``LazyFrame.<method>(*args, **kwargs)``."""

    def apply(lf: pl.LazyFrame) -> pl.LazyFrame:
        out: pl.LazyFrame = getattr(lf, method)(*args, **kwargs)
        return out

    shown = tuple(args) + tuple(f"{k}={v}" for k, v in kwargs.items())
    return Step(name, shown, apply)


@dataclass(frozen=True, eq=False)
class WatermarkNode(PlanNode):
    """Rows pass through; their event times advance the watermark."""

    child: PlanNode
    spec: WatermarkSpec

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.child,)

    def derive_schema(self, inputs: tuple[pl.Schema, ...]) -> pl.Schema | None:
        from microbatch.plan.schemas import check_event_time_column

        check_event_time_column(inputs[0], self.spec.column, "with_watermark")
        return inputs[0]

    def label(self) -> str:
        idle = f", idle_timeout={self.spec.idle_timeout_ms}ms" if self.spec.idle_timeout_ms else ""
        return f"Watermark({self.spec.column}, delay={self.spec.delay_ms}ms{idle})"


@dataclass(frozen=True, eq=False)
class ProcessingTimeNode(WatermarkNode):
    """Adds ``spec.column``: the batch's recorded processing time (a UTC
    ``Datetime("ms")``), and makes it the stream's time attribute with a
    watermark of the batch's own time (``with_processing_time``)."""

    def derive_schema(self, inputs: tuple[pl.Schema, ...]) -> pl.Schema | None:
        schema = inputs[0]
        if self.spec.column in schema:
            from microbatch.exceptions import PlanError

            raise PlanError(
                f"with_processing_time({self.spec.column!r}): the stream already has a column "
                f"{self.spec.column!r}; name the processing-time column differently, or drop "
                "or rename the existing one first"
            )
        return pl.Schema({**schema, self.spec.column: PROCESSING_TIME_TYPE})

    def label(self) -> str:
        return f"ProcessingTime({self.spec.column})"


PROCESSING_TIME_TYPE = pl.Datetime("ms", "UTC")
"""The type of a ``with_processing_time`` column."""


def describe_grouping(
    window: WindowSpec | SessionWindowSpec | None, keys: Sequence[str], aggs: Sequence[AggSpec]
) -> str:
    """``<window options>; keys=[...]](agg(col) as out, ...)``: an aggregation in ``explain``."""
    win = ""
    if window is not None:
        win = ", ".join(f"{k}={v}" for k, v in window.describe().items()) + "; "
    described = ", ".join(f"{a.kind}({a.column or ''}) as {a.output}" for a in aggs)
    return f"{win}keys={list(keys)}]({described})"


def grouped_schema(
    schema: pl.Schema,
    window: WindowSpec | SessionWindowSpec | None,
    keys: Sequence[str],
    aggs: Sequence[AggSpec],
) -> dict[str, pl.DataType]:
    """The columns a ``group_by([window], *keys).agg(*aggs)`` over ``schema`` emits:
    ``window_start, window_end`` (typed like the window's column), the keys, the
    aggregates (typed as their finalized partials); checks that each column exists."""
    from microbatch.plan.aggregates import TIME
    from microbatch.plan.schemas import check_columns, check_event_time_column

    out: dict[str, pl.DataType] = {}
    if window is not None:
        check_event_time_column(schema, window.column, "group_by window")
        out["window_start"] = out["window_end"] = schema[window.column]
    check_columns(schema, list(keys), "group_by")
    check_columns(schema, [a.column for a in aggs if a.column], "agg")
    out.update({k: schema[k] for k in keys})
    frame = schema.to_frame().with_columns(pl.lit(0, pl.Int64).alias(TIME))
    partials = frame.select([e for a in aggs for e in a.partials(schema)])
    out.update(partials.select([a.finalize() for a in aggs]).schema)
    return out


@dataclass(frozen=True, eq=False)
class AggregateNode(StatefulNode):
    """A streaming ``group_by([window], *keys).agg(...)``; keeps state."""

    kind: ClassVar[str] = "agg"

    child: PlanNode
    window: WindowSpec | SessionWindowSpec | None
    keys: tuple[str, ...]
    aggs: tuple[AggSpec, ...]
    ttl_ms: int | None = None
    """Without a window: forget a key's state this long after its last update."""

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.child,)

    def shard_keys(self) -> tuple[str, ...]:
        return self.keys

    def describe_node(self) -> str:
        return f"Aggregate[{describe_grouping(self.window, self.keys, self.aggs)}"

    def derive_schema(self, inputs: tuple[pl.Schema, ...]) -> pl.Schema | None:
        """``window_start, window_end`` (typed like the window's column), the keys,
        the aggregates; ``revision`` last when the window has an allowed lateness
        (present in append mode, the default)."""
        from microbatch.plan.changelog_inputs import (
            check_retractable,
            is_changelog_schema,
            refuse_event_time_operator,
            refuse_upsert_topics,
        )
        from microbatch.plan.schemas import check_columns

        schema = inputs[0]
        out: dict[str, pl.DataType] = {}
        if is_changelog_schema(schema):
            # a windowless group_by retracts; the rest is refused (plan/changelog_inputs.py)
            if self.window is not None:
                what = "a session window" if isinstance(self.window, SessionWindowSpec) else (
                    "a window")
                refuse_event_time_operator(schema, f"group_by({what}, ...)")
            check_columns(schema, [a.column for a in self.aggs if a.column], "agg")
            check_retractable(self.aggs, schema, ttl=self.ttl_ms is not None)
            refuse_upsert_topics([str(s.describe().get("format")) for s in self.child.sources()])
        out.update(grouped_schema(schema, self.window, self.keys, self.aggs))
        if isinstance(self.window, WindowSpec) and self.window.allowed_lateness_ms:
            out["revision"] = pl.Int64()
        return pl.Schema(out)

    def output_keys(self) -> list[str]:
        """Columns that identify an output row (for update-mode sinks)."""
        win = ["window_start", "window_end"] if self.window is not None else []
        return win + list(self.keys)

    @property
    def retracts(self) -> bool:
        """Its input is a changelog (known at build time): each change row counts
        with its sign, and a key whose rows are all deleted leaves the result."""
        from microbatch.plan.changelog_inputs import is_changelog_schema
        from microbatch.plan.schemas import output_schema

        return is_changelog_schema(output_schema(self.child))


@dataclass(frozen=True, eq=False)
class DiscardingAggregateNode(StatefulNode):
    """``group_by(..., accumulation_mode="discarding").agg(...)``: each batch's
    increment of additive aggregates (Beam's discarding fired panes).

    Per batch, one row per (window, keys) touched by the batch's rows that are
    not late, holding the aggregates over those rows only; the sum of a
    window's increments is its accumulated value. Keeps no keyed state: the
    late rule needs only the watermark in force. Validated when built: only
    ``len``/``count``/``sum``, no session window, no ``ttl``.
    """

    kind: ClassVar[str] = "agg"

    child: PlanNode
    window: WindowSpec | None
    keys: tuple[str, ...]
    aggs: tuple[AggSpec, ...]

    def __post_init__(self) -> None:
        from microbatch.plan.aggregates import check_additive

        check_additive(self.aggs)

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.child,)

    def shard_keys(self) -> tuple[str, ...]:
        return self.keys

    def describe_node(self) -> str:
        return f"DiscardingAggregate[{describe_grouping(self.window, self.keys, self.aggs)}"

    def derive_schema(self, inputs: tuple[pl.Schema, ...]) -> pl.Schema | None:
        """``window_start, window_end`` (typed like the window's column), the keys,
        the increments (typed as the accumulating aggregates); never ``_change_type``:
        increments are facts, emitted once each."""
        from microbatch.plan.aggregates import check_discarding_input
        from microbatch.plan.changelog_inputs import is_changelog_schema, refuse_upsert_topics

        schema = inputs[0]
        check_discarding_input(schema, self.window)
        if is_changelog_schema(schema):
            refuse_upsert_topics([str(s.describe().get("format")) for s in self.child.sources()])
        out: dict[str, pl.DataType] = {}
        out.update(grouped_schema(schema, self.window, self.keys, self.aggs))
        return pl.Schema(out)

    def check_output_mode(self, mode: str) -> None:
        """Increments are new facts, each to be added once: only ``append`` is
        meaningful (an upsert by key would replace a running value by an
        increment, a complete table or a changelog would claim a result table
        the increments are not)."""
        from microbatch.exceptions import PlanError

        if mode != "append":
            raise PlanError(
                f"output_mode={mode!r} cannot carry the increments of "
                "group_by(..., accumulation_mode='discarding'): each row is an amount to "
                "add to what the sink holds, not a result row to upsert or retract. Use "
                "output_mode='append' (the default) with a sink that adds, or "
                "accumulation_mode='accumulating' (the default) for running values in "
                f"output_mode={mode!r}."
            )


@dataclass(frozen=True, eq=False)
class FireOnceNode(StatefulNode):
    """``agg(...).fire_once(condition)``: a windowed aggregation fired early.

    The aggregation below emits a window's row in every batch that changes it
    (early firing); this node passes a row on the first time ``condition`` holds
    for its (window, keys), and, with ``corrections``, each later change of a
    fired window with the next ``revision``. It keeps the fired keys in state
    until the watermark passes the window's end plus its allowed lateness.
    """

    kind: ClassVar[str] = "fire"
    child_output_mode: ClassVar[Literal["update"]] = "update"
    """NOTE: the aggregation below emits every change (early firing)."""

    child: AggregateNode
    condition: pl.Expr
    corrections: bool = False

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.child,)

    def shard_keys(self) -> tuple[str, ...]:
        return self.child.keys

    def derive_schema(self, inputs: tuple[pl.Schema, ...]) -> pl.Schema | None:
        from microbatch.plan.schemas import derive_step_schema

        schema = pl.Schema({k: v for k, v in inputs[0].items() if k != "revision"})
        derive_step_schema("fire_once condition", lambda lf: lf.filter(self.condition), schema)
        return pl.Schema({**schema, "revision": pl.Int64()}) if self.corrections else schema

    def describe_node(self) -> str:
        more = ", with corrections" if self.corrections else ""
        return f"FireOnce(when {self.condition}{more})"


@dataclass(frozen=True, eq=False)
class TransformNode(StatefulNode):
    """``group_by(*keys).transform_with_state(fn, ...)``: per-key state and timers,
    ``fn`` called once per batch; keeps state."""

    kind: ClassVar[str] = "transform"

    child: PlanNode
    spec: TransformSpec

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.child,)

    def shard_keys(self) -> tuple[str, ...]:
        return self.spec.keys

    def derive_schema(self, inputs: tuple[pl.Schema, ...]) -> pl.Schema | None:
        from microbatch.plan.schemas import check_columns

        check_columns(inputs[0], self.spec.keys, "transform_with_state keys")
        return self.spec.output_schema

    def describe_node(self) -> str:
        fn = getattr(self.spec.fn, "__qualname__", type(self.spec.fn).__name__)
        ttl = f", ttl={self.spec.ttl_ms}ms ({self.spec.ttl_time})" if self.spec.ttl_ms else ""
        return (f"TransformWithState[keys={list(self.spec.keys)}](fn={fn}, "
                f"state={list(self.spec.state_schema)}{ttl})")


@dataclass(frozen=True, eq=False)
class DedupeNode(StatefulNode):
    """``drop_duplicates(subset, within=)`` or ``(subset, ttl=)``: first row per key;
    keeps state (bounded by the watermark, or by processing-time TTL)."""

    kind: ClassVar[str] = "dedupe"

    child: PlanNode
    subset: tuple[str, ...]
    within_ms: int | None
    time_column: str | None
    ttl_ms: int | None = None

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.child,)

    def shard_keys(self) -> tuple[str, ...]:
        return self.subset

    def derive_schema(self, inputs: tuple[pl.Schema, ...]) -> pl.Schema | None:
        from microbatch.plan.changelog_inputs import refuse_event_time_operator
        from microbatch.plan.schemas import check_columns

        refuse_event_time_operator(inputs[0], "drop_duplicates")
        check_columns(inputs[0], self.subset, "drop_duplicates subset")
        return inputs[0]

    def describe_node(self) -> str:
        if self.ttl_ms is not None:
            return f"DropDuplicates(subset={list(self.subset)}, ttl={self.ttl_ms}ms)"
        return (
            f"DropDuplicates(subset={list(self.subset)}, within={self.within_ms}ms, "
            f"time={self.time_column})"
        )


@dataclass(frozen=True, eq=False)
class IntervalJoinNode(StatefulNode):
    """Stream-stream interval join of two inputs (``join_interval``, and
    ``join_window``: equal windows, a zero-width interval); keeps state on
    both sides."""

    kind: ClassVar[str] = "join"

    left: PlanNode
    right: PlanNode
    spec: IntervalJoinSpec

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.left, self.right)

    def shard_keys(self) -> tuple[str, ...]:
        return self.spec.on

    def derive_schema(self, inputs: tuple[pl.Schema, ...]) -> pl.Schema | None:
        from microbatch.plan.changelog_inputs import refuse_event_time_operator
        from microbatch.plan.schemas import check_columns, check_event_time_column

        left, right = inputs
        s = self.spec
        for side, which in ((left, "this stream"), (right, "the other stream")):
            refuse_event_time_operator(side, f"an interval or window join ({which})")
        check_columns(left, s.on, "join key (this stream)")
        check_columns(right, s.on, "join key (the other stream)")
        check_event_time_column(left, s.left_time, "join left_time")
        check_event_time_column(right, s.right_time, "join right_time")
        return joined_schema(left, right, s.on)

    def describe_node(self) -> str:
        s = self.spec
        return (
            f"IntervalJoin[{s.how}](on={list(s.on)}, {s.right_time} in [{s.left_time} "
            f"{s.lower_ms:+d}ms, {s.left_time} {s.upper_ms:+d}ms])"
        )


@dataclass(frozen=True, eq=False)
class AggregateJoinNode(PlanNode):
    """``agg_a.join(agg_b, on=[window_start, ...])``: two append-mode windowed
    aggregations joined per window. Keeps no state: both inputs emit a window
    in the same batch (batch-local), but a key's rows must meet in one place."""

    left: PlanNode
    right: PlanNode
    spec: AggregateJoinSpec

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.left, self.right)

    def shard_keys(self) -> tuple[str, ...]:
        return self.spec.on

    def derive_schema(self, inputs: tuple[pl.Schema, ...]) -> pl.Schema | None:
        from microbatch.plan.schemas import check_columns

        left, right = inputs
        check_columns(left, self.spec.on, "join key (this stream)")
        check_columns(right, self.spec.on, "join key (the other stream)")
        return joined_schema(left, right, self.spec.on, self.spec.suffix)

    def label(self) -> str:
        return f"AggregateJoin[{self.spec.how}](on={list(self.spec.on)})"


@dataclass(frozen=True, eq=False)
class AsOfJoinNode(StatefulNode):
    """Events enriched with a changelog stream's version as of their time; keeps state."""

    kind: ClassVar[str] = "join"

    left: PlanNode
    right: PlanNode
    spec: AsOfJoinSpec

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.left, self.right)

    def shard_keys(self) -> tuple[str, ...]:
        return self.spec.on

    def derive_schema(self, inputs: tuple[pl.Schema, ...]) -> pl.Schema | None:
        from microbatch.exceptions import ChangelogInputError
        from microbatch.plan.joins import events_changelog_refusal
        from microbatch.plan.schemas import check_columns, check_event_time_column
        from sinks.changelog import CHANGE_TYPE

        events, dim = inputs
        s = self.spec
        if CHANGE_TYPE in events:
            raise ChangelogInputError(events_changelog_refusal())
        check_columns(events, s.on, "join_asof_table key (events)")
        check_columns(dim, s.on, "join_asof_table key (dimension)")
        check_event_time_column(events, s.time, "join_asof_table time")
        check_event_time_column(dim, s.dim_time, "join_asof_table dim_time")
        # a changelog dimension's _change_type says what a version is; it is not output
        values = pl.Schema({c: t for c, t in dim.items() if c != CHANGE_TYPE})
        return joined_schema(events, values, s.on, s.suffix)

    def describe_node(self) -> str:
        s = self.spec
        return f"AsOfJoin[{s.how}](on={list(s.on)}, {s.time} >= {s.dim_time}, latest version)"


@dataclass(frozen=True, eq=False)
class StaticJoinNode(StatefulNode):
    """The child's rows joined with a static table, re-read when it changes.

    Row-local (no shard keys); its operator keeps the table version it read."""

    kind: ClassVar[str] = "join"
    keeps_hidden_columns: ClassVar[bool] = True

    child: PlanNode
    spec: StaticJoinSpec

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.child,)

    def derive_schema(self, inputs: tuple[pl.Schema, ...]) -> pl.Schema | None:
        from microbatch.plan.schemas import check_columns, derive_step_schema

        table = self.spec.table.known_schema()
        check_columns(inputs[0], self.spec.on, "join_static key (the stream)")
        if table is None:
            return None
        check_columns(table, self.spec.on, "join_static key (the static table)")
        other = table.to_frame().lazy()
        return derive_step_schema(
            "join_static",
            lambda lf: lf.join(other, on=list(self.spec.on), how=self.spec.how,
                               suffix=self.spec.suffix, coalesce=True),
            inputs[0],
        )

    def describe_node(self) -> str:
        desc = ", ".join(f"{k}={v}" for k, v in self.spec.table.describe().items())
        return f"StaticJoin[{self.spec.how}](on={list(self.spec.on)}, {desc})"


def joined_schema(
    left: pl.Schema, right: pl.Schema, on: Sequence[str], suffix: str = SUFFIX
) -> pl.Schema:
    """The output schema of a stream join: Polars' layout (the left columns, then
    the right's non-key columns, ``suffix``-ed on a clash)."""
    _, rename = output_columns(left, right, on, suffix)
    return pl.Schema({**left, **{out: right[name] for name, out in rename.items()}})


JOIN_NODES = (IntervalJoinNode, AggregateJoinNode, AsOfJoinNode, StaticJoinNode)
"""Every join node type."""


def stateful_nodes(plan: PlanNode) -> list[StatefulNode]:
    """The plan's stateful nodes in plan order (``plan.walk()``)."""
    return [node for node in plan.walk() if isinstance(node, StatefulNode)]


def is_aggregated(plan: PlanNode) -> bool:
    """True when ``plan`` contains a streaming aggregation (accumulating or
    discarding)."""
    return any(isinstance(node, AggregateNode | DiscardingAggregateNode) for node in plan.walk())


if not TYPE_CHECKING:  # mypy would take every missing name for a moved one
    __getattr__ = moved_names(
        __name__, {"WindowJoinNode": "microbatch.plan.nodes:AggregateJoinNode"}, version="0.2.0"
    )
    """``WindowJoinNode`` is ``AggregateJoinNode`` (``join_window`` builds an interval join)."""
