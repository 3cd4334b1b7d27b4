"""``Stream``: the user-facing, immutable, lazy description of a streaming query."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import polars as pl

from microbatch.aggregates import parse_aggregations
from microbatch.exceptions import PlanError
from microbatch.operators.base import OperatorContext
from microbatch.plan import (
    AggregateNode,
    DedupeNode,
    PlanNode,
    SourceNode,
    Step,
    StepNode,
    WatermarkNode,
    expr_step,
    map_batches_step,
)
from microbatch.sources.base import SourceContext
from microbatch.watermark import WatermarkSpec
from microbatch.windows import SessionWindowSpec, WindowSpec
from microbatch.writer import DataStreamWriter
from sinks.base import OutputMode, Sink
from sinks.delta import SchemaMode

IntoExpr = pl.Expr | str | Any


class Stream:
    """An unbounded table described by a plan; every method returns a new Stream.

    Nothing runs until a writer's ``start``. Stateless steps take Polars
    expressions and run on whole batches.
    """

    def __init__(self, plan: PlanNode, *, late_sink: Sink | None = None) -> None:
        self._plan = plan
        self._late_sink = late_sink

    @property
    def plan(self) -> PlanNode:
        """The logical plan this stream describes."""
        return self._plan

    @property
    def is_aggregated(self) -> bool:
        """True when the plan contains a streaming aggregation."""
        return any(getattr(node, "is_aggregation", False) for node in self._plan.walk())

    @property
    def late_sink(self) -> Sink | None:
        """Where rows that arrive after their window closed are written."""
        return self._late_sink

    def _then(self, step: Step) -> Stream:
        return self._with_plan(StepNode(self._plan, step))

    def _with_plan(self, plan: PlanNode) -> Stream:
        return Stream(plan, late_sink=self._late_sink)

    # ---------------------------------------------------------- event time

    def with_watermark(
        self,
        column: str,
        delay: str | int,
        *,
        idle_timeout: str | int | None = None,
        max_future_skew: str | int | None = None,
    ) -> Stream:
        """Declare ``column`` as event time, tolerating ``delay`` of disorder.

        Per source partition the candidate watermark is the max event time
        seen minus ``delay``; the watermark is the minimum over partitions
        that had rows within ``idle_timeout`` (processing time), and never
        moves backwards. Batch N uses the value computed after batch N-1.
        ``max_future_skew``: rows timestamped further than this ahead of the
        batch's processing time are processed but do not move the watermark.
        """
        return self._with_plan(
            WatermarkNode(
                self._plan, WatermarkSpec.parse(column, delay, idle_timeout, max_future_skew)
            )
        )

    def group_by(self, *keys: str | WindowSpec | SessionWindowSpec) -> GroupedStream:
        """Group by an optional ``mb.window``/``mb.session_window`` and key columns."""
        windows = [k for k in keys if isinstance(k, WindowSpec | SessionWindowSpec)]
        names = [k for k in keys if isinstance(k, str)]
        bad = [k for k in keys if not isinstance(k, str | WindowSpec | SessionWindowSpec)]
        if bad:
            raise PlanError(
                f"group_by takes column names and at most one mb.window(...) or "
                f"mb.session_window(...); got {bad!r}"
            )
        if len(windows) > 1:
            raise PlanError("group_by takes at most one window")
        return GroupedStream(self, windows[0] if windows else None, tuple(names))

    def drop_duplicates(self, subset: str | Sequence[str], *, within: str | int) -> Stream:
        """Keep the first row per ``subset`` key; forget a key once the watermark
        passes its event time + ``within`` (needs ``with_watermark`` before)."""
        from microbatch.durations import parse_duration_ms

        cols = (subset,) if isinstance(subset, str) else tuple(subset)
        marks = [n.spec for n in self._plan.walk() if isinstance(n, WatermarkNode)]
        if not marks:
            raise PlanError(
                "drop_duplicates(within=...) needs .with_watermark(col, delay) before it: "
                "without a watermark the keys seen would be kept forever"
            )
        if not cols:
            raise PlanError("drop_duplicates needs at least one column in subset")
        within_ms = parse_duration_ms(within, what="drop_duplicates within")
        return self._with_plan(DedupeNode(self._plan, cols, within_ms, marks[0].column))

    def on_late(self, sink: Sink) -> Stream:
        """Write rows that arrive after their window closed to ``sink`` (a side
        output, idempotent per batch id) with a ``late_reason`` column."""
        return Stream(self._plan, late_sink=sink)

    # ----------------------------------------------------------- stateless

    def select(self, *exprs: IntoExpr, **named: IntoExpr) -> Stream:
        """Keep/compute columns, as ``pl.LazyFrame.select``."""
        return self._then(expr_step("select", "select", exprs, named))

    def with_columns(self, *exprs: IntoExpr, **named: IntoExpr) -> Stream:
        """Add or replace columns, as ``pl.LazyFrame.with_columns``."""
        return self._then(expr_step("with_columns", "with_columns", exprs, named))

    def filter(self, *predicates: IntoExpr, **constraints: Any) -> Stream:
        """Keep rows matching all predicates, as ``pl.LazyFrame.filter``."""
        return self._then(expr_step("filter", "filter", predicates, constraints))

    def drop(self, *columns: str, strict: bool = True) -> Stream:
        """Remove columns."""
        return self._then(expr_step("drop", "drop", columns, {"strict": strict}))

    def rename(self, mapping: Mapping[str, str]) -> Stream:
        """Rename columns ``{old: new}``."""
        return self._then(expr_step("rename", "rename", (dict(mapping),), {}))

    def explode(self, columns: str | Sequence[str]) -> Stream:
        """One row per element of list column(s)."""
        cols = [columns] if isinstance(columns, str) else list(columns)
        return self._then(expr_step("explode", "explode", (cols,), {}))

    def map_batches(self, fn: Callable[[pl.DataFrame], pl.DataFrame]) -> Stream:
        """Apply ``fn`` to each whole batch (escape hatch; keep ``fn`` deterministic
        so replays give the same rows)."""
        if not callable(fn):
            raise PlanError(f"map_batches needs a function DataFrame -> DataFrame, got {fn!r}")
        return self._then(map_batches_step(fn))

    # ------------------------------------------------------------- writers

    def write_to(self, sink: Sink, *, output_mode: OutputMode = "append") -> DataStreamWriter:
        """Attach any :class:`sinks.Sink`."""
        return DataStreamWriter(self, sink, output_mode)

    def write_memory(self, name: str, *, output_mode: OutputMode = "append") -> DataStreamWriter:
        """Attach an in-process table readable with ``mb.table(name)``."""
        from sinks.memory import MemorySink

        return self.write_to(MemorySink(name), output_mode=output_mode)

    def write_console(
        self, *, num_rows: int = 20, output_mode: OutputMode = "append"
    ) -> DataStreamWriter:
        """Print each batch to stdout."""
        from sinks.console import ConsoleSink

        return self.write_to(ConsoleSink(num_rows=num_rows), output_mode=output_mode)

    def write_parquet(
        self,
        path: str | os.PathLike[str],
        *,
        output_mode: OutputMode = "append",
        partition_by: Sequence[str] | None = None,
    ) -> DataStreamWriter:
        """Write Parquet files plus a manifest keyed by batch id (exactly once);
        read the result with ``mb.read_parquet_output(path)``."""
        from sinks.parquet import ParquetSink

        sink = ParquetSink(path, partition_by=list(partition_by) if partition_by else None)
        return self.write_to(sink, output_mode=output_mode)

    def write_kafka(
        self,
        topic: str,
        *,
        bootstrap: str,
        key: str | pl.Expr | None = None,
        value_format: Literal["json", "raw"] = "json",
        headers: Mapping[str, str | pl.Expr] | None = None,
        mode: Literal["exactly_once", "at_least_once"] = "exactly_once",
        config: Mapping[str, Any] | None = None,
        output_mode: OutputMode = "append",
    ) -> DataStreamWriter:
        """Write each batch's rows to a Kafka topic, one JSON object (or raw value) per row.

        ``exactly_once``: one Kafka transaction per batch, with a marker that
        makes a replayed batch a no-op (consumers read with
        ``isolation.level=read_committed``). ``at_least_once``: records carry
        ``mb_query_id``/``mb_batch_id``/``mb_row`` headers for downstream
        dedupe. See :class:`sinks.kafka.KafkaSink`.
        """
        from sinks.kafka import KafkaSink

        sink = KafkaSink(
            topic,
            bootstrap=bootstrap,
            key=key,
            value_format=value_format,
            headers=headers,
            mode=mode,
            config=config,
        )
        return self.write_to(sink, output_mode=output_mode)

    def write_delta(
        self,
        path: str | os.PathLike[str],
        *,
        output_mode: OutputMode = "append",
        partition_by: str | Sequence[str] | None = None,
        merge_keys: str | Sequence[str] | None = None,
        storage_options: Mapping[str, str] | None = None,
        schema_mode: SchemaMode | None = None,
        optimize_every: int | None = None,
    ) -> DataStreamWriter:
        """Write to a Delta table, one commit per batch, exactly once.

        Every commit carries the app transaction ``(query id, batch id)``, so
        a replayed batch is a no-op. ``append`` appends, ``update`` MERGEs
        (upserts) by ``merge_keys`` (default: the window and group keys),
        ``complete`` overwrites. The table is created on the first batch; a
        batch whose schema differs is refused before anything is written
        unless ``schema_mode="merge"`` (additive evolution).
        ``optimize_every=N`` compacts small files every N batches. See
        :class:`sinks.delta.DeltaSink`.
        """
        from microbatch.writer import output_keys
        from sinks.delta import DeltaSink

        if output_mode == "update" and not merge_keys and not output_keys(self._plan):
            raise PlanError(
                "write_delta(output_mode='update') upserts by key, and this stream has no "
                "aggregation keys: pass merge_keys=[...], or use output_mode='append'"
            )
        sink = DeltaSink(
            path,
            partition_by=partition_by,
            merge_keys=merge_keys,
            storage_options=storage_options,
            schema_mode=schema_mode,
            optimize_every=optimize_every,
        )
        return self.write_to(sink, output_mode=output_mode)

    def foreach_batch(
        self, fn: Callable[[pl.DataFrame, int], None], *, output_mode: OutputMode = "append"
    ) -> DataStreamWriter:
        """Call ``fn(df, batch_id)`` per batch; make ``fn`` idempotent on batch_id."""
        from sinks.foreach import ForeachBatchSink

        return self.write_to(ForeachBatchSink(fn), output_mode=output_mode)

    # ---------------------------------------------------------- inspection

    def explain(self) -> str:
        """The plan as a tree, root first."""
        return self._plan.explain()

    def preview(self, n: int = 10) -> pl.DataFrame:
        """Run the plan on the first batch of each source, without a checkpoint.

        Returns at most ``n`` result rows. Reads only what one capped batch of
        each source holds, so it is cheap on large inputs. Stateless plans only
        (a stateful plan needs a query; use ``write_memory``).
        """
        if self.is_aggregated:
            raise PlanError(
                "preview() runs stateless plans; for an aggregation start a query with "
                "write_memory(name) and read mb.table(name)"
            )
        from microbatch.executor import BatchExecutor, input_frame

        inputs = {}
        for sid, source in enumerate(self._plan.sources()):
            source.open(SourceContext(str(sid), None))
            try:
                start = source.initial_offset()
                end = source.latest_offset(start)
                batch = source.read(start, end).data if source.compare(end, start) > 0 else None
                inputs[str(sid)] = input_frame(
                    source, batch if batch is not None else pl.DataFrame()
                )
            finally:
                source.close()
        ctx = OperatorContext(batch_id=0, watermark_ms=None, timestamp_ms=0)
        return BatchExecutor(self._plan).execute(inputs, ctx).head(n)

    def __repr__(self) -> str:
        return f"Stream(\n{self._plan.explain(1)}\n)"

    def _repr_html_(self) -> str:
        import html

        return f"<b>microbatch Stream</b><pre>{html.escape(self._plan.explain())}</pre>"


class GroupedStream:
    """``stream.group_by(...)``: call ``agg(...)`` to get the aggregated stream."""

    def __init__(
        self, stream: Stream, window: WindowSpec | SessionWindowSpec | None, keys: tuple[str, ...]
    ) -> None:
        self._stream = stream
        self._window = window
        self._keys = keys

    def agg(self, *aggs: pl.Expr | Sequence[pl.Expr]) -> Stream:
        """Aggregate incrementally; output columns ``window_start, window_end``
        (when windowed), the keys, then the aggregates."""
        specs = tuple(parse_aggregations(aggs))
        node = AggregateNode(self._stream.plan, self._window, self._keys, specs)
        return self._stream._with_plan(node)


def stream_of(source: Any) -> Stream:
    """A stream reading from ``source``."""
    return Stream(SourceNode(source))
