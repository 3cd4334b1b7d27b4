"""The driver's side of a scaled-out query: one batch across Ray workers.

Per batch (step 4 of the lifecycle, and the state part of step 6)::

    map      every worker: a contiguous slice of each source's rows -> the
             stateless steps -> rows entering the stateful nodes, cut by shard
    fold     the driver folds every worker's watermark facts into its tracker
    reduce   every worker, for each shard it owns: the pieces of all slices,
             in slice order -> the shard's operators -> output rows
    gather   output rows in shard order (late rows and metrics alike)
    commit   (after the driver's sink) every worker commits its shards' state

A worker that dies or stops answering anywhere in a batch is replaced; the
new set of workers loads every shard's last committed state and the batch is
run again from the rows the driver read for it (the same as re-reading its
write-ahead entry). After ``max_worker_restarts`` replacements in one batch
the query fails with :class:`~microbatch.ExecutorError`; a restart of the job
recovers from the checkpoint as always.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import polars as pl

from microbatch.distributed.cluster import RayConnection
from microbatch.distributed.sharding import ShardLayout, bind_layout, frontier
from microbatch.distributed.shipping import dumps_plan
from microbatch.distributed.worker import ShardWorker, from_wire, to_wire
from microbatch.engine.batch_executor import BatchExecutor
from microbatch.engine.durability import Durability
from microbatch.exceptions import ExecutorError, MicrobatchError
from microbatch.operators.base import OperatorContext
from microbatch.plan.nodes import PlanNode
from microbatch.types import OutputMode

log = logging.getLogger("microbatch.distributed")
T = TypeVar("T")


class ShardedRunner:
    """A :class:`~microbatch.engine.executors.PlanRunner` over Ray workers."""

    def __init__(
        self,
        plan: PlanNode,
        *,
        output_mode: OutputMode,
        durability: Durability,
        connection: RayConnection,
        workers: int,
        shards: int | None,
        default_shards: int,
        max_worker_restarts: int,
        worker_timeout_s: float,
    ) -> None:
        self.template = BatchExecutor(plan, output_mode=output_mode)
        self.tracker = self.template.tracker
        self.operators = self.template.operators
        self.output_mode: OutputMode = output_mode
        self.durability: Durability = durability
        self.connection = connection
        self.workers = workers
        self.explicit_shards = shards is not None
        self.layout = ShardLayout.for_plan(plan, shards or default_shards)
        self.frontier = frontier(plan)
        self.plan_blob = dumps_plan(plan)
        self.max_worker_restarts = max_worker_restarts
        self.worker_timeout_s = worker_timeout_s
        self.state_root: Path | None = None
        self.state_backend = "memory"
        """Where each shard keeps keyed state (set before ``open``: the driver's
        ``writer.start(state_backend=...)``); every worker is told."""
        self.batch_id = 0
        self.actors: list[Any] = []
        self.worker_info: list[dict[str, Any]] = []
        self.alive_nodes: list[str] = []
        self.restarts = 0
        self._metrics: dict[int, dict[str, Any]] = {}
        self.profile: dict[str, Any] = {}
        self._last: tuple[Mapping[str, pl.DataFrame], OperatorContext] | None = None

    # ------------------------------------------------------------ protocol

    @property
    def has_state(self) -> bool:
        return self.template.has_state

    def node_ids(self) -> dict[int, str]:
        return self.template.node_ids()

    def open(self, state_root: Path | None, batch_id: int) -> None:
        """Connect to Ray, fix the shard layout, start the workers at ``batch_id``."""
        if state_root is not None and self.template.has_state:
            self.layout = bind_layout(
                state_root, self.layout, has_batches=batch_id > 0, explicit=self.explicit_shards
            )
        self.connection.connect()
        if self.layout.mode == "single" and self.template.has_state and self.layout.shards > 1:
            log.warning(
                "the stateful operators of this query have no key in common, so every row "
                "goes to shard 0: it runs correctly on one worker, without speed-up"
            )
        self.state_root = state_root
        self.batch_id = batch_id
        self._with_replacement("start", batch_id, self._start_workers)

    def execute(self, inputs: Mapping[str, pl.DataFrame], ctx: OperatorContext) -> pl.DataFrame:
        self._last = (inputs, ctx)
        self._metrics = {}
        self.profile = {}
        return self._with_replacement("execute", ctx.batch_id, lambda: self._execute(inputs, ctx))

    def commit(self) -> None:
        batch_id = self.batch_id if self._last is None else self._last[1].batch_id

        def commit_all() -> None:
            t0 = time.perf_counter()
            done = self._get([a.commit.remote(batch_id) for a in self.actors])
            self._metrics = {s: m for part in done for s, m in part["metrics"].items()}
            self.profile["commit_ms"] = _ms(t0)
            self.profile["commit_busy_ms"] = [part["busy_ms"] for part in done]

        def again() -> None:  # new workers: run the batch again, then commit
            if self._last is not None:
                inputs, ctx = self._last
                # NOTE: a fresh context: the batch's late rows and metrics are already counted
                self._execute(inputs, OperatorContext(batch_id=ctx.batch_id,
                                                      watermark_ms=ctx.watermark_ms,
                                                      timestamp_ms=ctx.timestamp_ms))
            commit_all()

        try:
            commit_all()
        except _WorkerLost as lost:
            self._replace(batch_id, lost)
            self._with_replacement("commit", batch_id, again)
        self._last = None
        self.batch_id = batch_id + 1

    def abort(self) -> None:
        self._last = None
        try:
            self._get([a.abort.remote() for a in self.actors])
        except _WorkerLost as lost:  # new workers load the committed state anyway
            failure = lost
            self._with_replacement("abort", self.batch_id,
                                   lambda: self._replace(self.batch_id, failure))

    def has_expirable_state(self, watermark_ms: int | None) -> bool:
        if not self.template.has_state:
            return False
        return self._with_replacement(
            "plan", self.batch_id,
            lambda: any(self._get([a.has_expirable_state.remote(watermark_ms)
                                   for a in self.actors])),
        )

    def due(self, now_ms: int, watermark_ms: int | None) -> bool:
        if not self.template.has_state:
            return False
        return self._with_replacement(
            "plan", self.batch_id,
            lambda: any(self._get([a.due.remote(now_ms, watermark_ms) for a in self.actors])),
        )

    def state_metrics(self) -> dict[str, Any]:
        return merge_metrics([dict(shard) for _, shard in sorted(self._metrics.items())])

    def batch_profile(self) -> dict[str, Any] | None:
        return {
            "kind": "ray",
            "workers": len(self.actors),
            "shards": self.layout.shards,
            "shard_mode": self.layout.mode,
            "nodes": len({info["node_id"] for info in self.worker_info}),
            "restarts": self.restarts,
            **self.profile,
        }

    def close(self) -> None:
        import ray

        for actor in self.actors:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(actor)
        self.actors = []
        self.connection.release()

    # ------------------------------------------------------------ the batch

    def _execute(self, inputs: Mapping[str, pl.DataFrame], ctx: OperatorContext) -> pl.DataFrame:
        workers = len(self.actors)
        slices = {sid: slices_of(frame, workers) for sid, frame in inputs.items()}
        first = next(iter(inputs.values()), pl.DataFrame())
        starts = [start for start, _ in bounds(first.height, workers)]
        returns = 1 + (self.layout.shards if self.frontier else 0)
        t0 = time.perf_counter()
        mapped = [
            actor.map.options(num_returns=returns).remote(
                {sid: to_wire(parts[w]) for sid, parts in slices.items()}, starts[w], ctx
            )
            for w, actor in enumerate(self.actors)
        ]
        mapped = [m if isinstance(m, list) else [m] for m in mapped]
        facts = self._get([m[0] for m in mapped])
        profile: dict[str, Any] = {
            "map_ms": _ms(t0),
            "map_busy_ms": [f["busy_ms"] for f in facts],
            "exchanged_rows": sum(f["rows"] for f in facts),
            "exchanged_bytes": sum(f["bytes"] for f in facts),
        }
        t1 = time.perf_counter()
        observed = [obs for fact in facts for obs in fact["watermarks"]]
        if not self.frontier:
            output = concat([from_wire(f["output"]) for f in facts])
            late = [from_wire(frame) for f in facts for frame in f["late_rows"]]
            metrics: list[dict[str, Any]] = []
        else:
            owned = self._owned()
            reduced = self._get([
                actor.reduce.remote(
                    ctx, {s: [m[1 + s] for m in mapped] for s in owned[w]}
                )
                for w, actor in enumerate(self.actors)
            ])
            by_shard = {s: r for part in reduced for s, r in part.items()}
            ordered = [by_shard[s] for s in sorted(by_shard)]
            output = concat([from_wire(r["output"]) for r in ordered])
            late = [from_wire(frame) for r in ordered for frame in r["late_rows"]]
            observed += [obs for r in ordered for obs in r["watermarks"]]
            metrics = [r["metrics"] for r in ordered]
            profile["reduce_ms"] = _ms(t1)
            profile["shard_busy_ms"] = [r["busy_ms"] for r in ordered]
        for node_id, maxima in observed:  # max is order-free: any fold order gives one value
            self.tracker.fold(node_id, maxima, ctx.timestamp_ms)
        ctx.late_rows.extend(late)
        ctx.metrics.update(merge_metrics(metrics))
        self.profile = profile
        return output

    # ------------------------------------------------------------ workers

    def _owned(self) -> list[list[int]]:
        """Shard ``s`` belongs to worker ``s % workers``."""
        owned: list[list[int]] = [[] for _ in self.actors]
        for shard in range(self.layout.shards):
            owned[shard % len(self.actors)].append(shard)
        return owned

    def _start_workers(self) -> None:
        import ray

        for actor in self.actors:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(actor)
        # NOTE: round-robin over the alive nodes (Ray's SPREAD leaves zero-CPU actors together)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))  # type: ignore[no-untyped-call]
        self.alive_nodes = nodes
        remote = ray.remote(ShardWorker)
        self.actors = [
            remote.options(
                num_cpus=0, max_restarts=0, max_task_retries=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[w % len(nodes)],
                                                                   soft=False)
                if nodes else "SPREAD",
            ).remote(
                self.plan_blob,
                output_mode=self.output_mode,
                durability=self.durability,
                layout=self.layout,
                state_backend=self.state_backend,
                sys_path=list(sys.path),
            )
            for w in range(self.workers)
        ]
        owned = self._owned()
        root = None if self.state_root is None else str(self.state_root)
        self._get([a.open.remote(root, owned[w], self.batch_id)
                   for w, a in enumerate(self.actors)])
        self.worker_info = self._get([a.info.remote() for a in self.actors])
        nodes = sorted({info["node_id"][:12] for info in self.worker_info})
        log.info("%d Ray workers on nodes [%s] own %d shards (pids %s; %d nodes alive)",
                 len(self.actors), ", ".join(nodes), self.layout.shards,
                 [info["pid"] for info in self.worker_info], len(self.alive_nodes))

    def _replace(self, batch_id: int, lost: _WorkerLost) -> None:
        self.restarts += 1
        log.warning("batch %d: %s; replacing the workers (restart %d)", batch_id, lost,
                    self.restarts)
        self.batch_id = batch_id
        self._start_workers()

    def _with_replacement(self, step: str, batch_id: int, run: Callable[[], T]) -> T:
        """``run()``; when a worker is lost, new workers and ``run()`` again,
        at most ``max_worker_restarts`` times."""
        failures: list[str] = []
        while True:
            try:
                return run()
            except _WorkerLost as lost:
                failures.append(str(lost))
                if len(failures) > self.max_worker_restarts:
                    raise ExecutorError(
                        f"batch {batch_id} ({step}): Ray workers were lost "
                        f"{len(failures)} times ({'; '.join(failures[-3:])}). Nothing of "
                        "the batch is committed; check the Ray cluster (ray status, the "
                        "workers' logs), then start the job again: it re-runs the batch "
                        "from the checkpoint."
                    ) from lost
                try:
                    self._replace(batch_id, lost)
                except _WorkerLost as again:
                    failures.append(f"while replacing: {again}")
                    if len(failures) > self.max_worker_restarts:
                        raise ExecutorError(
                            f"batch {batch_id}: could not start Ray workers "
                            f"({'; '.join(failures[-3:])}). Check the Ray cluster."
                        ) from again

    def _get(self, refs: list[Any]) -> list[Any]:
        """``ray.get`` with the errors of lost workers as :class:`_WorkerLost`
        and the engine's own errors raised as they are."""
        import ray
        from ray import exceptions as rex

        try:
            return list(ray.get(refs, timeout=self.worker_timeout_s))
        except rex.GetTimeoutError as exc:
            raise _WorkerLost(
                f"no answer from a worker within {self.worker_timeout_s:g}s"
            ) from exc
        except rex.RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, MicrobatchError):
                raise cause from None
            if isinstance(cause, rex.RayActorError | rex.ObjectLostError):
                raise _WorkerLost(f"{type(cause).__name__}: {first_line(cause)}") from exc
            if isinstance(cause, BaseException):
                raise cause from exc
            raise
        except (rex.RayActorError, rex.ObjectLostError, rex.OwnerDiedError) as exc:
            raise _WorkerLost(f"{type(exc).__name__}: {first_line(exc)}") from exc


class _WorkerLost(Exception):
    """A worker died or did not answer (internal: replaced, then retried)."""


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 3)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def bounds(rows: int, pieces: int) -> list[tuple[int, int]]:
    """(offset, length) of ``pieces`` contiguous slices covering ``rows`` rows."""
    size, extra = divmod(rows, pieces)
    out, start = [], 0
    for i in range(pieces):
        length = size + (1 if i < extra else 0)
        out.append((start, length))
        start += length
    return out


def slices_of(frame: pl.DataFrame, pieces: int) -> list[pl.DataFrame]:
    """``frame`` cut into ``pieces`` contiguous slices (each keeps the schema)."""
    return [frame.slice(offset, length) for offset, length in bounds(frame.height, pieces)]


def concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """Frames of one schema one after the other (frames without columns: an
    operator that never saw a row)."""
    wide = [f for f in frames if f.width]
    if not wide:
        return frames[0] if frames else pl.DataFrame()
    return pl.concat(wide, how="vertical_relaxed") if len(wide) > 1 else wide[0]


def merge_metrics(per_shard: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Operator metrics of all shards: numbers summed (rows, bytes, time spent),
    anything else from the first shard that has it."""
    out: dict[str, dict[str, Any]] = {}
    for shard in per_shard:
        for op, values in shard.items():
            merged = out.setdefault(op, {})
            for key, value in values.items():
                if isinstance(value, bool) or not isinstance(value, int | float):
                    merged.setdefault(key, value)
                else:
                    merged[key] = merged.get(key, 0) + value
    return out
