"""``Stream``: the user-facing, immutable, lazy description of a streaming query."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Literal

import polars as pl

from microbatch.api.writer import DataStreamWriter
from microbatch.engine.watermark import WatermarkSpec
from microbatch.exceptions import PlanError
from microbatch.operators.base import OperatorContext
from microbatch.plan.aggregates import parse_aggregations
from microbatch.plan.joins import (
    AsOfJoinSpec,
    IntervalJoinSpec,
    JoinHow,
    StaticHow,
    StaticJoinSpec,
    StaticTable,
    WindowJoinSpec,
    parse_how,
    parse_keys,
)
from microbatch.plan.nodes import (
    AggregateNode,
    AsOfJoinNode,
    DedupeNode,
    IntervalJoinNode,
    PlanNode,
    SourceNode,
    Step,
    StepNode,
    WatermarkNode,
    expr_step,
    is_aggregated,
    map_batches_step,
)
from microbatch.plan.windows import SessionWindowSpec, WindowSpec
from microbatch.sources.base import SourceContext
from sinks.base import OutputMode, Sink
from sinks.delta import SchemaMode
from sinks.kafka import DeliveryGuarantee

IntoExpr = pl.Expr | str | Any


class Stream:
    """An unbounded table described by a plan; every method returns a new Stream.

    Nothing runs until a writer's ``start``. Stateless steps take Polars
    expressions and run on whole batches.
    """

    def __init__(
        self,
        plan: PlanNode,
        *,
        late_sink: Sink | None = None,
        dead_letter_sink: Sink | None = None,
    ) -> None:
        self._plan = plan
        self._late_sink = late_sink
        self._dead_letter_sink = dead_letter_sink

    @property
    def plan(self) -> PlanNode:
        """The logical plan this stream describes."""
        return self._plan

    @property
    def is_aggregated(self) -> bool:
        """True when the plan contains a streaming aggregation."""
        return is_aggregated(self._plan)

    @property
    def late_sink(self) -> Sink | None:
        """Where rows that arrive after their window closed are written."""
        return self._late_sink

    @property
    def dead_letter_sink(self) -> Sink | None:
        """Where malformed input records go (``None``: ``chk/dead_letter/``)."""
        return self._dead_letter_sink

    def _then(self, step: Step) -> Stream:
        return self._with_plan(StepNode(self._plan, step))

    def _with_plan(self, plan: PlanNode) -> Stream:
        return Stream(plan, late_sink=self._late_sink, dead_letter_sink=self._dead_letter_sink)

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
        from microbatch.plan.durations import parse_duration_ms

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

    # --------------------------------------------------------------- joins

    def join_interval(
        self,
        other: Stream,
        *,
        on: str | Sequence[str],
        left_time: str,
        right_time: str | None = None,
        lower: str | float | timedelta | None = None,
        upper: str | float | timedelta | None = None,
        how: JoinHow = "inner",
    ) -> Stream:
        """Join with another stream: rows with equal ``on`` keys whose right time
        lies in ``[left_time + lower, left_time + upper]`` (both bounds inclusive).

        Both inputs need ``with_watermark``; each keeps its rows in state until
        the watermark (the minimum of both inputs') says no row arriving later
        can match them, then forgets them. A row whose time is at or before the
        watermark in force is late (counted, late output). ``how="left"``,
        ``"right"``, ``"full"`` emit a row that never matched, with nulls for
        the other side, once the watermark guarantees no match can arrive.
        Output columns as Polars' ``join``: this stream's columns, then the
        other's non-key columns (suffixed ``_right`` on a name clash).
        ``lower``/``upper``: signed durations (``"-10m"``, ``"0s"``) or seconds.

        Examples
        --------
        >>> clicks = mb.read_memory(schema={"user": pl.Int64, "ts": pl.Datetime("ms")})
        >>> pays = mb.read_memory(schema={"user": pl.Int64, "ts": pl.Datetime("ms")})
        >>> joined = clicks.with_watermark("ts", "1m").join_interval(
        ...     pays.with_watermark("ts", "1m"), on="user", left_time="ts",
        ...     lower="0s", upper="10m")
        """
        from microbatch.plan.nodes import IntervalJoinNode

        spec = IntervalJoinSpec.parse(
            on,
            left_time=left_time,
            right_time=right_time or left_time,
            lower=lower,
            upper=upper,
            how=how,
        )
        self._check_join_inputs(other, "join_interval", watermarks=True)
        return self._joined(other, IntervalJoinNode(self._plan, other.plan, spec))

    def join_window(
        self,
        other: Stream,
        *,
        on: str | Sequence[str],
        window: WindowSpec,
        how: JoinHow = "inner",
    ) -> Stream:
        """Window join: pairs of rows with equal ``on`` keys that fall in the same
        event-time ``window`` (``mb.window(col, size[, slide])``; ``col`` must be
        a column of both streams).

        Output: ``window_start``, ``window_end``, the keys, this stream's other
        columns, the other stream's (``_right`` on a clash). A pair is emitted
        as soon as both rows are there; with ``how="left"|"right"|"full"`` a row
        without partner in its window is emitted (nulls for the other side) when
        the watermark closes the window. A row is late when its window is
        closed (``window_end <= watermark``); state is released as windows close.
        Built on :meth:`join_interval` (equal windows, zero-width interval).
        """
        if not isinstance(window, WindowSpec):
            raise PlanError(
                "join_window needs window=mb.window(column, size[, slide]) (session windows "
                f"differ per key and cannot pair two streams); got {window!r}"
            )
        if window.allowed_lateness_ms:
            raise PlanError("join_window does not support allowed_lateness")
        keys = parse_keys(on, what="join_window")
        step = window_columns_step(window)
        left, right = self._then(step), other._then(step)
        win = ("window_start", "window_end")
        joined = left.join_interval(
            right,
            on=[*win, *keys],
            left_time="window_end",
            right_time="window_end",
            lower=0,
            upper=0,
            how=how,
        )
        return joined.select(*win, *keys, pl.exclude(*win, *keys))

    def join(self, other: Stream, *, on: str | Sequence[str], how: JoinHow = "inner") -> Stream:
        """Join two windowed aggregations per window: ``on`` must include
        ``window_start`` (and any group keys to match).

        Both streams must end in ``group_by(mb.window(...), ...).agg(...)`` over
        the same window, and the query must run in append mode: each window's
        row is then final when emitted, and both inputs emit a window in the
        same batch (the first whose watermark passes its end), so the join
        needs no state of its own. Output as Polars' ``join`` (keys coalesced).
        For raw streams use :meth:`join_interval` or :meth:`join_window`; for a
        table, :meth:`join_static`.
        """
        from microbatch.plan.nodes import WindowJoinNode

        keys = parse_keys(on, what="join")
        how = parse_how(how, ("inner", "left", "right", "full"), what="join")  # type: ignore[assignment]
        windows = [_window_of(s.plan, side) for s, side in ((self, "left"), (other, "right"))]
        if windows[0] != windows[1]:
            raise PlanError(
                f"join: the two aggregations use different windows ({windows[0].describe()} and "
                f"{windows[1].describe()}); a per-window join needs the same window on both"
            )
        if windows[0].allowed_lateness_ms:
            raise PlanError(
                "join: windowed aggregations with allowed_lateness re-emit windows (revisions); "
                "join them without allowed_lateness"
            )
        if not {"window_start", "window_end"} & set(keys):
            raise PlanError(
                f"join: on={list(keys)} must include 'window_start' so that rows of the same "
                "window are joined (windows of different times never meet in one batch)"
            )
        self._check_join_inputs(other, "join", watermarks=True)
        node = WindowJoinNode(self._plan, other.plan, WindowJoinSpec(keys, how))
        return self._joined(other, node)

    def join_static(
        self,
        other: pl.DataFrame | str | os.PathLike[str],
        *,
        on: str | Sequence[str],
        how: StaticHow = "inner",
        storage_options: Mapping[str, str] | None = None,
    ) -> Stream:
        """Enrich each batch from a static table: a ``pl.DataFrame``, a Parquet file
        or directory, or a Delta table path.

        Once per batch the table is checked for a change (Delta: a new
        version; Parquet: files added, removed or rewritten) and re-read only
        then. ``how="inner"`` or ``"left"``; output as Polars' ``join``. No
        state; a batch re-run after a crash uses the Delta version it used
        the first time.
        """
        from microbatch.plan.nodes import StaticJoinNode

        keys = parse_keys(on, what="join_static")
        how = parse_how(how, ("inner", "left"), what="join_static")  # type: ignore[assignment]
        table = StaticTable.of(other, dict(storage_options) if storage_options else None)
        return self._with_plan(StaticJoinNode(self._plan, StaticJoinSpec(table, keys, how)))

    def join_asof_table(
        self,
        dim: Stream,
        *,
        on: str | Sequence[str],
        time: str,
        dim_time: str = "valid_from",
        how: StaticHow = "left",
    ) -> Stream:
        """Temporal join: each row gets the ``dim`` version of its key valid at its
        ``time`` — the latest with ``dim_time <= time`` (Polars ``join_asof``,
        backward).

        ``dim`` is a changelog stream of upserts (key, ``dim_time``, values),
        e.g. CDC from ``mb.read_delta``. Both inputs need ``with_watermark``.
        A row is held in state until the watermark (the minimum of both
        inputs') reaches its time — only then can no earlier-valid version
        still arrive — and is emitted then, so the output waits for the
        dimension's watermark. Versions superseded before the watermark are
        dropped. ``how="left"`` keeps rows without a version (nulls),
        ``"inner"`` drops them.
        """
        from microbatch.plan.nodes import AsOfJoinNode

        keys = parse_keys(on, what="join_asof_table")
        how = parse_how(how, ("inner", "left"), what="join_asof_table")  # type: ignore[assignment]
        for name, col in (("time", time), ("dim_time", dim_time)):
            if not isinstance(col, str) or not col:
                raise PlanError(f"join_asof_table needs {name}=<column name>, got {col!r}")
        self._check_join_inputs(dim, "join_asof_table", watermarks=True)
        spec = AsOfJoinSpec(keys, time, dim_time, how)
        return self._joined(dim, AsOfJoinNode(self._plan, dim.plan, spec))

    def _check_join_inputs(self, other: Stream, what: str, *, watermarks: bool) -> None:
        if not isinstance(other, Stream):
            raise PlanError(f"{what} joins two streams; got {type(other).__name__}")
        shared = {id(s) for s in self._plan.sources()} & {id(s) for s in other.plan.sources()}
        if shared:
            raise PlanError(
                f"{what}: both inputs read the same source object. For a self-join, create "
                "the source twice (e.g. two mb.read_files(...) over the same directory)."
            )
        if not watermarks:
            return
        for stream, side in ((self, "left"), (other, "right")):
            if not any(isinstance(n, WatermarkNode) for n in stream.plan.walk()):
                raise PlanError(
                    f"{what}: the {side} input has no watermark. A stream-stream join keeps "
                    "each input's rows until the watermark says no match can arrive; without "
                    "a watermark on both inputs its state would grow forever. Add "
                    f".with_watermark(<event-time column>, delay) to the {side} input."
                )

    def _joined(self, other: Stream, node: PlanNode) -> Stream:
        return Stream(
            node,
            late_sink=self._late_sink or other.late_sink,
            dead_letter_sink=self._dead_letter_sink or other.dead_letter_sink,
        )

    def on_late(self, sink: Sink) -> Stream:
        """Write rows that arrive after their window closed to ``sink`` (a side
        output, idempotent per batch id) with a ``late_reason`` column."""
        return Stream(self._plan, late_sink=sink, dead_letter_sink=self._dead_letter_sink)

    def on_dead_letters(self, sink: Sink) -> Stream:
        """Write malformed input records (with their source location and the
        reason) to ``sink`` instead of the checkpoint's ``dead_letter/``
        directory (a side output, idempotent per batch id)."""
        return Stream(self._plan, late_sink=self._late_sink, dead_letter_sink=sink)

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
        return DataStreamWriter(
            self._plan,
            sink,
            output_mode,
            dead_letter=self._dead_letter_sink,
            late_sink=self._late_sink,
        )

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
        partition_by: str | Sequence[str] | None = None,
    ) -> DataStreamWriter:
        """Write Parquet files plus a manifest keyed by batch id (exactly once);
        read the result with ``mb.parquet_table(path)``."""
        from sinks.parquet import ParquetSink

        sink = ParquetSink(path, partition_by=partition_by)
        return self.write_to(sink, output_mode=output_mode)

    def write_kafka(
        self,
        topic: str,
        *,
        bootstrap: str,
        key: str | pl.Expr | None = None,
        format: Literal["json", "raw"] = "json",
        headers: Mapping[str, str | pl.Expr] | None = None,
        delivery_guarantee: DeliveryGuarantee = "exactly_once",
        config: Mapping[str, Any] | None = None,
        output_mode: OutputMode = "append",
        value_format: Literal["json", "raw"] | None = None,
        mode: DeliveryGuarantee | None = None,
    ) -> DataStreamWriter:
        """Write each batch's rows to a Kafka topic, one JSON object (or raw value) per row.

        ``delivery_guarantee="exactly_once"``: one Kafka transaction per batch,
        with a marker that makes a replayed batch a no-op (consumers read with
        ``isolation.level=read_committed``). ``"at_least_once"``: records carry
        ``mb_query_id``/``mb_batch_id``/``mb_row`` headers for downstream
        dedupe. ``value_format`` and ``mode`` are the deprecated names of
        ``format`` and ``delivery_guarantee``. See :class:`sinks.kafka.KafkaSink`.
        """
        from sinks.kafka import KafkaSink

        sink = KafkaSink(
            topic,
            bootstrap=bootstrap,
            key=key,
            format=format,
            headers=headers,
            delivery_guarantee=delivery_guarantee,
            config=config,
            value_format=value_format,
            mode=mode,
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
        from microbatch.api.writer import output_keys
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
        if self.is_aggregated or any(
            isinstance(n, IntervalJoinNode | AsOfJoinNode) for n in self._plan.walk()
        ):
            raise PlanError(
                "preview() runs stateless plans; for an aggregation or a stream-stream join "
                "start a query with write_memory(name) and read mb.table(name)"
            )
        from microbatch.engine.executor import BatchExecutor, input_frame

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


def _window_of(plan: PlanNode, side: str) -> WindowSpec:
    """The window of the aggregation a ``join`` input ends in (through stateless steps)."""
    node = plan
    while isinstance(node, StepNode | WatermarkNode):
        node = node.child
    if isinstance(node, AggregateNode) and isinstance(node.window, WindowSpec):
        return node.window
    raise PlanError(
        f"join: the {side} input is not a windowed aggregation "
        "(group_by(mb.window(...), ...).agg(...)). join() pairs two aggregations per window; "
        "join raw streams with join_interval(...) or join_window(...), and a table with "
        "join_static(...)"
    )


def window_columns_step(window: WindowSpec) -> Step:
    """A step adding ``window_start``/``window_end`` of ``window`` (one row per window
    a row falls in), typed like the window's column."""
    from microbatch.engine.watermark import event_time_ms
    from microbatch.operators.window_agg import _ms_to
    from microbatch.plan.windows import assign_windows

    def apply(lf: pl.LazyFrame) -> pl.LazyFrame:
        schema = lf.collect_schema()
        dtype = schema.get(window.column)
        if dtype is None:
            raise PlanError(
                f"join_window: window column {window.column!r} is not a column of the input; "
                f"it has {list(schema)}"
            )
        t = event_time_ms(window.column, schema)
        assigned = assign_windows(lf.with_columns(t.alias("__mb_t")), window, "__mb_t")
        return assigned.with_columns(
            _ms_to(pl.col("__ws"), dtype).alias("window_start"),
            _ms_to(pl.col("__ws") + window.size_ms, dtype).alias("window_end"),
        ).drop("__ws", "__mb_t")

    return Step("window_columns", (window.describe(),), apply)


def stream_of(source: Any) -> Stream:
    """A stream reading from ``source``."""
    return Stream(SourceNode(source))
