"""One worker of a scaled-out query: a Ray actor that runs stateless steps on
slices of a batch and owns some shards of the state.

Per batch the driver calls :meth:`ShardWorker.map` on every worker (a slice
of each source's rows -> the rows entering the plan's stateful nodes, cut into
one piece per shard), then :meth:`ShardWorker.reduce` (each owned shard: the
pieces of all workers, in slice order -> the shard's operators -> its output
rows), then :meth:`ShardWorker.commit`. Each shard is a
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
from microbatch.engine.batch_executor import BatchExecutor
from microbatch.engine.durability import Durability, durability_level
from microbatch.engine.faults import fault_point
from microbatch.engine.watermark import WatermarkTracker
from microbatch.operators.base import OperatorContext
from microbatch.types import OutputMode

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
        self.mapper = self._executor()
        self.shards: dict[int, BatchExecutor] = {}

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
        with durability_level(self.durability):
            for shard in shards:
                executor = self._executor()
                executor.open(None if state_root is None else shard_dir(Path(state_root), shard),
                              batch_id)
                self.shards[shard] = executor

    def map(
        self, inputs: dict[str, pa.Table], first_row: int, ctx: OperatorContext
    ) -> Any:
        """Stateless steps over a slice of the batch: ``(facts, piece of shard 0,
        piece of shard 1, ...)``, each piece the rows entering each exchange
        point; without stateful nodes, only ``facts``, whose ``"output"`` holds
        the result."""
        fault_point("worker.map", ctx.batch_id)
        t0 = time.perf_counter()
        frames = {sid: from_wire(table) for sid, table in inputs.items()}
        if not self.frontier:
            output = self.mapper.execute(frames, ctx)
            return {"output": to_wire(output), "watermarks": self._observed(self.mapper),
                    "late_rows": [to_wire(f) for f in ctx.late_rows], "busy_ms": _ms(t0),
                    "rows": 0, "bytes": 0}
        exchanged = self.mapper.stateless_inputs(self.frontier, frames, ctx)
        pieces: list[dict[tuple[int, int], pa.Table]] = [{} for _ in range(self.layout.shards)]
        for point, frame in exchanged.items():
            for shard, part in enumerate(self.layout.split(frame, first_row)):
                pieces[shard][point] = to_wire(part)
        facts = {
            "watermarks": self._observed(self.mapper),
            "busy_ms": _ms(t0),
            "rows": sum(t.num_rows for piece in pieces for t in piece.values()),
            "bytes": sum(t.nbytes for piece in pieces for t in piece.values()),
        }
        return (facts, *pieces)

    @staticmethod
    def _observed(executor: BatchExecutor) -> list[Observation]:
        tracker = executor.tracker
        assert isinstance(tracker, ObservingTracker)
        return tracker.take()

    def reduce(
        self, ctx: OperatorContext, pieces: dict[int, list[Any]]
    ) -> dict[int, dict[str, Any]]:
        """Each owned shard's operators over its pieces (object refs, in slice
        order): per shard, its output rows, late rows, metrics, watermark facts."""
        import ray

        fault_point("worker.reduce", ctx.batch_id)
        out: dict[int, dict[str, Any]] = {}
        with durability_level(self.durability):
            for shard, refs in sorted(pieces.items()):
                got: list[dict[tuple[int, int], pa.Table]] = ray.get(refs)
                t0 = time.perf_counter()
                exchanged = {
                    point: pl.concat([from_wire(g[point]) for g in got], how="vertical",
                                     rechunk=True)
                    for point in self.frontier
                }
                shard_ctx = OperatorContext(
                    batch_id=ctx.batch_id, watermark_ms=ctx.watermark_ms,
                    timestamp_ms=ctx.timestamp_ms,
                )
                executor = self.shards[shard]
                output = executor.execute({}, shard_ctx, exchanged)
                out[shard] = {
                    "output": to_wire(output),
                    "late_rows": [to_wire(f) for f in shard_ctx.late_rows],
                    "metrics": shard_ctx.metrics,
                    "watermarks": self._observed(executor),
                    "busy_ms": _ms(t0),
                }
        return out

    def commit(self, batch_id: int) -> dict[str, Any]:
        """Make every owned shard's staged state the next version: their
        metrics (by shard) and the time it took."""
        fault_point("worker.commit", batch_id)
        t0 = time.perf_counter()
        with durability_level(self.durability):
            for executor in self.shards.values():
                executor.commit()
        return {"metrics": {shard: ex.state_metrics() for shard, ex in self.shards.items()},
                "busy_ms": _ms(t0)}

    def abort(self) -> None:
        for executor in self.shards.values():
            executor.abort()

    def due(self, now_ms: int, watermark_ms: int | None) -> bool:
        return any(ex.due(now_ms, watermark_ms) for ex in self.shards.values())

    def has_expirable_state(self, watermark_ms: int | None) -> bool:
        return any(ex.has_expirable_state(watermark_ms) for ex in self.shards.values())
