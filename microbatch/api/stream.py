"""``Stream``: the user-facing, immutable, lazy description of a streaming query."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Literal

import polars as pl

from microbatch.api.writer import DataStreamWriter
from microbatch.durations import parse_duration_ms
from microbatch.exceptions import ChangelogInputError, PlanError, SQLError
from microbatch.operators.base import OperatorContext
from microbatch.plan.aggregates import parse_aggregations
from microbatch.plan.changelog_inputs import (
    changelog_filter,
    is_changelog_schema,
    relabel_filtered,
    selects_change_types,
)
from microbatch.plan.event_time import WatermarkSpec
from microbatch.plan.joins import (
    AsOfJoinSpec,
    IntervalJoinSpec,
    StaticJoinSpec,
    StaticTable,
    parse_how,
    parse_keys,
)
from microbatch.plan.nodes import (
    AggregateNode,
    AsOfJoinNode,
    DedupeNode,
    DiscardingAggregateNode,
    FireOnceNode,
    IntervalJoinNode,
    PlanNode,
    ProcessingTimeNode,
    SourceNode,
    Step,
    StepNode,
    TransformNode,
    WatermarkNode,
    expr_step,
    is_aggregated,
    map_batches_step,
)
from microbatch.plan.schemas import check_columns, column_name, output_schema
from microbatch.plan.stateful import StateInput, StateOutput, TransformSpec
from microbatch.plan.windows import SessionWindowSpec, WindowSpec
from microbatch.sources.base import SourceContext
from microbatch.types import AccumulationMode, JoinHow, OutputMode, StaticHow
from sinks.base import Sink
from sinks.kafka import DeliveryGuarantee
from sinks.schema_check import SchemaMode

IntoExpr = pl.Expr | str | Any
_EMIT_OF = {
    "append": "write EMIT ON WINDOW CLOSE",
    "update": "write EMIT ON UPDATE",
    "changelog": "write EMIT CHANGES",
}


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
        self._sql: str | None = None  # the SQL text this stream was built from (mb.sql)
        self._emit: tuple[OutputMode, str, int, int] | None = None
        """SQL's ``EMIT``: (the output mode, the clause, its line, its column)."""

    @property
    def plan(self) -> PlanNode:
        """The logical plan this stream describes."""
        return self._plan

    @property
    def is_aggregated(self) -> bool:
        """True when the plan contains a streaming aggregation."""
        return is_aggregated(self._plan)

    @property
    def emit_mode(self) -> OutputMode | None:
        """The output mode a SQL ``EMIT`` clause chose (``None``: no clause), which
        every writer uses when it is given no ``output_mode``."""
        return self._emit[0] if self._emit is not None else None

    def _output_mode(self, output_mode: OutputMode | None) -> OutputMode:
        """The writer's output mode: the one given, else the ``EMIT`` clause's, else
        ``append``; a given one that contradicts the ``EMIT`` clause is refused."""
        if self._emit is None:
            return output_mode or "append"
        emit, clause, line, column = self._emit
        if output_mode is not None and output_mode != emit:
            raise SQLError(
                f"the query's {clause} writes in output_mode={emit!r}, but the writer "
                f"was given output_mode={output_mode!r}.",
                line=line,
                column=column,
                construct=clause,
                fix="Drop output_mode= from the writer (the EMIT clause chooses it), or "
                + _EMIT_OF.get(output_mode, "drop the EMIT clause")
                + " in the query (docs/sql.md, EMIT).",
            )
        return emit

    @property
    def late_sink(self) -> Sink | None:
        """Where rows that arrive after their window closed are written."""
        return self._late_sink

    @property
    def dead_letter_sink(self) -> Sink | None:
        """Where malformed input records go (``None``: ``chk/dead_letter/``)."""
        return self._dead_letter_sink

    @property
    def schema(self) -> pl.Schema:
        """The columns and types of this stream's rows, known when it is built.

        Derived from the source's declared schema through every step (Polars'
        lazy schema resolution; nothing is read). Like ``LazyFrame.collect_schema()``.

        Raises
        ------
        PlanError
            When the schema is known only once a batch runs: a source without a
            declared schema (pass ``schema=`` to the reader), or ``map_batches``
            without ``schema=``.

        Examples
        --------
        >>> tx = mb.read_memory(schema={"card": pl.Int64, "amount": pl.Float64})
        >>> tx.with_columns(big=pl.col("amount") > 100).schema
        Schema([('card', Int64), ('amount', Float64), ('big', Boolean)])
        """
        schema = output_schema(self._plan)
        if schema is None:
            raise PlanError(
                "this stream's schema is known only when a batch runs: "
                f"{_why_schema_unknown(self._plan)}"
            )
        return schema

    def collect_schema(self) -> pl.Schema:
        """The stream's schema (:attr:`schema`), as ``LazyFrame.collect_schema()``."""
        return self.schema

    @property
    def columns(self) -> list[str]:
        """The stream's column names (:attr:`schema`)."""
        return list(self.schema)

    def _known_schema(self) -> pl.Schema | None:
        """The schema when known at build time (``None``: checks wait for a batch)."""
        return output_schema(self._plan)

    def _then(self, step: Step) -> Stream:
        return self._with_plan(StepNode(self._plan, step))

    def _with_plan(self, plan: PlanNode) -> Stream:
        output_schema(plan)  # refuses a misspelled column or a wrong type now
        stream = Stream(plan, late_sink=self._late_sink, dead_letter_sink=self._dead_letter_sink)
        stream._emit = self._emit  # a step after a SQL query keeps its EMIT choice
        return stream

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
        Windows, sessions, joins and ``drop_duplicates`` use the watermark to
        close state and to tell late rows.

        Parameters
        ----------
        column
            The event-time column: a Datetime, a Date, or an integer of epoch
            milliseconds.
        delay
            How far behind the newest event time a row may arrive and still be on
            time: a duration string (``"10s"``), seconds, or a ``timedelta``.
        idle_timeout
            A partition without rows for this long (processing time) stops holding
            the watermark back (``None``: partitions never go idle).
        max_future_skew
            Rows timestamped further than this ahead of the batch's processing time
            are processed but do not move the watermark.

        Returns
        -------
        Stream

        Examples
        --------
        >>> from datetime import UTC, datetime
        >>> events = pl.DataFrame(
        ...     {"ts": [datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC) for s in (5, 30, 20)]}
        ... )
        >>> stream = mb.read_memory(events, name="events").with_watermark("ts", "10s")
        >>> print(stream.explain())
        Watermark(ts, delay=10000ms)
          Source[memory](name=events)
        >>> query = stream.write_memory("doc_with_watermark").start(trigger="available-now")
        >>> query.await_termination()
        True

        The newest event time (00:00:30) minus the delay:

        >>> datetime.fromtimestamp(query.last_progress["next_watermark_ms"] / 1000, UTC)
        datetime.datetime(2026, 1, 1, 0, 0, 20, tzinfo=datetime.timezone.utc)
        """
        return self._with_plan(
            WatermarkNode(
                self._plan, WatermarkSpec.parse(column, delay, idle_timeout, max_future_skew)
            )
        )

    def with_processing_time(self, column: str = "proc_time") -> Stream:
        """Add ``column``: the time the batch is processed at, as the stream's time
        attribute (Flink's ``PROCTIME()``, Spark's ``current_timestamp()``).

        Every row of batch N gets the processing timestamp recorded in its
        write-ahead entry ``offsets/N`` (a ``Datetime("ms", "UTC")``), so a
        re-run of the batch after a crash, or a replay of the checkpoint, gives
        the same value, never the clock of the re-run. The column is the
        stream's time attribute too: its watermark is the batch's own time
        (delay 0), so ``group_by(mb.window(column, ...))`` groups rows by the
        minute (or any window) they were processed in; a row is never late, and
        a window is emitted by the first batch whose time is at or past its end
        — on an idle stream, the no-data batch the trigger runs once the
        clock passes the end. If the clock steps back, the value is raised to
        the watermark in force (the previous batch's time): it never goes back.

        Parameters
        ----------
        column
            The name of the new column; refused if the stream already has one.

        Returns
        -------
        Stream

        Examples
        --------
        >>> from microbatch.testing import StreamTest
        >>> t = StreamTest(
        ...     lambda src: src.with_processing_time("proc_time")
        ...     .group_by(mb.window("proc_time", "1m")).agg(pl.len().alias("n")),
        ...     schema={"v": pl.Int64},
        ... )
        >>> _ = t.add({"v": [1, 2]}).advance_clock(30).process()  # 00:00:30
        >>> _ = t.add({"v": [3]}).advance_clock(20).process()     # 00:00:50
        >>> t.advance_clock(15).process()  # 00:01:05: an idle batch closes the minute
        shape: (1, 3)
        ┌─────────────────────────┬─────────────────────────┬─────┐
        │ window_start            ┆ window_end              ┆ n   │
        │ ---                     ┆ ---                     ┆ --- │
        │ datetime[ms, UTC]       ┆ datetime[ms, UTC]       ┆ i64 │
        ╞═════════════════════════╪═════════════════════════╪═════╡
        │ 2026-01-01 00:00:00 UTC ┆ 2026-01-01 00:01:00 UTC ┆ 3   │
        └─────────────────────────┴─────────────────────────┴─────┘
        """
        if not isinstance(column, str) or not column:
            raise PlanError(f"with_processing_time needs a column name, got {column!r}")
        spec = WatermarkSpec(column, 0, processing_time=True)
        return self._with_plan(ProcessingTimeNode(self._plan, spec))

    def group_by(
        self,
        *keys: str | pl.Expr | WindowSpec | SessionWindowSpec | Sequence[str | pl.Expr],
        ttl: str | float | None = None,
        accumulation_mode: AccumulationMode = "accumulating",
    ) -> GroupedStream:
        """Group by an optional ``mb.window``/``mb.session_window`` and key columns.

        Call :meth:`GroupedStream.agg` on the result. A windowed aggregation
        emits a window's row once the watermark passes its end (append mode), so
        it needs ``with_watermark`` on the window's column before it; without a
        window a key's result is never final, so the query must run in the
        ``"update"`` or ``"complete"`` output mode.

        Parameters
        ----------
        *keys
            Column names (or ``pl.col(name)``, or a list of them, as Polars takes),
            and at most one ``mb.window(...)`` or ``mb.session_window(...)``.
            To group by a computed value, add it as a column first with
            :meth:`with_columns`.
        ttl
            Without a window: forget a key's state this long (of processing time,
            the batches' recorded timestamps) after its last update, so a key space
            that grows forever keeps bounded state (``"1d"``). A later row of the key
            starts afresh. Windowed state is bounded by the watermark instead.
            Refused over a changelog input (its partials must stay to be retracted).
        accumulation_mode
            Beam's ``AccumulationMode``. ``"accumulating"`` (default): each group's
            running value. ``"discarding"`` (Beam's ``.discardingFiredPanes()``):
            per batch, one row per (window, keys) the batch touched with only that
            batch's increment, for sinks that add (a counter service, a ledger);
            the increments of a group add up to its accumulated value over the
            rows that were not late. Only ``pl.len()``, ``count`` and ``sum``; no
            session window, no ``ttl`` (nothing is kept); ``output_mode="append"``
            only. Over a changelog input (``_change_type``, no window) deletes
            and update preimages subtract. See docs/semantics.md, "Refinements:
            accumulate, retract, discard".

        Returns
        -------
        GroupedStream

        Raises
        ------
        PlanError
            For a key that is neither a column name nor a window, or more than
            one window; :class:`~microbatch.UnknownColumnError` for a key the
            stream does not have (when its schema is known).

        Notes
        -----
        Over a changelog input (the schema holds ``_change_type``, e.g.
        ``mb.read_delta(path, changes=True)``) a windowless ``group_by`` retracts
        (see :meth:`GroupedStream.agg`); windows and sessions are refused with
        :class:`~microbatch.ChangelogInputError`, since they treat each row as an
        event.

        Examples
        --------
        Counts per key and 1-minute window, emitted when the window closes:

        >>> from datetime import datetime
        >>> times = [(0, 5), (0, 30), (0, 45), (1, 10), (2, 30)]
        >>> events = pl.DataFrame(
        ...     {
        ...         "ts": [datetime(2026, 1, 1, 0, m, s) for m, s in times],
        ...         "k": ["a", "b", "a", "a", "b"],
        ...     }
        ... )
        >>> query = (
        ...     mb.read_memory(events)
        ...     .with_watermark("ts", "10s")
        ...     .group_by(mb.window("ts", "1m"), "k")
        ...     .agg(pl.len().alias("n"))
        ...     .write_memory("doc_group_by_window")
        ...     .start(trigger="available-now")
        ... )
        >>> query.await_termination()
        True
        >>> out = mb.table("doc_group_by_window").sort("window_start", "k")
        >>> out.select(pl.col("window_start").dt.strftime("%H:%M"), "k", "n").rows()
        [('00:00', 'a', 2), ('00:00', 'b', 1), ('00:01', 'a', 1)]

        Without a window, in update mode (one row per key, the newest result):

        >>> query = (
        ...     mb.read_memory(events, max_records_per_batch=2)
        ...     .group_by("k")
        ...     .agg(pl.len().alias("n"))
        ...     .write_memory("doc_group_by_keys", output_mode="update")
        ...     .start(trigger="available-now")
        ... )
        >>> query.await_termination()
        True
        >>> mb.table("doc_group_by_keys").sort("k").rows()
        [('a', 3), ('b', 2)]

        Discarding: each batch's increment, in append mode; a sink that adds them
        up holds the counts:

        >>> query = (
        ...     mb.read_memory(events, max_records_per_batch=2)
        ...     .group_by("k", accumulation_mode="discarding")
        ...     .agg(pl.len().alias("n"))
        ...     .write_memory("doc_group_by_discarding")
        ...     .start(trigger="available-now")
        ... )
        >>> query.await_termination()
        True
        >>> increments = mb.table("doc_group_by_discarding")
        >>> increments.rows()  # batches [a, b], [a, a], [b]
        [('a', 1), ('b', 1), ('a', 2), ('b', 1)]
        >>> increments.group_by("k").agg(pl.col("n").sum()).sort("k").rows()
        [('a', 3), ('b', 2)]
        """
        keys = tuple(_flatten_keys(keys))
        windows = [k for k in keys if isinstance(k, WindowSpec | SessionWindowSpec)]
        names = [column_name(k, "group_by") for k in keys if isinstance(k, str | pl.Expr)]
        bad = [k for k in keys if not isinstance(k, str | pl.Expr | WindowSpec | SessionWindowSpec)]
        if bad:
            raise PlanError(
                f"group_by takes column names (or pl.col(...)) and at most one mb.window(...) "
                f"or mb.session_window(...); got {bad!r}"
            )
        check_columns(self._known_schema(), names, "group_by")
        if len(windows) > 1:
            raise PlanError("group_by takes at most one window")
        ttl_ms = None if ttl is None else parse_duration_ms(ttl, what="group_by ttl")
        if ttl_ms is not None and windows:
            raise PlanError(
                "group_by(ttl=...) bounds the state of keys without a window; windowed state "
                "is already bounded by the watermark (see mb.window(..., allowed_lateness=))"
            )
        if accumulation_mode not in ("accumulating", "discarding"):
            raise PlanError(
                f"group_by(accumulation_mode={accumulation_mode!r}): use 'accumulating' (the "
                "default: running values) or 'discarding' (each batch's increment)"
            )
        if accumulation_mode == "discarding" and (
            ttl_ms is not None or isinstance(windows[0] if windows else None, SessionWindowSpec)
        ):
            raise PlanError(
                "group_by(..., accumulation_mode='discarding') keeps no state, so it takes no "
                "ttl=, and it refuses mb.session_window(...): a session's identity (its start "
                "and end) changes as sessions merge, so its increments would not add up to "
                "one row. Use mb.window(...) or no window for increments, or "
                "accumulation_mode='accumulating' with output_mode='changelog' for sessions."
            )
        return GroupedStream(
            self,
            windows[0] if windows else None,
            tuple(names),
            ttl_ms=ttl_ms,
            accumulation_mode=accumulation_mode,
        )

    def fire_once(self, condition: pl.Expr, *, corrections: bool = False) -> Stream:
        """Fire a rule on a windowed aggregation once per window, as early as it holds.

        The aggregation below emits a window's row in every batch that changes
        it (early firing, as Spark's ``update`` mode); ``fire_once`` passes a
        row on in the batch where ``condition`` first holds for its window and
        keys, and never again for that window: a rule such as "3 or more
        payments per card and minute" alerts when the third payment arrives, not
        when the minute closes, and not again at the fourth. With the window's
        ``allowed_lateness``, rows arriving that late still count and can fire
        their old window; later rows go to the late output. The result is an
        append stream: each (window, keys) appears once, across crashes and
        replays.

        For a condition that stays true once it holds while a window grows
        (counts, maxima, sums of positive amounts against a bound), the windows
        that fire are exactly those of the one-shot result over the rows that
        were not late, whatever the batches.

        Parameters
        ----------
        condition
            A boolean Polars expression over the aggregated columns
            (``window_start``, ``window_end``, the keys, the aggregates).
        corrections
            Also emit every later change of a window that fired, with a
            ``revision`` column (0 for the firing, then 1, 2...): a sink that
            upserts by the window's key then holds the final values.

        Returns
        -------
        Stream

        Raises
        ------
        PlanError
            When the stream is not a ``group_by(mb.window(...), ...).agg(...)``.

        Examples
        --------
        >>> from datetime import datetime, UTC
        >>> def at(s): return datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC)
        >>> pays = mb.read_memory(schema={"card": pl.Int64, "ts": pl.Datetime("ms", "UTC")},
        ...                       max_records_per_batch=1)  # one payment per batch
        >>> _ = pays.add({"card": [7, 7, 7, 7], "ts": [at(1), at(2), at(3), at(4)]})
        >>> alerts = (
        ...     pays.with_watermark("ts", "10s")
        ...     .group_by(mb.window("ts", "1m"), "card")
        ...     .agg(pl.len().alias("n"))
        ...     .fire_once(pl.col("n") >= 3)
        ... )
        >>> q = alerts.write_memory("doc_fire_once").start(trigger="available-now")
        >>> q.await_termination()
        True
        >>> mb.table("doc_fire_once").select("card", "n").rows()  # at the 3rd, not the 4th
        [(7, 3)]
        """
        node = self._plan
        window = node.window if isinstance(node, AggregateNode) else None
        if not isinstance(window, WindowSpec):
            raise PlanError(
                "fire_once(condition) goes right after group_by(mb.window(col, size), "
                "*keys).agg(...): it fires once per window, so it needs a tumbling or "
                f"hopping window (got {node.label()})"
            )
        if not isinstance(condition, pl.Expr):
            raise PlanError(
                f"fire_once needs a boolean Polars expression such as pl.col('n') >= 3, "
                f"got {condition!r}"
            )
        assert isinstance(node, AggregateNode)
        return self._with_plan(FireOnceNode(node, condition, corrections))

    def drop_duplicates(
        self,
        subset: str | Sequence[str],
        *,
        within: str | float | None = None,
        ttl: str | float | None = None,
    ) -> Stream:
        """Keep the first row per ``subset`` key; forget a key once the watermark
        passes its event time + ``within`` (needs ``with_watermark`` before), or,
        with ``ttl`` instead, ``ttl`` of processing time after it was kept.

        Parameters
        ----------
        subset
            The column, or columns, whose values identify a duplicate.
        within
            How long after a key's event time a duplicate may still arrive: a
            duration string (``"1h"``), seconds, or a ``timedelta``. Bounds the
            state: the keys seen are kept only that long.
        ttl
            Instead of ``within``, without a watermark: remember a kept key this
            long after the recorded timestamp of the batch that kept it (request
            ids, message ids: keys that never come back after a while). Give
            exactly one of ``within`` and ``ttl``.

        Returns
        -------
        Stream

        Raises
        ------
        PlanError
            With ``within`` but no ``with_watermark`` before it, with neither or
            both of ``within`` and ``ttl`` (the keys seen would be kept forever),
            or with an empty ``subset``.

        Examples
        --------
        >>> from datetime import datetime
        >>> events = pl.DataFrame(
        ...     {
        ...         "id": [1, 2, 1, 3, 2],
        ...         "ts": [datetime(2026, 1, 1, 0, 0, s) for s in (1, 2, 3, 4, 5)],
        ...     }
        ... )
        >>> query = (
        ...     mb.read_memory(events, max_records_per_batch=2)
        ...     .with_watermark("ts", "10s")
        ...     .drop_duplicates("id", within="1m")
        ...     .write_memory("doc_drop_duplicates")
        ...     .start(trigger="available-now")
        ... )
        >>> query.await_termination()
        True
        >>> mb.table("doc_drop_duplicates")["id"].to_list()
        [1, 2, 3]

        Request ids that never come back after a day, without event time:

        >>> requests = mb.read_memory(pl.DataFrame({"request_id": ["a", "b", "a"]}))
        >>> query = (
        ...     requests.drop_duplicates("request_id", ttl="1d")
        ...     .write_memory("doc_drop_duplicates_ttl")
        ...     .start(trigger="available-now")
        ... )
        >>> query.await_termination()
        True
        >>> mb.table("doc_drop_duplicates_ttl")["request_id"].to_list()
        ['a', 'b']
        """
        from microbatch.durations import parse_duration_ms

        cols = (subset,) if isinstance(subset, str) else tuple(subset)
        if not cols:
            raise PlanError("drop_duplicates needs at least one column in subset")
        check_columns(self._known_schema(), cols, "drop_duplicates subset")
        if (within is None) == (ttl is None):
            raise PlanError(
                "drop_duplicates needs exactly one bound on the keys it remembers: "
                "within=... (event time, with a watermark) or ttl=... (processing time); "
                "without one they would be kept forever"
            )
        if ttl is not None:
            ttl_ms = parse_duration_ms(ttl, what="drop_duplicates ttl")
            return self._with_plan(DedupeNode(self._plan, cols, None, None, ttl_ms))
        marks = [n.spec for n in self._plan.walk() if isinstance(n, WatermarkNode)]
        if not marks:
            raise PlanError(
                "drop_duplicates(within=...) needs .with_watermark(col, delay) before it: "
                "without a watermark the keys seen would be kept forever (or use ttl=...)"
            )
        assert within is not None
        within_ms = parse_duration_ms(within, what="drop_duplicates within")
        return self._with_plan(DedupeNode(self._plan, cols, within_ms, marks[0].column))

    def unique(
        self,
        subset: str | pl.Expr | Sequence[str | pl.Expr] | None = None,
        *,
        keep: Literal["first", "any"] = "first",
        maintain_order: bool = True,
        within: str | float | None = None,
        ttl: str | float | None = None,
    ) -> Stream:
        """Polars' ``unique`` on a stream: :meth:`drop_duplicates` under the name a
        Polars user reaches for. The first row of each key passes, in arrival
        order; the keys seen are remembered ``within`` event time (with a
        watermark) or for ``ttl`` of processing time.

        Parameters
        ----------
        subset
            The key column(s) (names or ``pl.col``); ``None``: every column.
        keep
            ``"first"`` (or ``"any"``, the same here). ``"last"`` and ``"none"``
            would need the end of the stream, so they are refused.
        maintain_order
            Accepted for Polars compatibility; rows always keep arrival order.
        within, ttl
            As :meth:`drop_duplicates`: exactly one is required.

        Returns
        -------
        Stream

        Examples
        --------
        >>> clicks = mb.read_memory(pl.DataFrame({"id": ["a", "b", "a"], "n": [1, 2, 3]}))
        >>> query = (
        ...     clicks.unique("id", ttl="1d")
        ...     .write_memory("doc_unique").start(trigger="available-now")
        ... )
        >>> query.await_termination()
        True
        >>> mb.table("doc_unique").rows()
        [('a', 1), ('b', 2)]
        """
        if keep not in ("first", "any"):
            raise PlanError(
                f"unique(keep={keep!r}) is not possible on a stream: which row is the last "
                "(or whether a key repeats) is known only at the end of the input. A stream "
                "keeps the first row of each key: keep='first'"
            )
        if subset is None:
            cols = list(self.schema)
        else:
            keys = [subset] if isinstance(subset, str | pl.Expr) else list(subset)
            cols = [column_name(k, "unique") for k in keys]
        return self.drop_duplicates(cols, within=within, ttl=ttl)

    # --------------------------------------------------------------- joins

    def join_interval(
        self,
        other: Stream,
        *,
        on: str | Sequence[str] | None = None,
        left_on: str | Sequence[str] | None = None,
        right_on: str | Sequence[str] | None = None,
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

        Parameters
        ----------
        other
            The right stream (another source: for a self-join read the source
            twice).
        on
            The key column(s), in both streams.
        left_time
            This stream's event-time column.
        right_time
            The other stream's event-time column (default: ``left_time``).
        lower, upper
            The interval bounds relative to ``left_time``: signed durations
            (``"-10m"``, ``"0s"``), seconds, or ``timedelta``.
        how
            ``"inner"``, ``"left"``, ``"right"`` or ``"full"``.

        Returns
        -------
        Stream

        Raises
        ------
        PlanError
            When an input has no watermark, both inputs read the same source
            object, or an option is invalid.

        Examples
        --------
        Payments made within 10 minutes after a click, by user:

        >>> from datetime import datetime
        >>> def at(minute):
        ...     return datetime(2026, 1, 1, 0, minute)
        >>> clicks = mb.read_memory(pl.DataFrame({"user": [1, 2, 9], "ts": [at(0), at(1), at(30)]}))
        >>> pays = mb.read_memory(
        ...     pl.DataFrame({"user": [1, 9], "ts": [at(5), at(31)], "amount": [10.0, 20.0]})
        ... )
        >>> joined = clicks.with_watermark("ts", "1m").join_interval(
        ...     pays.with_watermark("ts", "1m"),
        ...     on="user",
        ...     left_time="ts",
        ...     lower="0s",
        ...     upper="10m",
        ...     how="left",
        ... )
        >>> query = joined.write_memory("doc_join_interval").start(trigger="available-now")
        >>> query.await_termination()
        True
        >>> out = mb.table("doc_join_interval")
        >>> out.columns
        ['user', 'ts', 'ts_right', 'amount']
        >>> out.sort("user").select("user", "amount").rows()
        [(1, 10.0), (2, None), (9, 20.0)]

        User 2's click is emitted without a payment once the watermark (00:29)
        passed its interval's end (00:11).
        """
        from microbatch.plan.nodes import IntervalJoinNode

        on, other = self._join_on(other, on, left_on, right_on, "join_interval")
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
        on: str | Sequence[str] | None = None,
        left_on: str | Sequence[str] | None = None,
        right_on: str | Sequence[str] | None = None,
        window: WindowSpec,
        how: JoinHow = "inner",
    ) -> Stream:
        """Window join: pairs of rows with equal ``on`` keys that fall in the same
        event-time ``window`` (``mb.window(col, size[, slide])`` or
        ``mb.cumulate_window(col, size, step)``; ``col`` must be a column of both
        streams).

        Output: ``window_start``, ``window_end``, the keys, this stream's other
        columns, the other stream's (``_right`` on a clash). A pair is emitted
        as soon as both rows are there; with ``how="left"|"right"|"full"`` a row
        without partner in its window is emitted (nulls for the other side) when
        the watermark closes the window. A row is late when its window is
        closed (``window_end <= watermark``); state is released as windows close.
        Built on :meth:`join_interval` (equal windows, zero-width interval).

        Parameters
        ----------
        other
            The right stream; both need ``with_watermark``.
        on
            The key column(s), in both streams.
        window
            ``mb.window(column, size[, slide])``, without ``allowed_lateness``.
        how
            ``"inner"``, ``"left"``, ``"right"`` or ``"full"``.

        Returns
        -------
        Stream

        Raises
        ------
        PlanError
            For a session window, a window with ``allowed_lateness``, or inputs
            that :meth:`join_interval` refuses.

        Examples
        --------
        >>> from datetime import datetime
        >>> left = mb.read_memory(
        ...     pl.DataFrame(
        ...         {
        ...             "k": [1, 2],
        ...             "ts": [datetime(2026, 1, 1, 0, 0, 10), datetime(2026, 1, 1, 0, 0, 20)],
        ...             "x": [1, 2],
        ...         }
        ...     )
        ... )
        >>> right = mb.read_memory(
        ...     pl.DataFrame(
        ...         {
        ...             "k": [1, 2],
        ...             "ts": [datetime(2026, 1, 1, 0, 0, 50), datetime(2026, 1, 1, 0, 1, 10)],
        ...             "y": [10, 20],
        ...         }
        ...     )
        ... )
        >>> joined = left.with_watermark("ts", "0s").join_window(
        ...     right.with_watermark("ts", "0s"), on="k", window=mb.window("ts", "1m")
        ... )
        >>> query = joined.write_memory("doc_join_window").start(trigger="available-now")
        >>> query.await_termination()
        True
        >>> out = mb.table("doc_join_window")
        >>> out.columns
        ['window_start', 'window_end', 'k', 'ts', 'x', 'ts_right', 'y']
        >>> out.select("k", "x", "y").rows()
        [(1, 1, 10)]

        Key 2's rows are in different minutes, so they do not pair.
        """
        if not isinstance(window, WindowSpec):
            raise PlanError(
                "join_window needs window=mb.window(column, size[, slide]) (session windows "
                f"differ per key and cannot pair two streams); got {window!r}"
            )
        if window.allowed_lateness_ms:
            raise PlanError("join_window does not support allowed_lateness")
        on, other = self._join_on(other, on, left_on, right_on, "join_window")
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

    def join(
        self,
        other: Stream,
        *,
        on: str | Sequence[str] | None = None,
        left_on: str | Sequence[str] | None = None,
        right_on: str | Sequence[str] | None = None,
        how: JoinHow = "inner",
    ) -> Stream:
        """Join two windowed aggregations per window: ``on`` must include
        ``window_start`` (and any group keys to match).

        Both streams must end in ``group_by(mb.window(...), ...).agg(...)`` over
        the same window, and the query must run in append mode: each window's
        row is then final when emitted, and both inputs emit a window in the
        same batch (the first whose watermark passes its end), so the join
        needs no state of its own. Output as Polars' ``join`` (keys coalesced).
        For raw streams use :meth:`join_interval` or :meth:`join_window`; for a
        table, :meth:`join_static`.

        Parameters
        ----------
        other
            The other windowed aggregation.
        on
            The join columns: ``window_start`` (or ``window_end``) and the group
            keys to match.
        how
            ``"inner"``, ``"left"``, ``"right"`` or ``"full"``.

        Returns
        -------
        Stream

        Raises
        ------
        PlanError
            When an input is not a windowed aggregation, the windows differ or use
            ``allowed_lateness``, ``on`` lacks the window, or an input has no
            watermark.

        Examples
        --------
        >>> from datetime import datetime
        >>> def at(minute, second):
        ...     return datetime(2026, 1, 1, 0, minute, second)
        >>> clicks = mb.read_memory(
        ...     pl.DataFrame({"k": [1, 1, 2, 1], "ts": [at(0, 10), at(0, 20), at(0, 30), at(2, 0)]})
        ... )
        >>> pays = mb.read_memory(
        ...     pl.DataFrame(
        ...         {
        ...             "k": [1, 2, 2],
        ...             "ts": [at(0, 15), at(0, 40), at(2, 0)],
        ...             "amount": [5.0, 7.0, 1.0],
        ...         }
        ...     )
        ... )
        >>> minute = mb.window("ts", "1m")
        >>> n_clicks = (
        ...     clicks.with_watermark("ts", "0s")
        ...     .group_by(minute, "k")
        ...     .agg(pl.len().alias("clicks"))
        ... )
        >>> paid = (
        ...     pays.with_watermark("ts", "0s")
        ...     .group_by(minute, "k")
        ...     .agg(pl.col("amount").sum().alias("paid"))
        ... )
        >>> query = (
        ...     n_clicks.join(paid, on=["window_start", "window_end", "k"])
        ...     .write_memory("doc_join")
        ...     .start(trigger="available-now")
        ... )
        >>> query.await_termination()
        True
        >>> out = mb.table("doc_join").sort("k")
        >>> out.select(pl.col("window_start").dt.strftime("%H:%M"), "k", "clicks", "paid").rows()
        [('00:00', 1, 2, 5.0), ('00:00', 2, 1, 7.0)]
        """
        from microbatch.plan.joins import AggregateJoinSpec
        from microbatch.plan.nodes import AggregateJoinNode

        on, other = self._join_on(other, on, left_on, right_on, "join")
        keys = parse_keys(on, what="join")
        how = parse_how(how, ("inner", "left", "right", "full"), what="join")
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
        if windows[0].cumulative and "window_end" not in keys:
            raise PlanError(
                f"join: on={list(keys)} must include 'window_end' for cumulating windows: "
                "the windows of one period share their window_start"
            )
        self._check_join_inputs(other, "join", watermarks=True)
        node = AggregateJoinNode(self._plan, other.plan, AggregateJoinSpec(keys, how))
        return self._joined(other, node)

    def join_static(
        self,
        other: pl.DataFrame | str | os.PathLike[str],
        *,
        on: str | Sequence[str] | None = None,
        left_on: str | Sequence[str] | None = None,
        right_on: str | Sequence[str] | None = None,
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

        Parameters
        ----------
        other
            The table: a DataFrame, or the path of a Parquet file or directory or
            of a Delta table.
        on
            The key column(s), in both.
        how
            ``"inner"`` (drop rows without a match) or ``"left"`` (keep them, with
            nulls).
        storage_options
            Options for a remote (``s3://``) table.

        Returns
        -------
        Stream

        Examples
        --------
        >>> cards = pl.DataFrame({"card_id": [1, 2], "country": ["FR", "DE"]})
        >>> tx = mb.read_memory(pl.DataFrame({"card_id": [1, 2, 3], "amount": [1.0, 2.0, 3.0]}))
        >>> query = (
        ...     tx.join_static(cards, on="card_id", how="left")
        ...     .write_memory("doc_join_static")
        ...     .start(trigger="available-now")
        ... )
        >>> query.await_termination()
        True
        >>> mb.table("doc_join_static").rows()
        [(1, 1.0, 'FR'), (2, 2.0, 'DE'), (3, 3.0, None)]
        """
        from microbatch.plan.nodes import StaticJoinNode

        if isinstance(other, Stream):
            raise PlanError(
                "join_static joins a table (a DataFrame, Parquet or a Delta table path, re-read "
                "when it changes), not a stream. For a table given as its changelog (e.g. "
                "mb.read_delta(path, changes=True)) use "
                "join_asof_table(dim, on=..., time=..., dim_time='_commit_timestamp'); for a "
                "Delta table updated in place, pass its path to join_static."
            )
        if left_on is not None or right_on is not None:
            return self._join_static_renamed(other, on=on, left_on=left_on, right_on=right_on,
                                             how=how, storage_options=storage_options)
        if on is None:
            raise PlanError("join_static needs on=<column(s)>, or left_on= and right_on=")
        keys = parse_keys(on, what="join_static")
        how = parse_how(how, ("inner", "left"), what="join_static")
        table = StaticTable.of(other, dict(storage_options) if storage_options else None)
        return self._with_plan(StaticJoinNode(self._plan, StaticJoinSpec(table, keys, how)))

    def join_asof_table(
        self,
        dim: Stream,
        *,
        on: str | Sequence[str] | None = None,
        left_on: str | Sequence[str] | None = None,
        right_on: str | Sequence[str] | None = None,
        time: str,
        dim_time: str = "valid_from",
        how: StaticHow = "left",
    ) -> Stream:
        """Temporal join: each row gets the ``dim`` version of its key valid at its
        ``time`` — the latest with ``dim_time <= time`` (Polars ``join_asof``,
        backward).

        ``dim`` is a stream of versions (key, ``dim_time``, values): every row
        is a version valid from its ``dim_time``, or, when its rows carry
        ``_change_type`` (a changelog: ``mb.read_delta(path, changes=True)``,
        ``mb.read_kafka(..., format="debezium-json" | "upsert")``), an
        ``insert``/``update_postimage`` is a version, an ``update_preimage`` is
        ignored and a ``delete`` ends the key's value from its time on (an
        event after it gets nulls with ``how="left"`` and is dropped with
        ``"inner"``; an event before it still gets the value it had then). A
        delete takes effect at its ``_commit_timestamp`` when ``dim`` has that
        column (Delta's feed) and ``dim_time`` is another column, else at its
        ``dim_time``. For a Delta table updated in place, read its feed and use
        ``dim_time="_commit_timestamp"``: a value is valid from its commit. The
        output never holds ``_change_type``. Both inputs need ``with_watermark``.
        A row is held in state until the watermark (the minimum of both
        inputs') reaches its time — only then can no earlier-valid version
        still arrive — and is emitted then, so the output waits for the
        dimension's watermark. Versions superseded before the watermark are
        dropped. ``how="left"`` keeps rows without a version (nulls),
        ``"inner"`` drops them.

        Parameters
        ----------
        dim
            The dimension's versions: a stream of rows valid from their
            ``dim_time``, or a changelog (rows with ``_change_type``).
        on
            The key column(s), in both streams.
        time
            This stream's event-time column.
        dim_time
            The dimension's column of the time from which a version is valid.
        how
            ``"left"`` or ``"inner"``.

        Returns
        -------
        Stream

        Raises
        ------
        PlanError
            When an input has no watermark, ``time``/``dim_time`` is not a column
            name, both inputs read the same source object, or this stream is a
            changelog (an event is enriched once and cannot be retracted).

        Examples
        --------
        >>> from datetime import datetime
        >>> def at(minute):
        ...     return datetime(2026, 1, 1, 0, minute)
        >>> tx = mb.read_memory(
        ...     pl.DataFrame(
        ...         {"card_id": [1, 1, 2], "ts": [at(1), at(5), at(3)], "amount": [1.0, 2.0, 3.0]}
        ...     )
        ... )
        >>> limits = mb.read_memory(
        ...     pl.DataFrame(
        ...         {
        ...             "card_id": [1, 1, 2],
        ...             "valid_from": [at(0), at(4), at(10)],
        ...             "limit": [100, 200, 50],
        ...         }
        ...     )
        ... )
        >>> joined = tx.with_watermark("ts", "0s").join_asof_table(
        ...     limits.with_watermark("valid_from", "0s"), on="card_id", time="ts"
        ... )
        >>> query = joined.write_memory("doc_join_asof").start(trigger="available-now")
        >>> query.await_termination()
        True
        >>> mb.table("doc_join_asof").sort("ts").select("card_id", "amount", "limit").rows()
        [(1, 1.0, 100), (2, 3.0, None), (1, 2.0, 200)]

        Card 2 has no version valid at 00:03 (its first is valid from 00:10).

        A changelog dimension: card 1's limit is updated at 00:04 and the card
        deleted at 00:06 (the delete's row image is the row deleted).

        >>> changes = mb.read_memory(
        ...     pl.DataFrame(
        ...         {
        ...             "card_id": [1, 1, 1, 1, 2],
        ...             "limit": [100, 100, 200, 200, 0],
        ...             "changed_at": [at(0), at(4), at(4), at(6), at(9)],
        ...             "_change_type": [
        ...                 "insert", "update_preimage", "update_postimage", "delete", "insert"
        ...             ],
        ...         }
        ...     )
        ... )
        >>> tx = mb.read_memory(
        ...     pl.DataFrame({"card_id": [1, 1, 1], "ts": [at(1), at(5), at(7)]})
        ... )
        >>> joined = tx.with_watermark("ts", "0s").join_asof_table(
        ...     changes.with_watermark("changed_at", "0s"),
        ...     on="card_id",
        ...     time="ts",
        ...     dim_time="changed_at",
        ... )
        >>> joined.schema.names()
        ['card_id', 'ts', 'limit', 'changed_at']
        >>> query = joined.write_memory("doc_join_asof_cdc").start(trigger="available-now")
        >>> query.await_termination()
        True
        >>> out = mb.table("doc_join_asof_cdc").sort("ts")
        >>> out.select(pl.col("ts").dt.strftime("%H:%M"), "limit").rows()
        [('00:01', 100), ('00:05', 200), ('00:07', None)]
        """
        from microbatch.plan.joins import events_changelog_refusal
        from microbatch.plan.nodes import AsOfJoinNode
        from sinks.changelog import CHANGE_TYPE

        on, dim = self._join_on(dim, on, left_on, right_on, "join_asof_table")
        keys = parse_keys(on, what="join_asof_table")
        how = parse_how(how, ("inner", "left"), what="join_asof_table")
        for name, col in (("time", time), ("dim_time", dim_time)):
            if not isinstance(col, str) or not col:
                raise PlanError(f"join_asof_table needs {name}=<column name>, got {col!r}")
        events = output_schema(self._plan)
        if events is not None and CHANGE_TYPE in events:  # also when dim's schema is unknown
            raise ChangelogInputError(events_changelog_refusal())
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

    def _join_on(
        self,
        other: Any,
        on: str | Sequence[str] | None,
        left_on: str | Sequence[str] | None,
        right_on: str | Sequence[str] | None,
        what: str,
    ) -> tuple[str | Sequence[str], Any]:
        """``on``, or Polars' ``left_on``/``right_on``: the join keys (named as on
        this stream) and ``other`` with its keys renamed to them, so the output
        keeps this stream's key names, as Polars' join does."""
        if left_on is None and right_on is None:
            if on is None:
                raise PlanError(f"{what} needs on=<column(s)>, or left_on= and right_on=")
            return on, other
        if on is not None:
            raise PlanError(f"{what}: pass on= or left_on=/right_on=, not both")
        if left_on is None or right_on is None:
            raise PlanError(f"{what}: left_on= and right_on= go together (or use on=)")
        lefts = parse_keys(left_on, what=f"{what} left_on")
        rights = parse_keys(right_on, what=f"{what} right_on")
        if len(lefts) != len(rights):
            raise PlanError(
                f"{what}: left_on={list(lefts)} and right_on={list(rights)} must name as "
                "many columns each"
            )
        rename = {r: lft for r, lft in zip(rights, lefts, strict=True) if r != lft}
        if not rename or other is None:
            return lefts, other
        known = other.schema if isinstance(other, pl.DataFrame) else other._known_schema()
        if known is not None:
            check_columns(known, rights, f"{what} right_on")
            clash = [lft for lft in rename.values() if lft in known and lft not in rename]
            if clash:
                raise PlanError(
                    f"{what}: the other side already has column(s) {clash}, so its keys "
                    f"{list(rename)} cannot take this side's names; rename them first"
                )
        return lefts, other.rename(rename)

    def _join_static_renamed(
        self,
        other: pl.DataFrame | str | os.PathLike[str],
        *,
        on: str | Sequence[str] | None,
        left_on: str | Sequence[str] | None,
        right_on: str | Sequence[str] | None,
        how: StaticHow,
        storage_options: Mapping[str, str] | None,
    ) -> Stream:
        """``join_static(left_on=, right_on=)``: a DataFrame's keys are renamed; for
        a table read from storage this stream's keys take the table's names for
        the join and get their own back after it."""
        if isinstance(other, pl.DataFrame):
            keys, frame = self._join_on(other, on, left_on, right_on, "join_static")
            return self.join_static(frame, on=keys, how=how, storage_options=storage_options)
        keys, _ = self._join_on(None, on, left_on, right_on, "join_static")
        assert right_on is not None
        rights = parse_keys(right_on, what="join_static right_on")
        there = dict(zip(keys, rights, strict=True))
        back = {r: lft for lft, r in there.items() if r != lft}
        joined = self.rename({k: r for k, r in there.items() if k != r}).join_static(
            other, on=rights, how=how, storage_options=storage_options
        )
        return joined.rename(back)

    def _joined(self, other: Stream, node: PlanNode) -> Stream:
        output_schema(node)  # refuses a join key or time column missing on a side now
        return Stream(
            node,
            late_sink=self._late_sink or other.late_sink,
            dead_letter_sink=self._dead_letter_sink or other.dead_letter_sink,
        )

    def on_late(self, sink: Sink) -> Stream:
        """Write rows that arrive after their window closed to ``sink`` (a side
        output, idempotent per batch id) with a ``late_reason`` column.

        Late rows are those a stateful operator can no longer use: their window
        or session is closed, their join state is gone, or their event time is
        null. They are counted in the progress records (``late_rows``) either
        way; without ``on_late`` they are dropped. The side output also gets a
        ``batch_id`` column.

        Parameters
        ----------
        sink
            Any :class:`sinks.Sink`, e.g. ``sinks.MemorySink(name)`` or
            ``sinks.ParquetSink(path)``.

        Returns
        -------
        Stream

        Examples
        --------
        >>> from datetime import datetime
        >>> from sinks import MemorySink
        >>> times = [(0, 5), (2, 0), (0, 40), (3, 0)]
        >>> events = pl.DataFrame({"ts": [datetime(2026, 1, 1, 0, m, s) for m, s in times]})
        >>> query = (
        ...     mb.read_memory(events, max_records_per_batch=2)
        ...     .with_watermark("ts", "10s")
        ...     .group_by(mb.window("ts", "1m"))
        ...     .agg(pl.len().alias("n"))
        ...     .on_late(MemorySink("doc_on_late_rows"))
        ...     .write_memory("doc_on_late")
        ...     .start(trigger="available-now")
        ... )
        >>> query.await_termination()
        True
        >>> late = mb.table("doc_on_late_rows")
        >>> late.columns
        ['ts', 'late_reason', 'batch_id']
        >>> late["ts"].dt.strftime("%H:%M:%S").to_list()
        ['00:00:40']
        >>> late["late_reason"].to_list()
        ['window ending 2026-01-01T00:01:00.000Z closed by watermark 2026-01-01T00:01:50.000Z']

        The 00:00:40 row came in the second batch, when the watermark in force
        (00:01:50) had already closed its window.
        """
        return Stream(self._plan, late_sink=sink, dead_letter_sink=self._dead_letter_sink)

    def on_dead_letters(self, sink: Sink) -> Stream:
        """Write malformed input records (with their source location and the
        reason) to ``sink`` instead of the checkpoint's ``dead_letter/``
        directory (a side output, idempotent per batch id).

        The dead letters have the columns ``source``, ``location`` (e.g.
        ``file:line`` or ``topic:partition@offset``), ``reason``, ``raw`` (the
        record's bytes, for text formats) and ``batch_id``. Their count is in the
        progress records (``dead_letter_rows``).

        Parameters
        ----------
        sink
            Any :class:`sinks.Sink`, e.g. ``sinks.MemorySink(name)``.

        Returns
        -------
        Stream

        Examples
        --------
        >>> import pathlib, tempfile
        >>> from sinks import MemorySink
        >>> landing = pathlib.Path(tempfile.mkdtemp())
        >>> pl.DataFrame({"id": ["1", "two", "3"]}).write_csv(landing / "ids.csv")
        >>> query = (
        ...     mb.read_files(landing, format="csv", schema={"id": pl.Int64})
        ...     .on_dead_letters(MemorySink("doc_dead_letters"))
        ...     .write_memory("doc_on_dead_letters")
        ...     .start(trigger="available-now")
        ... )
        >>> query.await_termination()
        True
        >>> mb.table("doc_on_dead_letters")["id"].to_list()
        [1, 3]
        >>> dead = mb.table("doc_dead_letters")
        >>> dead.columns
        ['source', 'location', 'reason', 'raw', 'batch_id']
        >>> [location.rsplit("/", 1)[-1] for location in dead["location"]]
        ['ids.csv:3']
        """
        return Stream(self._plan, late_sink=self._late_sink, dead_letter_sink=sink)

    # ----------------------------------------------------------- stateless

    def select(self, *exprs: IntoExpr, **named: IntoExpr) -> Stream:
        """Keep/compute columns, as ``pl.LazyFrame.select``.

        Parameters
        ----------
        *exprs
            Column names or expressions.
        **named
            Expressions named by their keyword.

        Returns
        -------
        Stream

        Examples
        --------
        >>> stream = mb.read_memory(pl.DataFrame({"a": [1, 2], "b": [10, 20]}))
        >>> query = (
        ...     stream.select("a", total=pl.col("a") + pl.col("b"))
        ...     .write_memory("doc_select")
        ...     .start(trigger="available-now")
        ... )
        >>> query.await_termination()
        True
        >>> mb.table("doc_select").rows()
        [(1, 11), (2, 22)]
        """
        return self._then(expr_step("select", "select", exprs, named))

    def with_columns(self, *exprs: IntoExpr, **named: IntoExpr) -> Stream:
        """Add or replace columns, as ``pl.LazyFrame.with_columns``.

        Parameters
        ----------
        *exprs
            Expressions (their output names are the column names).
        **named
            Expressions named by their keyword.

        Returns
        -------
        Stream

        Examples
        --------
        >>> stream = mb.read_memory(pl.DataFrame({"cents": [150, 99]}))
        >>> query = (
        ...     stream.with_columns(euros=pl.col("cents") / 100)
        ...     .write_memory("doc_with_columns")
        ...     .start(trigger="available-now")
        ... )
        >>> query.await_termination()
        True
        >>> mb.table("doc_with_columns").rows()
        [(150, 1.5), (99, 0.99)]
        """
        return self._then(expr_step("with_columns", "with_columns", exprs, named))

    def filter(self, *predicates: IntoExpr, **constraints: Any) -> Stream:
        """Keep rows matching all predicates, as ``pl.LazyFrame.filter``.

        Over a changelog input (rows carrying ``_change_type``) an update that
        crosses the predicate is relabelled: a kept ``update_preimage`` whose
        ``update_postimage`` is dropped becomes a ``delete``, a kept postimage
        whose preimage is dropped an ``insert`` (the k-th preimage of a batch
        pairs with its k-th postimage), so the filtered changes still apply to
        the filtered table. A predicate that reads ``_change_type`` selects
        kinds of change and relabels nothing.

        Parameters
        ----------
        *predicates
            Boolean expressions; a row is kept when all are true.
        **constraints
            ``column=value`` equality constraints.

        Returns
        -------
        Stream

        Examples
        --------
        >>> stream = mb.read_memory(
        ...     pl.DataFrame({"kind": ["pay", "refund", "pay"], "amount": [120, 50, 30]})
        ... )
        >>> query = (
        ...     stream.filter(pl.col("amount") > 40, kind="pay")
        ...     .write_memory("doc_filter")
        ...     .start(trigger="available-now")
        ... )
        >>> query.await_termination()
        True
        >>> mb.table("doc_filter").rows()
        [('pay', 120)]
        """
        if is_changelog_schema(self._known_schema()) and not selects_change_types(
            predicates, constraints
        ):
            keep = changelog_filter(predicates, constraints)
            shown = tuple(predicates) + tuple(f"{k}={v}" for k, v in constraints.items())
            return self._then(
                Step("filter", shown, lambda lf: relabel_filtered(lf, keep))
            )
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

    def map_batches(
        self,
        fn: Callable[[pl.DataFrame], pl.DataFrame],
        *,
        schema: Mapping[str, Any] | pl.Schema | None = None,
    ) -> Stream:
        """Apply ``fn`` to each whole batch (escape hatch; keep ``fn`` deterministic
        so replays give the same rows).

        The engine runs ``fn`` on each batch's DataFrame and continues the plan
        with what it returns; prefer expression steps (:meth:`select`,
        :meth:`with_columns`, :meth:`filter`) where they do.

        Parameters
        ----------
        fn
            A function ``DataFrame -> DataFrame``.
        schema
            The columns ``fn`` returns (as ``LazyFrame.map_batches(schema=)``): the
            stream's schema stays known when the query is built, so later steps
            are checked then; a batch whose result differs fails. ``None``: the
            schema is known only when a batch runs.

        Returns
        -------
        Stream

        Raises
        ------
        PlanError
            When ``fn`` is not callable.

        Examples
        --------
        >>> def add_rank(df: pl.DataFrame) -> pl.DataFrame:
        ...     return df.with_columns(rank=pl.col("score").rank("ordinal", descending=True))
        >>> stream = mb.read_memory(pl.DataFrame({"score": [3, 9, 5]}))
        >>> query = (
        ...     stream.map_batches(add_rank)
        ...     .write_memory("doc_map_batches")
        ...     .start(trigger="available-now")
        ... )
        >>> query.await_termination()
        True
        >>> mb.table("doc_map_batches")["rank"].to_list()
        [3, 1, 2]
        """
        if not callable(fn):
            raise PlanError(f"map_batches needs a function DataFrame -> DataFrame, got {fn!r}")
        return self._then(map_batches_step(fn, None if schema is None else pl.Schema(schema)))

    # ------------------------------------------------------------- writers

    def write_to(self, sink: Sink, *, output_mode: OutputMode | None = None) -> DataStreamWriter:
        """Attach any :class:`sinks.Sink`.

        The ``write_*`` methods are shortcuts for this with the matching sink.
        The output mode is checked against the sink and the plan at once.

        Parameters
        ----------
        sink
            The sink, e.g. one of :mod:`sinks` (``MemorySink``, ``ParquetSink``,
            ``DeltaSink``, ``KafkaSink``, ``ConsoleSink``, ``ForeachBatchSink``,
            ``FanOutSink``) or your own subclass of ``sinks.Sink``.
        output_mode
            ``"append"`` (each result row once, when final), ``"update"`` (the
            rows whose result changed in the batch), ``"complete"`` (the whole
            result every batch; aggregations only) or ``"changelog"`` (the
            batch's changes to the result table, with a ``_change_type`` column:
            ``insert``, ``update_preimage``, ``update_postimage``, ``delete``).
            Omitted: the mode a SQL ``EMIT`` clause chose (:attr:`emit_mode`),
            else ``"append"``.

        Returns
        -------
        DataStreamWriter
            Call ``start`` on it to run the query.

        Raises
        ------
        PlanError
            When the sink does not support ``output_mode``, or the plan cannot run
            in it (e.g. ``"complete"`` without an aggregation); a
            :class:`~microbatch.SQLError` when it contradicts the query's ``EMIT``.

        Examples
        --------
        >>> from sinks import MemorySink
        >>> stream = mb.read_memory(pl.DataFrame({"k": ["a", "b", "a"]}))
        >>> writer = stream.group_by("k").agg(pl.len().alias("n")).write_to(
        ...     MemorySink("doc_write_to"), output_mode="complete"
        ... )
        >>> writer.describe()
        {'sink': {'kind': 'MemorySink', 'name': 'doc_write_to'}, 'output_mode': 'complete'}
        >>> writer.start(trigger="available-now").await_termination()
        True
        >>> mb.table("doc_write_to").sort("k").rows()
        [('a', 2), ('b', 1)]
        """
        return DataStreamWriter(
            self._plan,
            sink,
            self._output_mode(output_mode),
            dead_letter=self._dead_letter_sink,
            late_sink=self._late_sink,
        )

    def write_memory(self, name: str, *, output_mode: OutputMode | None = None) -> DataStreamWriter:
        """Attach an in-process table readable with ``mb.table(name)``.

        For notebooks and tests: every batch is kept in memory, in a table per
        process, and a replayed batch id is a no-op. ``mb.table(name)`` returns
        what ``output_mode`` defines: in ``append`` every batch's rows, in
        ``update`` one row per key (the newest; a ``delete`` change removes
        it), in ``complete`` the latest batch, in ``changelog`` every change
        row in order. Give each query its own name.

        Parameters
        ----------
        name
            The table's name.
        output_mode
            ``"append"``, ``"update"``, ``"complete"`` or ``"changelog"``.

        Returns
        -------
        DataStreamWriter

        Examples
        --------
        >>> stream = mb.read_memory(pl.DataFrame({"x": [1, 2, 3]}))
        >>> query = stream.write_memory("doc_write_memory").start(trigger="available-now")
        >>> query.await_termination()
        True
        >>> mb.table("doc_write_memory")["x"].to_list()
        [1, 2, 3]
        """
        from sinks.memory import MemorySink

        return self.write_to(MemorySink(name), output_mode=output_mode)

    def write_console(
        self, *, num_rows: int = 20, output_mode: OutputMode | None = None
    ) -> DataStreamWriter:
        """Print each batch to stdout.

        Each batch is printed as ``Batch: N`` and its frame. Printing cannot be
        undone, so it is not exactly-once: a batch replayed by a new process is
        printed again.

        Parameters
        ----------
        num_rows
            At most this many rows are printed per batch (the head and tail).
        output_mode
            ``"append"``, ``"update"``, ``"complete"`` or ``"changelog"``.

        Returns
        -------
        DataStreamWriter

        Examples
        --------
        >>> stream = mb.read_memory(pl.DataFrame({"x": [1, 2]}))
        >>> stream.write_console().start(trigger="available-now").await_termination()
        -------------------------------------------
        Batch: 0
        -------------------------------------------
        shape: (2, 1)
        ┌─────┐
        │ x   │
        │ --- │
        │ i64 │
        ╞═════╡
        │ 1   │
        │ 2   │
        └─────┘
        <BLANKLINE>
        True
        """
        from sinks.console import ConsoleSink

        return self.write_to(ConsoleSink(num_rows=num_rows), output_mode=output_mode)

    def write_parquet(
        self,
        path: str | os.PathLike[str],
        *,
        output_mode: OutputMode | None = None,
        partition_by: str | Sequence[str] | None = None,
    ) -> DataStreamWriter:
        """Write Parquet files plus a manifest keyed by batch id (exactly once);
        read the result with ``mb.parquet_table(path)``.

        Only the ``append`` output mode is supported (files cannot be updated in
        place; use :meth:`write_delta` or :meth:`write_memory` for ``update`` and
        ``complete``). A batch whose columns or types differ from the first
        batch's is refused before anything is written.

        Parameters
        ----------
        path
            The output directory; created when missing.
        output_mode
            ``"append"``.
        partition_by
            Column(s) to lay out hive-style (``col=value/`` directories);
            ``mb.parquet_table`` restores them with their types.

        Returns
        -------
        DataStreamWriter

        Examples
        --------
        >>> import tempfile
        >>> out = tempfile.mkdtemp()
        >>> stream = mb.read_memory(pl.DataFrame({"day": ["mon", "tue", "mon"], "x": [1, 2, 3]}))
        >>> query = stream.write_parquet(out, partition_by="day").start(trigger="available-now")
        >>> query.await_termination()
        True
        >>> mb.parquet_table(out).sort("x").rows()
        [('mon', 1), ('tue', 2), ('mon', 3)]
        """
        from sinks.parquet import ParquetSink

        sink = ParquetSink(path, partition_by=partition_by)
        return self.write_to(sink, output_mode=output_mode)

    def write_kafka(
        self,
        topic: str,
        *,
        bootstrap: str,
        key: str | pl.Expr | None = None,
        format: Literal["json", "raw", "debezium-json", "upsert"] = "json",
        headers: Mapping[str, str | pl.Expr] | None = None,
        delivery_guarantee: DeliveryGuarantee = "exactly_once",
        config: Mapping[str, Any] | None = None,
        output_mode: OutputMode | None = None,
        value_format: Literal["json", "raw"] | None = None,
        mode: DeliveryGuarantee | None = None,
        key_columns: str | Sequence[str] | None = None,
        tombstones_on_delete: bool = True,
    ) -> DataStreamWriter:
        """Write each batch's rows to a Kafka topic, one JSON object (or raw value) per row.

        ``delivery_guarantee="exactly_once"``: one Kafka transaction per batch,
        with a marker that makes a replayed batch a no-op (consumers read with
        ``isolation.level=read_committed``). ``"at_least_once"``: records carry
        ``mb_query_id``/``mb_batch_id``/``mb_row`` headers for downstream
        dedupe. ``value_format`` and ``mode`` are the deprecated names of
        ``format`` and ``delivery_guarantee``. Building the writer does not
        contact the broker: the producer is created when the query starts. See
        :class:`sinks.kafka.KafkaSink`.

        Parameters
        ----------
        topic
            The output topic (must exist, or the broker must auto-create it).
        bootstrap
            ``host:port[,...]`` of the cluster.
        key
            Column name or expression for the record key (``None``: no key; for
            changes, the query's key columns as one JSON object).
        format
            ``"json"``: every column of the row as one JSON object; ``"raw"``: the
            ``value`` column (bytes or text) as is; changelogs (the rows'
            ``_change_type``; none: all inserts): ``"upsert"`` (key = the key
            columns as JSON, value = the row, a delete = a tombstone) or
            ``"debezium-json"`` (Debezium envelopes: ``c``, ``u`` with
            ``before``/``after``, ``d`` then a tombstone).
        headers
            ``{header_name: column_or_expression}`` added to every record.
        delivery_guarantee
            ``"exactly_once"`` or ``"at_least_once"``.
        config
            Extra librdkafka settings for the producer (SASL/SSL...); secrets are
            redacted wherever the sink is described.
        output_mode
            ``"append"``, ``"update"`` (with ``_change_type``: a record per changed
            key, a tombstone for a delete), ``"complete"`` or ``"changelog"``
            (every change row, ``_change_type`` in the value; not with ``"raw"``).
        value_format, mode
            Deprecated (removed in 0.3): use ``format`` and ``delivery_guarantee``.
        key_columns
            ``upsert``/``debezium-json``: the columns of the record key (a JSON
            object); default the query's key columns (its grouping keys).
        tombstones_on_delete
            ``debezium-json``: a tombstone after each ``d`` record (default, as
            Debezium).

        Returns
        -------
        DataStreamWriter

        Raises
        ------
        sinks.SinkConfigError
            For a missing topic or bootstrap, or an invalid option.

        Examples
        --------
        >>> stream = mb.generate(
        ...     rows_per_second=None, total_rows=100, start="2026-01-01T00:00:00+00:00", seed=1
        ... )
        >>> writer = stream.filter(pl.col("amount") > 100).write_kafka(
        ...     "large-payments", bootstrap="127.0.0.1:9092", key="card_id"
        ... )
        >>> writer.describe()
        {'sink': {'kind': 'KafkaSink', 'topic': 'large-payments', 'bootstrap': '127.0.0.1:9092',
                  'delivery_guarantee': 'exactly_once', 'format': 'json', 'key': 'col("card_id")',
                  'headers': [], 'commit_topic': 'microbatch-sink-commits', 'config': {}},
         'output_mode': 'append'}
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
            key_columns=key_columns,
            tombstones_on_delete=tombstones_on_delete,
        )
        return self.write_to(sink, output_mode=output_mode)

    def write_webhook(
        self,
        url: str,
        *,
        key: str,
        batch_size: int | None = None,
        timeout: str | float = "10s",
        headers: Mapping[str, str] | None = None,
        token_env: str | None = None,
        max_in_flight: int = 8,
        retry_for: str | float = "10m",
        backoff: tuple[str | float, str | float] = ("200ms", "30s"),
        verify: bool | str = True,
        dead_letters: Sink | None = None,
        output_mode: OutputMode | None = None,
    ) -> DataStreamWriter:
        """POST every row to an HTTP endpoint with an ``Idempotency-Key`` (at least
        once per key, the same body every time).

        One JSON object per row (or, with ``batch_size``, JSON arrays of up to
        that many rows); ``Idempotency-Key`` is the ``key`` column (a hash of
        the chunk's keys in batch mode). Connection errors, timeouts, 408, 429
        (``Retry-After`` honoured) and 5xx are retried with exponential backoff
        and jitter for up to ``retry_for``; other 4xx answers send the row to the
        dead letters with the status and an excerpt of the answer. A batch
        commits only once every row was acknowledged or dead-lettered. See
        :class:`sinks.webhook.WebhookSink`.

        Parameters
        ----------
        url
            The endpoint, ``https://`` (certificates verified) or ``http://``.
        key
            The column holding each row's idempotency key (e.g. an alert id).
        batch_size
            ``None`` for one POST per row, or the rows per JSON-array POST.
        timeout
            Connect and read/write timeout, a duration (``"10s"``) or seconds.
        headers
            Extra request headers; only their names are ever shown.
        token_env
            The environment variable holding a bearer token (never shown).
        max_in_flight
            Requests open at once.
        retry_for
            How long a batch retries before it fails (and is re-run on restart).
        backoff
            First and longest retry delay; the delay doubles, with full jitter.
        verify
            HTTPS certificate verification: ``True``, ``False`` or a CA bundle path.
        dead_letters
            A sink for refused rows (default: Parquet in the checkpoint's
            ``dead_letter_webhook/``).
        output_mode
            ``"append"`` or ``"update"``.

        Returns
        -------
        DataStreamWriter

        Examples
        --------
        >>> alerts = mb.read_memory(schema={"alert_id": pl.String, "card": pl.Int64})
        >>> writer = alerts.write_webhook("https://hooks.example.com/fraud",
        ...                               key="alert_id", token_env="FRAUD_HOOK_TOKEN")
        >>> writer.describe()["sink"]["url"]
        'https://hooks.example.com/fraud'
        """
        from sinks.webhook import WebhookSink

        def seconds(value: str | float, what: str) -> float:
            return parse_duration_ms(value, what=f"write_webhook {what}") / 1000

        sink = WebhookSink(
            url,
            key=key,
            batch_size=batch_size,
            timeout=seconds(timeout, "timeout"),
            headers=headers,
            token_env=token_env,
            max_in_flight=max_in_flight,
            retry_for=seconds(retry_for, "retry_for"),
            backoff=(seconds(backoff[0], "backoff"), seconds(backoff[1], "backoff")),
            verify=verify,
            dead_letters=dead_letters,
        )
        return self.write_to(sink, output_mode=output_mode)

    def write_delta(
        self,
        path: str | os.PathLike[str],
        *,
        output_mode: OutputMode | None = None,
        partition_by: str | Sequence[str] | None = None,
        merge_keys: str | Sequence[str] | None = None,
        storage_options: Mapping[str, str] | None = None,
        schema_mode: SchemaMode | None = None,
        optimize_every: int | None = None,
        change_data_feed: bool = False,
        allow_other_writers: bool = False,
    ) -> DataStreamWriter:
        """Write to a Delta table, one commit per batch, exactly once.

        Every commit carries the app transaction ``(query id, batch id)``, so
        a replayed batch is a no-op. ``append`` appends, ``update`` MERGEs by
        ``merge_keys`` (default: the window and group keys) -- upserts, and
        the deletes of a changelog (a session merged away, a group that
        became empty) in the same commit -- ``complete`` overwrites and
        ``changelog`` appends the change rows with ``_change_type``. The table
        is created on the first batch; a batch whose schema differs is refused
        before anything is written unless ``schema_mode="merge"`` (additive
        evolution).
        ``optimize_every=N`` compacts small files every N batches. See
        :class:`sinks.delta.DeltaSink`.

        Parameters
        ----------
        path
            The table: a local directory or a URI (``s3://bucket/table``, ...).
        output_mode
            ``"append"``, ``"update"``, ``"complete"`` or ``"changelog"``.
        partition_by
            Partition columns of a table the sink creates (for an existing table:
            its own, or ``None``).
        merge_keys
            Columns identifying a row for ``update``'s MERGE (default: the
            aggregation's window and group keys).
        storage_options
            Passed to delta-rs (credentials, endpoint...); never shown.
        schema_mode
            ``None`` (refuse a different schema) or ``"merge"`` (add new columns;
            columns a batch lacks are written as nulls).
        optimize_every
            Compact small files after every N-th batch.
        change_data_feed
            Create the table with ``delta.enableChangeDataFeed=true`` (its
            commits then record their row changes, for ``read_delta(path,
            changes=True)``); an existing table must have it already.
        allow_other_writers
            The table belongs to one query by default: the query registers
            itself in the table's properties, and a table another active
            query writes is refused when the query starts (two checkpoints
            appending the same rows would double them). ``True`` when several
            queries write the table on purpose.

        Returns
        -------
        DataStreamWriter

        Raises
        ------
        PlanError
            For ``output_mode="update"`` on a stream without aggregation keys and
            without ``merge_keys``.

        Examples
        --------
        >>> import tempfile
        >>> table = tempfile.mkdtemp()
        >>> stream = mb.read_memory(
        ...     pl.DataFrame({"k": ["a", "b", "a"], "x": [1, 2, 3]}), max_records_per_batch=2
        ... )
        >>> query = (
        ...     stream.group_by("k")
        ...     .agg(pl.col("x").sum())
        ...     .write_delta(table, output_mode="update")
        ...     .start(trigger="available-now")
        ... )
        >>> query.await_termination()
        True
        >>> pl.read_delta(table).sort("k").rows()
        [('a', 4), ('b', 2)]

        The table was created, then each batch made one commit (newest first):

        >>> from deltalake import DeltaTable
        >>> [commit["operation"] for commit in DeltaTable(table).history()]
        ['MERGE', 'MERGE', 'CREATE TABLE']
        """
        from microbatch.api.writer import output_keys
        from sinks.delta import DeltaSink

        output_mode = self._output_mode(output_mode)
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
            change_data_feed=change_data_feed,
            allow_other_writers=allow_other_writers,
        )
        return self.write_to(sink, output_mode=output_mode)

    def write_iceberg(
        self,
        table: str,
        *,
        catalog: Any,
        output_mode: OutputMode | None = None,
        partition_by: str | Sequence[str] | None = None,
        merge_keys: str | Sequence[str] | None = None,
        storage_options: Mapping[str, str] | None = None,
        schema_mode: SchemaMode | None = None,
        location: str | None = None,
        allow_other_writers: bool = False,
    ) -> DataStreamWriter:
        """Write to an Apache Iceberg table (PyIceberg), one catalog commit per batch,
        exactly once.

        Every commit records ``microbatch.query-id`` and ``microbatch.batch-id``
        in its snapshot summary (and the query's last batch in a table
        property), so a replayed batch is a no-op. ``append`` appends,
        ``update`` deletes the rows of the keys a batch touches and appends
        its upserts in the same commit (a changelog's deletes included),
        ``complete`` overwrites and ``changelog`` appends the change rows
        with ``_change_type``. The table and its namespace are created on the
        first batch; a batch whose columns differ is refused before anything
        is written unless ``schema_mode="merge"`` (new columns added by
        name). See :class:`sinks.iceberg.IcebergSink` and ``docs/iceberg.md``.

        Parameters
        ----------
        table
            ``"namespace.table"``.
        catalog
            A ``pyiceberg`` ``Catalog``, a mapping of catalog properties, or a
            string: ``sqlite:///PATH.db`` (a SQL catalog, warehouse beside
            it), ``http(s)://HOST`` (REST) or a configured catalog's name.
        output_mode
            ``"append"``, ``"update"``, ``"complete"`` or ``"changelog"``.
        partition_by
            The partition spec of a table the sink creates: columns
            (identity) and Iceberg transforms as Spark SQL writes them,
            ``"year(ts)"``, ``"month(ts)"``, ``"day(ts)"``, ``"hour(ts)"``,
            ``"bucket(16, card_id)"``, ``"truncate(4, name)"`` (case-insensitive;
            fields named ``ts_day``, ``card_id_bucket_16``...). For an existing
            table: its own spec, transforms included, or ``None``.
        merge_keys
            Columns identifying a row for ``update`` (default: the
            aggregation's window and group keys).
        storage_options
            FileIO properties: delta-rs keys (``AWS_ENDPOINT_URL``, ...) or
            PyIceberg's (``s3.endpoint``, ...); never shown.
        schema_mode
            ``None`` (refuse different columns) or ``"merge"`` (add new
            columns; columns a batch lacks are written as nulls).
        location
            Where a table the sink creates lives (a path or URI; default: the
            catalog's warehouse decides), so readers without the catalog
            (DuckDB's ``iceberg_scan``, ``microbatch diff DIR``) find it.
        allow_other_writers
            The table belongs to one query by default, as with
            ``write_delta``: the query registers itself in the table's
            properties (in its first commit of rows), and a table another
            active query is registered on is refused when the query starts,
            or at its first commit if both start at once (two checkpoints
            appending the same rows would double them). ``True`` when several
            queries write the table on purpose.

        Returns
        -------
        DataStreamWriter

        Raises
        ------
        PlanError
            For ``output_mode="update"`` on a stream without aggregation keys and
            without ``merge_keys``.
        SinkConfigError
            When PyIceberg is missing: ``pip install 'microbatch[iceberg]'``;
            for a ``partition_by`` term that is not one of the forms above.
            ``OtherWriterError`` (a ``SinkConfigError``), when the query
            starts, for a table another query writes (see
            ``allow_other_writers``).

        Examples
        --------
        >>> import tempfile
        >>> catalog = f"sqlite:///{tempfile.mkdtemp()}/catalog.db"
        >>> stream = mb.read_memory(
        ...     pl.DataFrame({"k": ["a", "b", "a"], "x": [1, 2, 3]}), max_records_per_batch=2
        ... )
        >>> query = (
        ...     stream.group_by("k")
        ...     .agg(pl.col("x").sum())
        ...     .write_iceberg("lake.totals", catalog=catalog, output_mode="update")
        ...     .start(trigger="available-now")
        ... )
        >>> query.await_termination()
        True
        >>> from sinks.iceberg_catalog import resolve_catalog
        >>> lake = resolve_catalog(catalog)
        >>> lake.load_table("lake.totals").scan().to_polars().sort("k").rows()
        [('a', 4), ('b', 2)]
        """
        from microbatch.api.writer import output_keys
        from sinks.iceberg import IcebergSink
        from sinks.iceberg_catalog import require_pyiceberg

        require_pyiceberg()
        output_mode = self._output_mode(output_mode)
        if output_mode == "update" and not merge_keys and not output_keys(self._plan):
            raise PlanError(
                "write_iceberg(output_mode='update') replaces rows by key, and this stream has "
                "no aggregation keys: pass merge_keys=[...], or use output_mode='append'"
            )
        sink = IcebergSink(
            table,
            catalog=catalog,
            partition_by=partition_by,
            merge_keys=merge_keys,
            storage_options=storage_options,
            schema_mode=schema_mode,
            location=location,
            allow_other_writers=allow_other_writers,
        )
        return self.write_to(sink, output_mode=output_mode)

    def foreach_batch(
        self, fn: Callable[[pl.DataFrame, int], None], *, output_mode: OutputMode | None = None
    ) -> DataStreamWriter:
        """Call ``fn(df, batch_id)`` per batch; make ``fn`` idempotent on batch_id.

        After a crash the engine calls ``fn`` again with the same ``batch_id`` and
        the same rows, so ``fn`` should write idempotently, keyed by
        ``batch_id``. A call that raises fails the batch (and the query).

        Parameters
        ----------
        fn
            A function ``(DataFrame, batch_id) -> None``.
        output_mode
            ``"append"``, ``"update"``, ``"complete"`` or ``"changelog"``.

        Returns
        -------
        DataStreamWriter

        Examples
        --------
        >>> written = {}
        >>> def upsert(df: pl.DataFrame, batch_id: int) -> None:
        ...     written[batch_id] = df["x"].to_list()  # keyed by batch id: a replay overwrites
        >>> stream = mb.read_memory(pl.DataFrame({"x": [1, 2, 3]}), max_records_per_batch=2)
        >>> stream.foreach_batch(upsert).start(trigger="available-now").await_termination()
        True
        >>> written
        {0: [1, 2], 1: [3]}
        """
        from sinks.foreach import ForeachBatchSink

        return self.write_to(ForeachBatchSink(fn), output_mode=output_mode)

    # ---------------------------------------------------------- inspection

    def explain(self) -> str:
        """The plan as a tree, root first; for a stream built by ``mb.sql``, the SQL
        text first, then the plan (under ``-- plan``)."""
        if self._sql is not None:
            return f"-- SQL\n{self._sql.strip()}\n-- plan\n{self._plan.explain()}"
        return self._plan.explain()

    def _from_sql(self, text: str) -> Stream:
        """This stream, remembering the SQL it was built from (for ``explain``)."""
        stream = Stream(
            self._plan, late_sink=self._late_sink, dead_letter_sink=self._dead_letter_sink
        )
        stream._sql = text
        stream._emit = self._emit
        return stream

    def _emitting(self, mode: OutputMode, clause: str, line: int, column: int) -> Stream:
        """This stream, its writers defaulting to ``mode`` (SQL's ``EMIT`` clause at
        ``line``:``column``)."""
        stream = self._from_sql(self._sql) if self._sql is not None else self._with_plan(self._plan)
        stream._emit = (mode, clause, line, column)
        return stream

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
        from microbatch.engine.batch_executor import BatchExecutor, input_frame

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
        self,
        stream: Stream,
        window: WindowSpec | SessionWindowSpec | None,
        keys: tuple[str, ...],
        *,
        ttl_ms: int | None = None,
        accumulation_mode: AccumulationMode = "accumulating",
    ) -> None:
        self._stream = stream
        self._window = window
        self._keys = keys
        self._ttl_ms = ttl_ms
        self._accumulation_mode = accumulation_mode

    def agg(self, *aggs: pl.Expr | Sequence[pl.Expr], **named_aggs: pl.Expr) -> Stream:
        """Aggregate incrementally; output columns ``window_start, window_end``
        (when windowed), the keys, then the aggregates.

        Each aggregate keeps a partial result per group in state and merges each
        batch into it. Supported: ``pl.len()``, ``col.count()``, ``col.sum()``,
        ``col.min()``, ``col.max()``, ``col.mean()``, ``col.first()`` and
        ``col.last()`` (by event time), each optionally ``.alias``-ed. Compute
        other values from these in a later :meth:`Stream.with_columns`.

        Over a changelog input (rows carrying ``_change_type``, without a
        window) the aggregation retracts: ``insert``/``update_postimage`` rows
        count +1, ``delete``/``update_preimage`` rows -1, for ``pl.len()``,
        ``count``, ``sum`` and ``mean`` in constant state per key; a group whose
        rows are all deleted leaves the result with a ``delete`` change (applied
        by the sinks in ``"update"`` mode), so the result equals a one-shot
        ``group_by`` over the source table's current state. ``min``, ``max``,
        ``first`` and ``last`` are refused there (retracting them needs every
        value of the key); float sums can drift by rounding under retraction,
        integer and Decimal sums are exact.

        Parameters
        ----------
        *aggs
            Aggregation expressions, or lists of them; output names must be unique.
        **named_aggs
            Aggregations named by keyword, as in Polars: ``agg(n=pl.len())`` is
            ``agg(pl.len().alias("n"))``.

        Returns
        -------
        Stream

        Raises
        ------
        PlanError
            For an aggregation that cannot be computed incrementally, or a
            duplicate output name; :class:`~microbatch.ChangelogInputError`
            (a ``PlanError``) for one that cannot be retracted over a changelog.

        Examples
        --------
        >>> sales = mb.read_memory(
        ...     pl.DataFrame({"shop": ["a", "b", "a"], "amount": [10.0, 4.0, 20.0]})
        ... )
        >>> query = (
        ...     sales.group_by("shop")
        ...     .agg(
        ...         pl.len().alias("sales"),
        ...         pl.col("amount").sum().alias("total"),
        ...         pl.col("amount").mean().alias("avg"),
        ...     )
        ...     .with_columns(share=pl.col("total") / 34.0)
        ...     .write_memory("doc_agg", output_mode="complete")
        ...     .start(trigger="available-now")
        ... )
        >>> query.await_termination()
        True
        >>> mb.table("doc_agg").sort("shop").rows()
        [('a', 2, 30.0, 15.0, 0.8823529411764706), ('b', 1, 4.0, 4.0, 0.11764705882352941)]

        Over a changelog (here the edits of a table of shops' sales), deletes
        and preimages retract; shop ``b`` lost its only sale and is deleted:

        >>> edits = pl.DataFrame({
        ...     "shop": ["a", "b", "a", "a", "b"],
        ...     "amount": [10, 4, 10, 12, 4],
        ...     "_change_type": ["insert", "insert", "update_preimage",
        ...                      "update_postimage", "delete"],
        ... })
        >>> query = (
        ...     mb.read_memory(edits, max_records_per_batch=2)
        ...     .group_by("shop")
        ...     .agg(pl.len().alias("sales"), pl.col("amount").sum().alias("total"))
        ...     .write_memory("doc_agg_changes", output_mode="update")
        ...     .start(trigger="available-now")
        ... )
        >>> query.await_termination()
        True
        >>> mb.table("doc_agg_changes").rows()
        [('a', 1, 12)]

        Aggregations that cannot merge across batches are refused when the plan is
        built:

        >>> sales.group_by("shop").agg(pl.col("amount").median())
        Traceback (most recent call last):
        ...
        microbatch.exceptions.PlanError: aggregation col("amount").median() cannot be computed
        incrementally: ...
        """
        named = tuple(
            expr.alias(name) if isinstance(expr, pl.Expr) else expr
            for name, expr in named_aggs.items()
        )
        specs = tuple(parse_aggregations(aggs + named))
        _refuse_aggregate_of_updates(self._stream.plan, "group_by(...).agg(...)")
        if self._accumulation_mode == "discarding":
            assert not isinstance(self._window, SessionWindowSpec)  # refused by group_by
            return self._stream._with_plan(
                DiscardingAggregateNode(self._stream.plan, self._window, self._keys, specs)
            )
        node = AggregateNode(self._stream.plan, self._window, self._keys, specs, self._ttl_ms)
        return self._stream._with_plan(node)

    def transform_with_state(
        self,
        fn: Callable[[StateInput], StateOutput],
        *,
        state_schema: Mapping[str, Any] | pl.Schema,
        output_schema: Mapping[str, Any] | pl.Schema | None = None,
        ttl: str | float | None = None,
        ttl_time: Literal["processing", "event"] = "processing",
        time_column: str | None = None,
        event_time_order: bool = False,
    ) -> Stream:
        """Arbitrary per-key state and timers; ``fn`` is called **once per batch**.

        Spark's ``transformWithState``, Flink's ``KeyedProcessFunction``, but
        vectorized: ``fn`` receives a :class:`~microbatch.plan.stateful.StateInput`
        of DataFrames (the batch's rows, the state of every key that has rows or
        a firing timer, the firing timers) and returns a
        :class:`~microbatch.plan.stateful.StateOutput` (rows to emit, state upserts
        and deletes, timers to register). Write ``fn`` with Polars expressions
        over all keys at once: there is no Python call per key on this path (for
        prototyping, :meth:`map_groups_with_state` calls a function per key).

        Event-time timers fire when the watermark passes them, processing-time
        timers when a batch's recorded timestamp reaches them (a re-run fires
        the same); an idle query still runs a batch when one is due. With
        ``time_column`` and a watermark, rows at or before the watermark are late.
        The state is versioned with the batches: replays are bit-identical, a
        crash never applies a batch twice. Adding a state column to
        ``state_schema`` later is accepted (it starts as null); other changes are
        refused on restart, naming the change.

        Parameters
        ----------
        fn
            ``fn(StateInput) -> StateOutput``.
        state_schema
            The state columns per key (besides the keys), ``{name: dtype}``.
        output_schema
            The columns of the emitted rows (checked and cast each batch).
        ttl
            Forget a key's state this long after ``ttl_time`` says (None: never).
        ttl_time
            ``"processing"``: ``ttl`` after the key's last state write, by the
            batches' recorded timestamps. ``"event"``: ``ttl`` after the newest
            event time of its rows, by the watermark (needs ``time_column``).
        time_column
            The rows' event-time column: late rows, and event-time TTL.
        event_time_order
            Hold each row in state until the watermark passes its event time,
            then give it to ``fn`` (once) in event-time order, ties in arrival
            order. Sequence rules ("the previous payment", "a gap of 5 minutes")
            then give the same result however the input is split into batches
            or disordered within the watermark delay, at the cost of the delay
            in latency. Needs ``time_column`` and a watermark on it.

        Returns
        -------
        Stream

        Examples
        --------
        A running count per card, and an alert the first time a card reaches 3:

        >>> def running_count(inp):
        ...     counts = (inp.rows.group_by("card").agg(pl.len().alias("new"))
        ...               .join(inp.state, on="card", how="left")
        ...               .with_columns(n=pl.col("new") + pl.col("n").fill_null(0)))
        ...     reached = counts.filter((pl.col("n") >= 3) & (pl.col("n") - pl.col("new") < 3))
        ...     return mb.StateOutput(rows=reached.select("card", "n"),
        ...                        upserts=counts.select("card", "n"))
        >>> pays = mb.read_memory(schema={"card": pl.Int64}, max_records_per_batch=2)
        >>> _ = pays.add({"card": [1, 1, 2, 1, 1]})
        >>> q = (pays.group_by("card")
        ...      .transform_with_state(running_count, state_schema={"n": pl.Int64},
        ...                            output_schema={"card": pl.Int64, "n": pl.Int64})
        ...      .write_memory("doc_transform").start(trigger="available-now"))
        >>> q.await_termination()
        True
        >>> mb.table("doc_transform").rows()
        [(1, 3)]
        """
        if self._window is not None:
            raise PlanError(
                "transform_with_state groups by keys only: drop the window from group_by "
                "(use event-time timers for time-based logic)"
            )
        ttl_ms = None if ttl is None else parse_duration_ms(ttl, what="transform_with_state ttl")
        on_event_time = event_time_order or (ttl_ms is not None and ttl_time == "event")
        marked = any(isinstance(n, WatermarkNode) for n in self._stream.plan.walk())
        if on_event_time and not marked:
            raise PlanError(
                "transform_with_state with event_time_order=True or ttl_time='event' waits for "
                "the watermark: add .with_watermark(time_column, delay) before group_by"
            )
        spec = TransformSpec.parse(self._keys, fn, state_schema=state_schema,
                                   output_schema=output_schema, ttl_ms=ttl_ms,
                                   ttl_time=ttl_time, time_column=time_column,
                                   event_time_order=event_time_order)
        return self._stream._with_plan(TransformNode(self._stream.plan, spec))

    def map_groups_with_state(
        self,
        fn: Callable[[tuple[Any, ...], pl.DataFrame, dict[str, Any] | None],
                     tuple[pl.DataFrame | None, dict[str, Any] | None]],
        *,
        state_schema: Mapping[str, Any] | pl.Schema,
        output_schema: Mapping[str, Any] | pl.Schema | None = None,
        ttl: str | float | None = None,
    ) -> Stream:
        """A per-key convenience for prototyping: ``fn`` is called **once per key**.

        ``fn(key, rows, state) -> (output rows or None, new state or None)``:
        ``key`` is the tuple of key values, ``rows`` the key's rows of the batch,
        ``state`` its state as a dict (``None`` when it has none); returning
        ``None`` as the state deletes it. Built on :meth:`transform_with_state`
        (same state store, checkpoints, replays and TTL), but it makes one Python
        call per key per batch: fine for a notebook, slow for a large key space.
        Move to ``transform_with_state`` for production.

        Examples
        --------
        >>> def total(key, rows, state):
        ...     new = (state or {"total": 0})["total"] + rows["amount"].sum()
        ...     return pl.DataFrame({"card": [key[0]], "total": [new]}), {"total": new}
        >>> pays = mb.read_memory(pl.DataFrame({"card": [1, 2, 1], "amount": [5, 7, 1]}))
        >>> q = (pays.group_by("card")
        ...      .map_groups_with_state(total, state_schema={"total": pl.Int64})
        ...      .write_memory("doc_map_groups").start(trigger="available-now"))
        >>> q.await_termination()
        True
        >>> mb.table("doc_map_groups").sort("card").rows()
        [(1, 6), (2, 7)]
        """
        keys = self._keys
        schema = pl.Schema(state_schema)

        def per_key(inp: StateInput) -> StateOutput:
            states = {tuple(r[k] for k in keys): {c: r[c] for c in schema}
                      for r in inp.state.iter_rows(named=True)}
            outputs, upserts, deletes = [], [], []
            for key, rows in inp.rows.group_by(list(keys), maintain_order=True):
                out, new = fn(key, rows, states.get(key))
                if out is not None:
                    outputs.append(out)
                if new is None:
                    deletes.append(dict(zip(keys, key, strict=True)))
                else:
                    upserts.append({**dict(zip(keys, key, strict=True)), **new})
            key_types = {k: inp.rows.schema[k] for k in keys}
            return StateOutput(
                rows=pl.concat(outputs, how="diagonal_relaxed") if outputs else None,
                upserts=pl.DataFrame(upserts, schema={**key_types, **schema})
                if upserts else None,
                deletes=pl.DataFrame(deletes, schema=key_types) if deletes else None,
            )

        per_key.__qualname__ = getattr(fn, "__qualname__", "map_groups_with_state")
        return self.transform_with_state(per_key, state_schema=schema,
                                         output_schema=output_schema, ttl=ttl)


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
    from microbatch.plan.event_time import event_time_ms, ms_to_time
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
            ms_to_time(window.start_of(pl.col("__ws")), dtype).alias("window_start"),
            ms_to_time(window.end_of(pl.col("__ws")), dtype).alias("window_end"),
        ).drop("__ws", "__mb_t")

    return Step("window_columns", (window.describe(),), apply)


def _flatten_keys(keys: Sequence[Any]) -> list[Any]:
    """``group_by("a", "b")``, ``group_by(["a", "b"])`` and mixes, as Polars takes."""
    flat: list[Any] = []
    for key in keys:
        flat.extend(key if isinstance(key, list | tuple) else [key])
    return flat


def _why_schema_unknown(plan: PlanNode) -> str:
    """Which node keeps a plan's schema from being known at build time."""
    for node in plan.walk():
        if isinstance(node, SourceNode) and node.source.schema is None:
            kind = node.source.describe().get("kind", "source")
            return (f"the {kind} source has no declared schema; pass schema={{...}} to its "
                    "reader to check columns when the query is built")
        if isinstance(node, StepNode) and node.step.opaque and node.step.declared_schema is None:
            return ("map_batches(fn) returns columns only fn knows; declare them with "
                    "map_batches(fn, schema={...})")
    return "a step's output depends on data (see explain())"


def stream_of(source: Any) -> Stream:
    """A stream reading from ``source``."""
    return Stream(SourceNode(source))


def _refuse_aggregate_of_updates(child: PlanNode, what: str) -> None:
    """Refuse ``what`` (an aggregation) over the result of a windowless ``group_by``
    reached through stateless steps only: that result is a stream of *updates*
    (each batch re-emits a key's new value), so aggregating its rows again would
    count every update as a new row, a wrong result without an error. Spark
    refuses multiple streaming aggregations the same way."""
    node = child
    while isinstance(node, StepNode | WatermarkNode):
        node = node.child
    if isinstance(node, AggregateNode) and node.window is None:
        raise ChangelogInputError(
            f"{what} over the result of a windowless group_by({', '.join(node.keys)}): "
            "that result is a stream of updates (every batch re-emits the new value of "
            "each key it changed), so a second aggregation would count each update as "
            "a new row. Aggregate in one step, window the first group_by (a window's "
            "result is emitted once, when it closes), or keep the running figures "
            "yourself with group_by(keys).transform_with_state(...)"
        )
