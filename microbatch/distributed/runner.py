"""The driver's side of a scaled-out query: one batch across Ray workers.

Per batch (step 4 of the lifecycle, and the state part of step 6), one
exchange: the driver launches every task at once and waits once::

    map      every worker: its split of each source, read by itself (the driver
             planned one split per worker from the recorded range), or a
             contiguous slice of rows the driver read -> the stateless steps
             -> rows entering the stateful nodes, cut by shard (pre-aggregated
             per window and key where the partials merge exactly)
    reduce   every worker, for each shard it owns: the pieces of all slices
             (object refs, resolved worker to worker), in slice order -> the
             shard's operators -> output rows (or, given the sink's write task,
             the sink's data files written here); then the shard's state is
             committed as version N+1 (durably) before the answer
    gather   the maps' watermark facts and the reduces' answers together;
             output rows in shard order (late rows and metrics alike), or the
             files' descriptions, for the driver's sink commit

``commit()`` is then a no-op on the workers: the engine writes ``commits/N``
after the sink, and a batch that does not reach ``commits/N`` re-runs from
version N, whose load drops the orphaned N+1 (the version rule of
``statestore/contract.py``); ``abort()`` reloads version N on every worker.

A worker that dies or stops answering anywhere in a batch is replaced; the
new set of workers loads every shard's last committed state and the batch is
run again from the same splits (read again) or the rows the driver read for
it (the same as re-reading its write-ahead entry). After
``max_worker_restarts`` replacements in one batch the query fails with
:class:`~microbatch.ExecutorError`; a restart of the job recovers from the
checkpoint as always.
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
from microbatch.distributed.worker import ROWS_NEEDED, ShardWorker, from_wire, to_wire
from microbatch.engine.batch_executor import BatchExecutor
from microbatch.engine.durability import Durability
from microbatch.engine.split_reads import BatchInputs, splits_for
from microbatch.exceptions import ExecutorError, MicrobatchError
from microbatch.operators.base import OperatorContext
from microbatch.plan.nodes import PlanNode
from microbatch.types import OutputMode
from sinks.base import WriteTask, WrittenBatch

log = logging.getLogger("microbatch.distributed")

HEALTH_CHECK_S = 0.5
"""How often a driver waiting on its workers looks at the cluster's health
(a GCS call; only while a step takes longer than this)."""
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
        worker_reads: bool = True,
        combine: bool = True,
        skew_alarm: float = 2.0,
        skew_min_rows: int = 10_000,
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
        self.combine = combine
        self.skew_alarm = skew_alarm
        self.skew_min_rows = skew_min_rows
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
        self.worker_reads = worker_reads
        self._last: tuple[BatchInputs, OperatorContext] | None = None

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

    @property
    def read_pieces(self) -> int | None:
        """One split per worker of each source's range (``None``: the driver reads,
        ``RayExecutor(worker_reads=False)``)."""
        return self.workers if self.worker_reads else None

    def execute(self, inputs: Mapping[str, pl.DataFrame], ctx: OperatorContext) -> pl.DataFrame:
        """The batch from rows the driver read (each worker maps a slice)."""
        return self.execute_splits(BatchInputs(dict(inputs)), ctx)

    def execute_splits(self, inputs: BatchInputs, ctx: OperatorContext) -> pl.DataFrame:
        """The batch from ``inputs``: worker ``w`` reads split ``w`` of every source
        (and a slice of any frame the driver read), then maps it."""
        self._last = (inputs, ctx)
        self._metrics = {}
        self.profile = {}

        def run() -> pl.DataFrame:
            output = self._execute(inputs, ctx)
            assert isinstance(output, pl.DataFrame)
            return output

        return self._with_replacement("execute", ctx.batch_id, run)

    def execute_writing(
        self, inputs: BatchInputs, ctx: OperatorContext, task: WriteTask
    ) -> WrittenBatch:
        """:meth:`execute`, with the output rows written by the workers as ``task``
        says: the descriptions of the files, for the driver's sink commit. A lost
        worker's re-run writes new files (the lost attempt's stay unreferenced)."""
        self._last = (inputs, ctx)
        self._metrics = {}
        self.profile = {}

        def run() -> WrittenBatch:
            written = self._execute(inputs, ctx, task)
            assert isinstance(written, WrittenBatch)
            return written

        return self._with_replacement("execute", ctx.batch_id, run)

    def commit(self) -> None:
        """Batch N's state is already version N+1 on every shard: each reduce
        committed it, durably, before answering (no round trip here). The engine
        writes ``commits/N`` after this returns, so a crash before that re-runs
        batch N, which loads version N and drops the orphaned N+1."""
        batch_id = self.batch_id if self._last is None else self._last[1].batch_id
        self._last = None
        self.batch_id = batch_id + 1

    def abort(self) -> None:
        """Every shard back to version N (the reduce may have committed N+1):
        the workers reload the last committed state, as new workers would."""
        self._last = None
        try:
            self._get([a.abort.remote(self.batch_id) for a in self.actors])
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

    def _execute(
        self, inputs: BatchInputs, ctx: OperatorContext,
        write_task: WriteTask | None = None,
    ) -> pl.DataFrame | WrittenBatch:
        combine = self.combine and bool(self.frontier)
        got = self._exchange(inputs, ctx, combine=combine, write_task=write_task)
        if got is None:  # a shard could not merge the partials exactly: rows, this once
            self._get([a.abort.remote(ctx.batch_id) for a in self.actors])
            got = self._exchange(inputs, ctx, combine=False, write_task=write_task)
            assert got is not None
        output, late, observed, metrics, profile, reads = got
        if inputs.on_workers:
            gather_reads(inputs, reads)
        for node_id, maxima in observed:  # max is order-free: any fold order gives one value
            self.tracker.fold(node_id, maxima, ctx.timestamp_ms)
        ctx.late_rows.extend(late)
        ctx.metrics.update(merge_metrics(metrics))
        self.profile = profile
        return output

    def _exchange(
        self, inputs: BatchInputs, ctx: OperatorContext, *, combine: bool,
        write_task: WriteTask | None,
    ) -> tuple[pl.DataFrame | WrittenBatch, list[pl.DataFrame], list[Any],
               list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]] | None:
        """One exchange of the batch: the output (rows, or with ``write_task`` the
        files the workers wrote), late rows, watermark facts, per-shard metrics,
        the profile and what each worker read of its splits; ``None`` when a
        reduce asks for rows."""
        workers = len(self.actors)
        slices = {sid: [to_wire(part) for part in slices_of(frame, workers)]
                  for sid, frame in inputs.frames.items()}
        # NOTE: with splits, a worker's first row in the batch is unknown before it
        # reads; only the "spread" layout uses it (no keyed state: any shard will do)
        first = next(iter(inputs.frames.values()), pl.DataFrame())
        starts = [start for start, _ in bounds(first.height, workers)]
        returns = 1 + (self.layout.shards if self.frontier else 0)
        t0 = time.perf_counter()
        mapped = [
            actor.map.options(num_returns=returns).remote(
                {sid: parts[w] for sid, parts in slices.items()}, starts[w], ctx,
                combine=combine, write_task=write_task,
                **({"splits": splits_for(inputs, w), "partitions": inputs.partitions}
                   if inputs.on_workers else {}),
            )
            for w, actor in enumerate(self.actors)
        ]
        mapped = [m if isinstance(m, list) else [m] for m in mapped]
        metrics: list[dict[str, Any]] = []
        if not self.frontier:
            facts = self._get([m[0] for m in mapped])
            late = [from_wire(frame) for f in facts for frame in f["late_rows"]]
            observed = [obs for fact in facts for obs in fact["watermarks"]]
            profile = self._profile(t0, facts, [{} for _ in facts])
            output = self._gather(facts, write_task, ctx.batch_id, profile)
        else:
            # NOTE: one exchange: every reduce is launched now with the map pieces' refs
            # (Ray moves them worker to worker); the driver waits once, for the maps'
            # facts and the reduces' answers together. Each reduce also commits its
            # shards' state as version N+1 before answering (see commit()).
            owned = self._owned()
            # NOTE: the pieces as top-level arguments: Ray starts each reduce once its
            # pieces exist and hands them over resolved (small ones inline in the task)
            reduces = []
            for w, actor in enumerate(self.actors):
                refs = [m[1 + s] for s in owned[w] for m in mapped]
                positions = {s: [i * workers + k for k in range(workers)]
                             for i, s in enumerate(owned[w])}
                reduces.append(actor.reduce.remote(
                    ctx, positions, *refs, commit=True, hot_key_rows=self.skew_min_rows,
                    write_task=write_task))
            answers = self._get([m[0] for m in mapped] + reduces)
            facts, reduced = answers[:workers], answers[workers:]
            asked = [part[ROWS_NEEDED] for part in reduced if ROWS_NEEDED in part]
            if asked:
                if any(a["reason"] == "layout" for a in asked):
                    self.combine = False  # this checkpoint's state cannot take partials
                log.info("batch %d: partials could not be merged exactly (%s); the batch "
                         "runs again with rows", ctx.batch_id, asked[0]["reason"])
                return None
            by_shard = {s: r for part in reduced for s, r in part.items()}
            ordered = [by_shard[s] for s in sorted(by_shard)]
            late = [from_wire(frame) for r in ordered for frame in r["late_rows"]]
            observed = [obs for fact in facts for obs in fact["watermarks"]]
            observed += [obs for r in ordered for obs in r["watermarks"]]
            metrics = [r["metrics"] for r in ordered]
            self._metrics = {s: r["state"] for s, r in by_shard.items() if "state" in r}
            profile = self._profile(t0, facts, reduced)
            profile["combined"] = combine
            profile.update(self._skew(ctx.batch_id, by_shard, facts))
            output = self._gather(ordered, write_task, ctx.batch_id, profile)
        profile["reads"] = "workers" if inputs.on_workers else "driver"
        profile["shipped_bytes"] = sum(t.nbytes for parts in slices.values() for t in parts)
        reads = [f["read"] for f in facts] if inputs.on_workers else []
        if inputs.on_workers:
            profile["read_busy_ms"] = [r["busy_ms"] for r in reads]
            profile["read_bytes"] = sum(
                split.size_hint for splits in inputs.splits.values() for split in splits)
        return output, late, observed, metrics, profile, reads

    def _skew(
        self, batch_id: int, by_shard: dict[int, dict[str, Any]], facts: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Rows per shard (entering its operators: partial rows where the map
        side pre-aggregated), their max/mean, and the alarm naming the hottest
        shard's most frequent key when max/mean exceeds ``skew_alarm`` with at
        least ``skew_min_rows`` rows in that shard (hash-sharded queries only)."""
        rows = [by_shard[s]["rows"] if s in by_shard else 0 for s in range(self.layout.shards)]
        routed = [sum(f["routed_rows"][s] for f in facts) for s in range(self.layout.shards)]
        mean = sum(rows) / len(rows) if rows else 0.0
        hot = max(range(len(rows)), key=lambda s: rows[s]) if rows else 0
        skew = round(rows[hot] / mean, 3) if mean else None
        key = by_shard.get(hot, {}).get("hot_key")
        alarm = None
        if (
            skew is not None and skew > self.skew_alarm and rows[hot] >= self.skew_min_rows
            and self.layout.mode == "hash"
        ):
            named = ("" if key is None else "; its most frequent key is " + ", ".join(
                f"{c}={v!r}" for c, v in key["key"].items()) + f" ({key['share']:.0%} of a "
                "sample of its rows)")
            alarm = (f"shard {hot} took {skew:.1f}x the mean rows per shard ({rows[hot]:,} "
                     f"of {sum(rows):,} rows){named}. A hot key loads one worker: "
                     "pre-aggregation (decomposable aggregates) bounds it to one partial "
                     "row per worker; otherwise spread the key (e.g. add a salt column to "
                     "the group and aggregate again downstream)")
            log.warning("batch %d: %s", batch_id, alarm)
        return {
            "shard_rows": rows,
            "routed_rows": routed,
            "skew": skew,
            "hot_shard": hot,
            "hot_key": None if key is None else key["key"],
            "skew_alarm": alarm,
        }

    def _profile(
        self, t0: float, facts: list[dict[str, Any]], reduced: list[dict[int, dict[str, Any]]]
    ) -> dict[str, Any]:
        """The batch's distributed part: its wall time on the driver, each worker's
        busy time (map, reduce, state commit) and the barrier between them."""
        wall = _ms(t0)
        map_busy = [f["busy_ms"] for f in facts]
        reduce_busy = [round(sum(r["busy_ms"] for r in part.values()), 3) for part in reduced]
        commit_busy = [round(sum(r.get("commit_ms", 0.0) for r in part.values()), 3)
                       for part in reduced]
        busiest = max((m + r + c for m, r, c in zip(map_busy, reduce_busy, commit_busy,
                                                    strict=True)), default=0.0)
        return {
            "exchange_ms": wall,
            "barrier_ms": round(max(wall - busiest, 0.0), 3),
            "map_busy_ms": map_busy,
            "reduce_busy_ms": reduce_busy,
            "commit_busy_ms": commit_busy,
            "shard_busy_ms": [r["busy_ms"] for part in reduced for _, r in sorted(part.items())],
            "exchanged_rows": sum(f["rows"] for f in facts),
            "exchanged_bytes": sum(f["bytes"] for f in facts),
        }

    @staticmethod
    def _gather(
        parts: list[dict[str, Any]], write_task: WriteTask | None, batch_id: int,
        profile: dict[str, Any],
    ) -> pl.DataFrame | WrittenBatch:
        """The batch's output from the workers' answers, in order: the rows, or
        (``write_task``) the files they wrote; ``output_bytes`` is what crossed
        to the driver of the rows."""
        if write_task is None:
            tables = [p["output"] for p in parts]
            profile["output_bytes"] = sum(t.nbytes for t in tables)
            return concat([from_wire(t) for t in tables])
        files = [f for p in parts for f in p["written"]]
        profile["output_bytes"] = 0
        profile["written_files"] = len(files)
        return WrittenBatch.gather(files, where=f"batch {batch_id}")

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
        # NOTE: where each new worker goes, until it says where it is: a node that dies
        # while they start (Ray may still call it alive for ~17 s) is then noticed
        self.worker_info = [{"node_id": nodes[w % len(nodes)], "pid": None}
                            for w in range(self.workers)] if nodes else []
        self._check_cluster()
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
        and the engine's own errors raised as they are.

        Waits in slices of :data:`HEALTH_CHECK_S` and looks at the cluster
        between them (:meth:`_check_cluster`): a dead node or a dead local
        raylet is found within seconds, not after ``worker_timeout``."""
        import ray
        from ray import exceptions as rex

        if not refs:
            return []
        deadline = time.monotonic() + self.worker_timeout_s
        try:
            while True:
                left = deadline - time.monotonic()
                _, waiting = ray.wait(refs, num_returns=len(refs),
                                      timeout=max(0.0, min(HEALTH_CHECK_S, left)),
                                      fetch_local=False)
                if not waiting:
                    return list(ray.get(refs))
                if left <= HEALTH_CHECK_S:
                    raise _WorkerLost(
                        f"no answer from a worker within {self.worker_timeout_s:g}s")
                self._check_cluster()
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
            self._check_cluster()  # NOTE: a worker dies with its raylet: say which it was
            raise _WorkerLost(f"{type(exc).__name__}: {first_line(exc)}") from exc

    def _check_cluster(self) -> None:
        """Raise :class:`~microbatch.ExecutorError` when the cluster cannot run
        the query any more (the local raylet this process started is gone, or no
        node is alive), :class:`_WorkerLost` when a node of a worker died."""
        import ray

        gone = self.connection.lost_local_raylet()
        if gone is not None:
            raise ExecutorError(
                f"{gone}: its workers and object store went with it and this process "
                "cannot start new ones. Nothing of the running batch is committed; start "
                "the job again (it starts a new local cluster and re-runs the batch from "
                "the checkpoint), and look for what killed the raylet (the OOM killer: "
                "dmesg; Ray's logs under /tmp/ray/session_latest/logs)."
            )
        try:
            nodes = ray.nodes()  # type: ignore[no-untyped-call]
        except Exception as exc:  # NOTE: Ray raises several kinds when its GCS is gone
            raise ExecutorError(
                f"cannot reach the Ray cluster's control store (GCS): {first_line(exc)}. "
                "Nothing of the running batch is committed; once the cluster is back "
                "(ray status), start the job again: it re-runs the batch from the checkpoint."
            ) from exc
        alive = {n["NodeID"] for n in nodes if n.get("Alive")}
        if not alive:
            raise ExecutorError(
                "the Ray cluster has no live node left (ray status shows them); nothing of "
                "the running batch is committed. Start the cluster's nodes again, then the "
                "job: it re-runs the batch from the checkpoint."
            )
        dead = sorted({info["node_id"] for info in self.worker_info} - alive)
        if dead:
            raise _WorkerLost(f"Ray node {', '.join(d[:12] for d in dead)} died")


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


def gather_reads(inputs: BatchInputs, reads: list[dict[str, Any]]) -> None:
    """The workers' read facts (in worker order, i.e. split order) into
    ``inputs``: rows per source, dead letters, schemas."""
    rows: dict[str, int] = {}
    schemas: dict[str, pl.Schema] = {}
    for read in reads:
        for sid, n in read["rows"].items():
            rows[sid] = rows.get(sid, 0) + n
        for sid, schema in read["schemas"].items():
            schemas.setdefault(sid, schema)
    inputs.rows = rows
    inputs.schemas = schemas
    inputs.dead = [from_wire(t) for read in reads for t in read["dead"]]


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
