"""Scale-out on Ray: a query's stateless steps and state shards on Ray workers,
with the trigger loop, the checkpoint and the sinks on the driver.

``writer.start(..., executor=mb.RayExecutor(workers=4))`` or
``microbatch run JOB --workers 4 [--ray-address ADDR]``; needs
``pip install 'microbatch[ray]'``. See :mod:`microbatch.distributed.runner` for
one batch across the workers and :mod:`microbatch.distributed.sharding` for
how rows and state are split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from microbatch.engine.durability import Durability
from microbatch.engine.executors import PlanRunner
from microbatch.exceptions import PlanError
from microbatch.plan.nodes import PlanNode
from microbatch.types import OutputMode

__all__ = ["SHARDS_PER_WORKER", "RayExecutor"]

SHARDS_PER_WORKER = 2
"""A new checkpoint's shards per worker when ``shards`` is not given: the job
can later run on up to twice as many workers; each shard costs its own state
files per batch."""


@dataclass(frozen=True)
class RayExecutor:
    """Runs a query's plan on ``workers`` Ray actors.

    The driver (the process that called ``start``) keeps the trigger loop, the
    checkpoint's logs, the sinks and progress; the workers run the stateless
    steps on slices of each batch and own the state, split into ``shards`` by
    key. Guarantees are those of one process: the same rows, exactly once,
    through crashes of the driver or of workers (a lost worker is replaced and
    its batch re-run, at most ``max_worker_restarts`` times per batch).

    Parameters
    ----------
    workers
        Ray actors to start (any number on any checkpoint: shards are reassigned).
    address
        A Ray cluster to join (``ray://`` or ``host:port``); ``None`` starts a
        local cluster (or joins ``RAY_ADDRESS``).
    shards
        How many pieces the state is split into, fixed for the life of a
        checkpoint; ``None``: the checkpoint's, or :data:`SHARDS_PER_WORKER`
        times ``workers`` for a new one.
    worker_timeout
        Seconds a worker may take to answer one step of a batch before it counts
        as lost.
    worker_reads
        Workers read the sources (``True``, the default): the driver plans each
        batch's recorded range as one split per worker and no row crosses it,
        for sources that can be split (files with a schema, Delta tables); the
        driver reads the others, and every source with ``False``.
    combine
        Pre-aggregate on the map side before the shuffle (window and keyed
        ``group_by`` aggregates whose partials merge exactly: ``len``, ``count``,
        integer ``sum``/``min``/``max``, and float ``sum``/``mean`` of append-mode
        windows): rows exchanged fall with distinct keys instead of rows; the
        results are bit for bit those of shipping rows. ``False`` ships rows.
    skew_alarm
        Max/mean rows per shard above which a batch logs a WARNING naming the
        hottest shard's most frequent key (``skew_alarm`` in progress), when that
        shard had at least ``skew_min_rows`` rows. Max/mean is at most the
        shard count (every row in one shard); hashing many keys gives ~1.1-1.3.
    """

    workers: int = 2
    address: str | None = None
    shards: int | None = None
    max_worker_restarts: int = 3
    worker_timeout: float = 300.0
    worker_reads: bool = True
    combine: bool = True
    skew_alarm: float = 2.0
    skew_min_rows: int = 10_000

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise PlanError(f"RayExecutor needs at least 1 worker, got workers={self.workers}")
        if self.shards is not None and self.shards < 1:
            raise PlanError(f"RayExecutor needs at least 1 shard, got shards={self.shards}")

    def runner(
        self, plan: PlanNode, *, output_mode: OutputMode, durability: Durability
    ) -> PlanRunner:
        from microbatch.distributed.cluster import RayConnection, import_ray
        from microbatch.distributed.runner import ShardedRunner

        import_ray()  # a clear error now when the extra is missing
        return ShardedRunner(
            plan,
            output_mode=output_mode,
            durability=durability,
            connection=RayConnection(self.address, num_cpus=None),
            workers=self.workers,
            shards=self.shards,
            default_shards=SHARDS_PER_WORKER * self.workers,
            max_worker_restarts=self.max_worker_restarts,
            worker_timeout_s=self.worker_timeout,
            worker_reads=self.worker_reads,
            combine=self.combine,
            skew_alarm=self.skew_alarm,
            skew_min_rows=self.skew_min_rows,
        )

    def describe(self) -> dict[str, Any]:
        return {"executor": "ray", "workers": self.workers, "address": self.address,
                "shards": self.shards, "worker_reads": self.worker_reads}
