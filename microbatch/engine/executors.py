"""Where a query's plan runs: the executor interface.

The driver (:class:`~microbatch.engine.execution.MicroBatchExecution`) keeps
the trigger loop, the write-ahead log, the commit log, the sinks and the
progress records whatever the executor. An executor only decides where step
4 of the lifecycle (execute) and the state commit of step 6 happen:

- :class:`LocalExecutor` (the default, the fastest on one machine): in the
  driver's process, every operator's state in ``state/<operator>/``.
- :class:`microbatch.RayExecutor` (``pip install 'microbatch[ray]'``): on Ray
  workers, the state split into shards by key (:mod:`microbatch.distributed`).
  Its runner is a :class:`SplitRunner`: its workers also read the sources
  (step 3), from splits the driver plans (:mod:`microbatch.engine.split_reads`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import polars as pl

from microbatch.engine.batch_executor import BatchExecutor
from microbatch.engine.durability import Durability
from microbatch.engine.split_reads import BatchInputs
from microbatch.engine.watermark import WatermarkTracker
from microbatch.operators.base import OperatorContext, StatefulOperator
from microbatch.plan.nodes import PlanNode
from microbatch.types import OutputMode
from sinks.base import WriteTask, WrittenBatch

__all__ = ["Executor", "FileWritingRunner", "LocalExecutor", "PlanRunner", "SplitRunner"]


class PlanRunner(Protocol):
    """Runs one query's plan batch after batch, wherever its state lives.

    ``execute`` then ``commit`` (or ``abort``) once per batch, in batch order;
    ``tracker`` holds the watermark the driver records in the checkpoint, fed
    with everything every piece of the batch saw.
    """

    tracker: WatermarkTracker
    operators: list[StatefulOperator]

    @property
    def has_state(self) -> bool: ...

    def node_ids(self) -> dict[int, str]: ...

    def open(self, state_root: Path | None, batch_id: int) -> None: ...

    def execute(self, inputs: Mapping[str, pl.DataFrame], ctx: OperatorContext) -> pl.DataFrame:
        ...

    def commit(self) -> None: ...

    def abort(self) -> None: ...

    def has_expirable_state(self, watermark_ms: int | None) -> bool: ...

    def due(self, now_ms: int, watermark_ms: int | None) -> bool: ...

    def state_metrics(self) -> dict[str, Any]: ...

    def batch_profile(self) -> dict[str, Any] | None:
        """Where the last batch ran and its costs (``None``: in this process)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class SplitRunner(Protocol):
    """A :class:`PlanRunner` whose workers read the sources themselves.

    ``read_pieces`` is how many splits each source's range is cut into (one per
    worker; ``None``: the driver reads, as for any runner). ``execute_splits``
    is ``execute`` over :class:`~microbatch.engine.split_reads.BatchInputs`
    holding splits; it fills their rows per source, dead letters and schemas
    from what the workers read.
    """

    @property
    def read_pieces(self) -> int | None: ...

    def execute_splits(self, inputs: BatchInputs, ctx: OperatorContext) -> pl.DataFrame: ...


@runtime_checkable
class FileWritingRunner(Protocol):
    """A runner whose workers can write the sink's data files themselves
    (:meth:`sinks.base.Sink.distributed_writer`): the output rows never reach
    the driver, only the files' descriptions, which the driver commits in step 5."""

    def execute_writing(
        self, inputs: BatchInputs, ctx: OperatorContext, task: WriteTask
    ) -> WrittenBatch:
        """``execute``, the output written by ``task`` on the workers (not committed)."""
        ...


@runtime_checkable
class Executor(Protocol):
    """Builds the :class:`PlanRunner` of a query (``writer.start(executor=...)``)."""

    def runner(
        self, plan: PlanNode, *, output_mode: OutputMode, durability: Durability
    ) -> PlanRunner: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class LocalExecutor:
    """Runs the plan in the query's own process: no serialization, no barrier
    (the default; the fastest on one machine)."""

    def runner(
        self, plan: PlanNode, *, output_mode: OutputMode, durability: Durability
    ) -> PlanRunner:
        return BatchExecutor(plan, output_mode=output_mode)

    def describe(self) -> dict[str, Any]:
        return {"executor": "local"}
