"""One worker of a scaled-out query: a Ray actor that runs stateless steps on
slices of a batch and owns some shards of the state.

Per batch the driver calls :meth:`ShardWorker.map` on every worker (its split
of each source, which it reads itself, or a slice of rows the driver read ->
the rows entering the plan's stateful nodes, cut into one piece per shard),
then :meth:`ShardWorker.reduce` (each owned shard: the pieces of all workers,
in slice order -> the shard's operators -> its output rows -> the shard's
state committed as the next version), all launched at once: one exchange per
batch (docs/scale-out.md). Given the sink's :class:`~sinks.base.WriteTask`
(``write_task=``), the worker writes the output rows as the sink's data files
itself and returns their descriptions instead of the rows; the driver commits
them. Each shard is a
:class:`~microbatch.engine.batch_executor.BatchExecutor` over the shard's own state
directory, so a shard behaves exactly as the whole query does in one process,
for the keys that hash to it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from microbatch.distributed.sharding import ShardLayout, frontier
from microbatch.distributed.shipping import loads_plan
from microbatch.engine.batch_executor import HIDDEN, BatchExecutor
from microbatch.engine.durability import Durability, durability_level
from microbatch.engine.faults import fault_point
from microbatch.engine.split_reads import input_of
from microbatch.engine.watermark import PARTITION_COLUMN, WatermarkTracker
from microbatch.operators.base import OperatorContext
from microbatch.operators.changes import sink_rows
from microbatch.operators.window_agg import WindowAggregate
from microbatch.plan.nodes import StatefulNode
from microbatch.sources.base import ReadSplit
from microbatch.types import OutputMode
from sinks.base import WriteTask, WrittenFile

Observation = tuple[str, dict[str, int]]
"""(watermark node id, max event time per source partition) seen by a worker."""


class ObservingTracker(WatermarkTracker):
    """A tracker that keeps what it observes for the driver instead of folding
    it: the watermark is the driver's, computed from every worker's rows."""

    def __init__(self, base: WatermarkTracker) -> None:
        super().__init__(base.specs, base.policy)
        self.seen: list[Observation] = []

    def observe(self, node_id: str, df: pl.DataFrame, batch_timestamp_ms: int) -> None:
        found = self.maxima(node_id, df, batch_timestamp_ms)
        if found:
            self.seen.append((node_id, found))

    def take(self) -> list[Observation]:
        seen, self.seen = self.seen, []
        return seen


def to_wire(df: pl.DataFrame) -> pa.Table:
    """A frame as Ray moves it fastest: Arrow (zero-copy through the object
    store; a pickled Polars frame is copied, ~4x slower for 1M rows)."""
    return df.to_arrow()


def from_wire(table: pa.Table) -> pl.DataFrame:
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


COMBINED = "combined"
"""The key of a map piece holding its pre-aggregated points' late rows and facts."""
ROWS_NEEDED = -1
"""The key of a reduce answer asking for the batch again with rows (no combiner)."""
MAX_PARTIAL_SHARE = 0.5
"""A slice's partial rows above this share of its rows: the rows travel instead
(nearly one group per row: the partials, with their wider sums, are larger)."""
MIN_COMBINE_ROWS = 64
"""Slices with fewer rows always ship their partials (too few to judge)."""
RETRY_COMBINE_EVERY = 16
"""Batches between tries of a point whose partials did not pay."""
HOT_KEY_SAMPLE = 8192
"""Rows of a shard's input sampled (evenly spaced) to name its most frequent key."""


def _visible(frame: pl.DataFrame) -> pl.DataFrame:
    """A frontier frame as an operator that drops hidden columns sees it."""
    if PARTITION_COLUMN in frame.columns:
        return frame.select(pl.exclude(HIDDEN))
    return frame


def _tables(piece: dict[Any, Any]) -> list[pa.Table]:
    """Every Arrow table of a map piece (rows, partials, late rows)."""
    out = [t for k, t in piece.items() if k != COMBINED]
    for mark in piece.get(COMBINED, {}).values():
        if mark["late"] is not None:
            out.append(mark["late"])
    return out


def hot_key(
    layout: ShardLayout, exchanged: dict[tuple[int, int], pl.DataFrame], rows: int,
    min_rows: int | None,
) -> dict[str, Any] | None:
    """The most frequent shard key among a shard's input rows (estimated from an
    evenly spaced sample of at most ``HOT_KEY_SAMPLE`` rows), with its share of the
    sample; ``None`` below ``min_rows`` rows or without a shard key."""
    if min_rows is None or rows < min_rows or layout.mode != "hash":
        return None
    cols = list(layout.columns)
    frame = max((f for f in exchanged.values() if all(c in f.columns for c in cols)),
                key=lambda f: f.height, default=None)
    if frame is None or not frame.height:
        return None
    sample = frame.select(cols).gather_every(max(1, frame.height // HOT_KEY_SAMPLE))
    top = sample.group_by(cols).len().sort("len", descending=True, maintain_order=True).row(
        0, named=True)
    share = top.pop("len") / sample.height
    return {"key": {c: _plain(v) for c, v in top.items()}, "share": round(share, 3)}


def _plain(value: Any) -> Any:
    """A key value as JSON can hold it."""
    return value if value is None or isinstance(value, bool | int | float | str) else str(value)


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 3)


def shard_dir(state_root: Path, shard: int) -> Path:
    """Where shard ``shard`` keeps its operators' state."""
    return state_root / "shards" / f"{shard:04d}"


class ShardWorker:
    """The body of a worker actor (wrapped with ``ray.remote`` by the driver)."""

    def __init__(
        self,
        plan_blob: bytes,
        *,
        output_mode: OutputMode,
        durability: Durability,
        layout: ShardLayout,
        sys_path: list[str],
        state_backend: str = "memory",
    ) -> None:
        for entry in reversed(sys_path):  # the driver's imports (job files' directories)
            if entry not in sys.path:
                sys.path.insert(0, entry)
        self.plan = loads_plan(plan_blob)
        self.output_mode: OutputMode = output_mode
        self.durability: Durability = durability
        self.layout = layout
        self.state_backend = state_backend
        self.frontier = frontier(self.plan)
        # NOTE: the plan's sources are stubs here (position, schema): see shipping
        self.source_schemas: dict[str, pl.Schema | None] = {
            str(i): s.schema for i, s in enumerate(self.plan.sources())}
        self.mapper = self._executor()
        self.nodes = list(self.plan.walk())
        self.partial_share: dict[tuple[int, int], float] = {}
        self.shards: dict[int, BatchExecutor] = {}
        self.state_root: str | None = None

    def _executor(self) -> BatchExecutor:
        executor = BatchExecutor(self.plan, output_mode=self.output_mode,
                                 state_backend=self.state_backend)
        executor.tracker = ObservingTracker(executor.tracker)
        return executor

    def info(self) -> dict[str, Any]:
        """The worker's process id and Ray node (for tests, logs and status)."""
        import ray

        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()}

    def open(self, state_root: str | None, shards: list[int], batch_id: int) -> None:
        """Own ``shards`` from batch ``batch_id`` on: load their state."""
        self.shards = {}
        self.state_root = state_root
        with durability_level(self.durability):
            for shard in shards:
                executor = self._executor()
                executor.open(None if state_root is None else shard_dir(Path(state_root), shard),
                              batch_id)
                self.shards[shard] = executor

    def map(
        self,
        inputs: dict[str, pa.Table],
        first_row: int,
        ctx: OperatorContext,
        *,
        splits: dict[str, ReadSplit] | None = None,
        partitions: bool = False,
        write_task: WriteTask | None = None,
        combine: bool = False,
    ) -> Any:
        """Stateless steps over a slice of the batch: ``(facts, piece of shard 0,
        piece of shard 1, ...)``, each piece the rows entering each exchange
        point; without stateful nodes, only ``facts``, whose ``"output"`` holds
        the result (``"written"``: the files ``write_task`` wrote of it).

        The slice is ``inputs`` (rows the driver read) and, for the sources in
        ``splits``, what this worker reads of them itself (``partitions``: with
        their partition ids, for per-partition watermarks); ``facts["read"]``
        then says what it read (rows and schema per source, dead letters).

        With ``combine``, a point feeding an aggregation whose partials merge
        exactly (:meth:`WindowAggregate.combine_plan`) gets the slice's partials
        per (window, keys) instead of its rows, with its late rows and facts
        under ``piece[COMBINED][point]``."""
        fault_point("worker.map", ctx.batch_id)
        t0 = time.perf_counter()
        frames = {sid: from_wire(table) for sid, table in inputs.items()}
        read = None if splits is None else self._read(splits, frames, partitions=partitions)
        if not self.frontier:
            output = self.mapper.execute(frames, ctx)
            facts = {"watermarks": self._observed(self.mapper),
                     "late_rows": [to_wire(f) for f in ctx.late_rows], "rows": 0, "bytes": 0,
                     "read": read, "routed_rows": []}
            if write_task is None:
                facts["output"] = to_wire(output)
            else:
                with durability_level(self.durability):
                    facts["written"] = self._write(write_task, output, first_row, ctx.batch_id)
            facts["busy_ms"] = _ms(t0)
            return facts
        exchanged = self.mapper.stateless_inputs(self.frontier, frames, ctx)
        pieces: list[dict[Any, Any]] = [{} for _ in range(self.layout.shards)]
        routed = [0] * self.layout.shards
        for point, frame in exchanged.items():
            combiner = self._combiner(point) if combine else None
            if combiner is not None and not self._worth_combining(point, ctx.batch_id):
                combiner = None
            tried = [0, 0]  # partial rows, rows: the point's share, for the next batches
            for shard, part in enumerate(self.layout.split(frame, first_row)):
                routed[shard] += part.height
                got = None
                visible = _visible(part)
                if combiner is not None:
                    got = combiner.combine_slice(visible, ctx)
                    # NOTE: a slice without partials (they cannot be exact) counts as one
                    # group per row: it did not pay, and the next batches stop trying
                    tried[0] += part.height if got is None else got[0].height
                    tried[1] += part.height
                    if got is not None:
                        share = got[0].height / max(part.height, 1)
                        if share > MAX_PARTIAL_SHARE and part.height >= MIN_COMBINE_ROWS:
                            got = None  # as many groups as rows: the rows are smaller
                if got is None:
                    pieces[shard][point] = to_wire(part)
                    continue
                partials, late, facts = got
                pieces[shard][point] = to_wire(partials)
                pieces[shard].setdefault(COMBINED, {})[point] = {
                    "late": None if late is None else to_wire(late),
                    "facts": facts,
                    "schema": to_wire(visible.head(0)),
                }
            if tried[1]:
                self.partial_share[point] = tried[0] / tried[1]
        tables = [t for piece in pieces for t in _tables(piece)]
        facts = {
            "watermarks": self._observed(self.mapper),
            "busy_ms": _ms(t0),
            "rows": sum(t.num_rows for t in tables),
            "bytes": sum(t.nbytes for t in tables),
            "routed_rows": routed,
            "read": read,
        }
        return (facts, *pieces)

    def _worth_combining(self, point: tuple[int, int], batch_id: int) -> bool:
        """Whether to pre-aggregate at ``point`` this batch: not while the last
        slices had nearly as many groups as rows, tried again every
        ``RETRY_COMBINE_EVERY`` batches (the keys may repeat more later)."""
        share = self.partial_share.get(point)
        return share is None or share <= MAX_PARTIAL_SHARE or batch_id % RETRY_COMBINE_EVERY == 0

    def _combiner(self, point: tuple[int, int]) -> WindowAggregate | None:
        """The operator at exchange point ``point`` when it can pre-aggregate."""
        node = self.nodes[point[0]]
        op = self.mapper.operator_at(point[0])
        if not isinstance(node, StatefulNode) or node.keeps_hidden_columns:
            return None
        return op if isinstance(op, WindowAggregate) and len(node.children) == 1 else None
    def _read(
        self, splits: dict[str, ReadSplit], frames: dict[str, pl.DataFrame], *, partitions: bool
    ) -> dict[str, Any]:
        """Read each source's split into ``frames`` as the driver's step 3 would
        (:func:`~microbatch.engine.split_reads.input_of`): what was read."""
        t0 = time.perf_counter()
        rows: dict[str, int] = {}
        schemas: dict[str, pl.Schema] = {}
        dead: list[pa.Table] = []
        for sid, split in splits.items():
            got = split.read()
            declared = self.source_schemas.get(sid)
            seen = input_of(got, declared, partitions=False)
            if seen.width:
                schemas[sid] = seen.schema
            frames[sid] = input_of(got, declared, partitions=partitions)
            rows[sid] = seen.height
            if got.dead_letters.height:
                dead.append(to_wire(got.dead_letters))
        return {"rows": rows, "schemas": schemas, "dead": dead, "busy_ms": _ms(t0)}

    @staticmethod
    def _observed(executor: BatchExecutor) -> list[Observation]:
        tracker = executor.tracker
        assert isinstance(tracker, ObservingTracker)
        return tracker.take()

    def _write(
        self, task: WriteTask, output: pl.DataFrame, part: int, batch_id: int
    ) -> list[WrittenFile]:
        """``output`` as the sink's data files (as the sink receives rows)."""
        written = task.write(sink_rows(output, self.output_mode), part)
        fault_point("worker.after_write", batch_id)
        return written

    def _take_partials(
        self, shard: int, point: tuple[int, int], got: list[dict[Any, Any]],
        marks: list[Any], ctx: OperatorContext,
    ) -> pl.DataFrame | str:
        """Hand the slices' partials at ``point`` (pre-aggregated on the map side,
        or here for a slice that shipped rows) to shard ``shard``'s aggregation:
        the point's (empty) input frame, or why the batch needs rows instead
        (``"layout"``: this state cannot take partials, an older checkpoint's
        layout; ``"data"``: these rows must be summed their other way)."""
        op = self.shards[shard].operator_at(point[0])
        assert isinstance(op, WindowAggregate)  # only its map side pre-aggregates
        schema = from_wire(next(m for m in marks if m is not None)["schema"])
        parts, lates = [], []
        for g, m in zip(got, marks, strict=True):
            if m is None:  # a slice that shipped rows: its partials here
                here = op.combine_slice(_visible(from_wire(g[point])), ctx)
                if here is None:
                    break
                parts.append((here[0], here[2]))
                lates.append(here[1])
            else:
                parts.append((from_wire(g[point]), m["facts"]))
                lates.append(None if m["late"] is None else from_wire(m["late"]))
        if len(parts) == len(got) and op.take_partials(schema.schema, parts, lates):
            return schema
        return "layout" if op.combine_plan(schema.schema) is None else "data"

    def reduce(
        self, ctx: OperatorContext, pieces: dict[int, list[Any]], *resolved: Any,
        commit: bool = False, hot_key_rows: int | None = None,
        write_task: WriteTask | None = None,
    ) -> dict[int, dict[str, Any]]:
        """Each owned shard's operators over its pieces (object refs, in slice
        order; or positions in ``resolved``, pieces passed as top-level arguments,
        which Ray hands over resolved: no fetch from here): per shard, its
        output rows (with ``write_task``: the files it wrote of them,
        ``"written"``), late rows, metrics, watermark facts, the rows that
        entered it and its busy time.

        With ``commit``, every owned shard's state is then made version N+1
        (durably, before the answer): the driver's ``commits/N`` follows the
        answer, so a batch that does not reach it re-runs from version N, whose
        load drops the orphaned N+1.

        Pre-aggregated pieces (``map(..., combine=True)``) are merged first, for
        every owned shard; when some cannot be merged exactly here (a float
        column's magnitudes too far apart over the shard's rows, a slice that
        shipped rows, a checkpoint whose state layout sums floats in row order)
        the answer is ``{ROWS_NEEDED: {"reason": ...}}`` before any shard ran, and
        the driver runs the batch again with rows. Slices that shipped rows
        beside others' partials (too many groups to pay) are pre-aggregated here.
        With ``hot_key_rows``, a shard with at least that many input rows names
        its most frequent shard key."""
        import ray

        fault_point("worker.reduce", ctx.batch_id)
        out: dict[int, dict[str, Any]] = {}
        fetched: dict[int, list[dict[Any, Any]]] = {
            shard: [resolved[i] for i in refs] if resolved else ray.get(refs)
            for shard, refs in sorted(pieces.items())
        }
        inputs: dict[int, dict[tuple[int, int], pl.DataFrame]] = {}
        for shard, got in fetched.items():
            t0 = time.perf_counter()
            inputs[shard] = {}
            for point in self.frontier:
                marks = [g.get(COMBINED, {}).get(point) for g in got]
                if all(m is None for m in marks):
                    inputs[shard][point] = pl.concat(
                        [from_wire(g[point]) for g in got], how="vertical", rechunk=True)
                    continue
                merged = self._take_partials(shard, point, got, marks, ctx)
                if isinstance(merged, str):
                    for executor in self.shards.values():  # nothing ran: drop what was taken
                        executor.abort()
                    return {ROWS_NEEDED: {"reason": merged}}
                inputs[shard][point] = merged
            fetched[shard] = [{"busy_ms": _ms(t0)}]
        with durability_level(self.durability):
            for shard in sorted(fetched):
                t0 = time.perf_counter()
                exchanged = inputs[shard]
                shard_ctx = OperatorContext(
                    batch_id=ctx.batch_id, watermark_ms=ctx.watermark_ms,
                    timestamp_ms=ctx.timestamp_ms,
                )
                executor = self.shards[shard]
                rows = sum(frame.height for frame in exchanged.values())
                rows += sum(op.pending_rows() for op in executor.operators
                            if hasattr(op, "pending_rows"))
                output = executor.execute({}, shard_ctx, exchanged)
                out[shard] = {
                    "late_rows": [to_wire(f) for f in shard_ctx.late_rows],
                    "metrics": shard_ctx.metrics,
                    "watermarks": self._observed(executor),
                    "rows": rows,
                    "hot_key": hot_key(self.layout, exchanged, rows, hot_key_rows),
                }
                if write_task is None:
                    out[shard]["output"] = to_wire(output)
                else:
                    out[shard]["written"] = self._write(write_task, output, shard, ctx.batch_id)
                out[shard]["busy_ms"] = round(_ms(t0) + fetched[shard][0]["busy_ms"], 3)
            if commit:
                fault_point("worker.commit", ctx.batch_id)
                for shard in sorted(out):
                    t0 = time.perf_counter()
                    self.shards[shard].commit()
                    out[shard]["commit_ms"] = _ms(t0)
                    out[shard]["state"] = self.shards[shard].state_metrics()
                fault_point("worker.after_commit", ctx.batch_id)
        return out

    def commit(self, batch_id: int) -> dict[str, Any]:
        """Make every owned shard's staged state the next version: their
        metrics (by shard) and the time it took (a reduce without ``commit``)."""
        fault_point("worker.commit", batch_id)
        t0 = time.perf_counter()
        with durability_level(self.durability):
            for executor in self.shards.values():
                executor.commit()
        return {"metrics": {shard: ex.state_metrics() for shard, ex in self.shards.items()},
                "busy_ms": _ms(t0)}

    def abort(self, batch_id: int | None = None) -> None:
        """Drop the batch's staged state; with ``batch_id``, reload every owned
        shard at that batch (version ``batch_id``: a reduce that committed
        ``batch_id + 1`` is undone, its files dropped by the load)."""
        for executor in self.shards.values():
            executor.abort()
        if batch_id is not None and self.state_root is not None:
            self.open(self.state_root, sorted(self.shards), batch_id)

    def due(self, now_ms: int, watermark_ms: int | None) -> bool:
        return any(ex.due(now_ms, watermark_ms) for ex in self.shards.values())

    def has_expirable_state(self, watermark_ms: int | None) -> bool:
        return any(ex.has_expirable_state(watermark_ms) for ex in self.shards.values())
