"""``DataStreamWriter``: a stream with its sink attached, not yet started."""

from __future__ import annotations

import os
import tempfile
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, get_args

from microbatch.api.query import StreamingQuery
from microbatch.checkpoint import Checkpoint
from microbatch.engine.durability import DURABILITY_LEVELS, Durability
from microbatch.engine.execution import MicroBatchExecution
from microbatch.engine.executors import Executor
from microbatch.engine.replay import RecordedBatches, prepare_replay, start_checkpoint
from microbatch.engine.state_backend import StateBackend, parse_state_backend
from microbatch.engine.state_budget import StateBudget
from microbatch.exceptions import PlanError, TriggerError
from microbatch.observability.latency import LatencyProbe, latency_columns
from microbatch.plan.nodes import (
    AggregateNode,
    DiscardingAggregateNode,
    PlanNode,
    WatermarkNode,
    is_aggregated,
)
from microbatch.plan.triggers import AvailableNow, ProcessingTime, Trigger, parse_trigger
from microbatch.types import OutputMode
from sinks.base import Sink


@dataclass(frozen=True)
class DataStreamWriter:
    """A stream's plan plus a sink and an output mode; ``start`` runs it.

    Made by ``Stream.write_*``; immutable: ``start`` can be called again after a
    query stops, on the same checkpoint, to resume exactly where it left off.
    """

    plan: PlanNode
    sink: Sink
    output_mode: OutputMode = "append"
    dead_letter: Sink | None = None
    late_sink: Sink | None = None
    """The stream's late-row side output (``Stream.on_late``)."""

    def __post_init__(self) -> None:
        if self.output_mode not in get_args(OutputMode):
            raise PlanError(
                f"unknown output_mode {self.output_mode!r}: use 'append', 'update', "
                "'complete' or 'changelog'"
            )
        if self.output_mode not in self.sink.supported_modes:
            raise PlanError(
                f"{type(self.sink).__name__} does not support output_mode={self.output_mode!r}; "
                f"it supports {', '.join(self.sink.supported_modes)}"
            )
        if self.output_mode == "complete" and not is_aggregated(self.plan):
            raise PlanError(
                "output_mode='complete' needs an aggregation (group_by(...).agg(...)): "
                "without one the complete result would be every row ever seen. "
                "Use 'append' for a stateless stream."
            )
        validate_aggregations(self.plan, self.output_mode)

    def dead_letters_to(self, sink: Sink) -> DataStreamWriter:
        """Deprecated: use ``stream.on_dead_letters(sink)`` (side outputs are set on
        the stream, as ``on_late``). Removed in 0.3."""
        warnings.warn(
            "DataStreamWriter.dead_letters_to is deprecated and will be removed in 0.3: "
            "use stream.on_dead_letters(sink) before write_*(), like stream.on_late(sink)",
            DeprecationWarning,
            stacklevel=2,
        )
        return replace(self, dead_letter=sink)

    def start(
        self,
        checkpoint: str | os.PathLike[str] | None = None,
        trigger: str | Trigger | None = None,
        *,
        name: str | None = None,
        retention: int = 100,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        durability: Durability = "fsync",
        executor: Executor | None = None,
        state_memory_budget: int | str | None = None,
        flush_at_end: bool = False,
        hold_watermark: bool = False,
        pipelined: bool = False,
        state_backend: StateBackend = "memory",
    ) -> StreamingQuery:
        """Start the query in a background thread and return its handle.

        The checkpoint makes the query restartable: starting again on the same
        checkpoint (after a stop or a crash) resumes exactly where the last run
        left off, with the same query id; a batch left uncommitted is re-run with
        the same input and watermark, and each sink writes a batch id once.

        Parameters
        ----------
        checkpoint
            The directory that makes the query restartable; a fresh temporary
            directory when omitted (fine for notebooks, not for jobs).
        trigger
            ``"10s"`` (a batch at every multiple of the interval), ``"once"`` (one
            batch over everything available, then stop), ``"available-now"``
            (everything available at the start, in batches capped by the sources'
            limits, then stop), a trigger object (:class:`~microbatch.ProcessingTime`,
            :class:`~microbatch.Once`, :class:`~microbatch.AvailableNow`), or
            ``None`` for batches back to back.
        name
            A name for logs, progress records and the query thread.
        retention
            How many batches of offsets and commits the checkpoint keeps (at
            least 1).
        metrics_port
            Serve the progress figures as Prometheus metrics on
            ``http://metrics_host:metrics_port/metrics`` while the query runs
            (``0`` picks a free port: see ``query.metrics_url``).
        metrics_host
            The interface the metrics server binds to.
        durability
            ``"fsync"`` (default): a committed batch survives a power loss.
            ``"process"``: the same atomic writes without fsyncs; a committed
            batch survives the process crashing or being killed, not the
            machine (see :mod:`microbatch.engine.durability`). For tiny batches
            on slow disks.
        executor
            Where the plan runs: in this process (``None``, the default:
            :class:`~microbatch.LocalExecutor`) or on Ray workers
            (:class:`~microbatch.RayExecutor`, ``pip install 'microbatch[ray]'``),
            with the same results and guarantees.
        state_memory_budget
            The most memory the query's state may hold, in bytes or as text
            (``"512MB"``, ``"2GB"``; KB/MB/GB are powers of 1024 as in Spark and
            Flink); ``None`` (default): no limit. Checked after every batch's
            execute, before its sink: a batch whose state ends above it fails with
            :class:`~microbatch.StateBudgetExceededError`, naming the largest
            operators and how to bound them, and is not committed (restart with a
            larger budget, a TTL or a shorter window to run it again, exactly once).
            With ``state_backend="lmdb"`` the keyed stores' rows are on disk and
            count 0 bytes: the budget then bounds what stays in memory (the
            append buffers of append-mode windows, join buffers).
        state_backend
            Where the keyed state's rows live: ``"memory"`` (default: numpy arrays
            in this process, the fastest), or ``"lmdb"`` (alias ``"disk"``: an
            embedded LMDB database beside the state files, ``pip install
            'microbatch[disk]'``), for state larger than memory. Window
            aggregates, ``drop_duplicates``, ``fire_once``, sessions and
            ``transform_with_state`` keep their keyed stores on disk; append-mode
            windows' partials and stream-stream joins stay in memory. Both keep
            the same changelog and snapshot files with the same guarantees, and
            the backend is recorded in the checkpoint: a restart with the other
            one converts (it rebuilds from those files). With the Ray executor each
            shard's stores keep their database in the shard's directory.
        flush_at_end
            With a bounded trigger (``"available-now"`` or ``"once"``): after the
            last batch of input, advance the watermark to the end of input (the
            newest event time seen plus the plan's windows, session gaps, join
            bounds and allowed lateness) and run one more batch that emits every
            window still open, written ahead and committed like any batch (a crash
            re-runs it exactly once). The flushed watermark is kept in the
            checkpoint: on a later run, rows for the flushed windows are late
            (``late_rows``, ``.on_late(sink)``). Refused with an interval trigger,
            whose input never ends.
        hold_watermark
            With a bounded trigger: hold the watermark where the checkpoint left
            it (none on a new checkpoint) until the input ends, then flush as
            ``flush_at_end`` does (implied). No row is late and no window,
            session, join buffer or dedupe key is closed or evicted before the
            end, so the result equals a one-shot computation over the input
            whatever the sources' ``max_*_per_batch`` caps: a replay that must
            not re-apply the lateness rule (``microbatch backfill
            --replace-where`` restates with it). Event-time timers fire at the
            flush; processing-time timers and TTLs still run. State holds the
            whole history replayed until the flush: bound it with
            ``state_memory_budget``. Refused with an interval trigger.
        pipelined
            Overlap batches: batch N's sink writes and ``commits/N`` run on a
            background thread while batch N+1 is planned, written ahead, read
            and executed (its state is committed first, in the query's thread).
            Exactly once still holds: a crash leaves at most batches N and N+1
            uncommitted, ``offsets/N+1`` records that N was in flight, and the
            restart re-runs both in order (each sink writes a batch id once).
            It pays off when batches run back to back (a backlog, ``None`` or
            ``"available-now"`` triggers): the sink's time hides behind the next
            batch's read and execute. With an interval trigger the batch in
            flight settles before the query waits for the next tick. A batch
            counts as done (progress record, ``process_all_available``) once
            its commit is written.

        Returns
        -------
        StreamingQuery
            The handle of the running query.

        Raises
        ------
        PlanError
            When ``retention`` is below 1, ``durability`` is unknown or
            ``state_memory_budget`` is not a positive size
            (:class:`~microbatch.TriggerError` for an unknown trigger, or
            ``flush_at_end`` or ``hold_watermark`` with an interval trigger).
        CheckpointError
            At once when the checkpoint is unusable: locked by a running query
            (:class:`~microbatch.CheckpointLockedError`), written by a different job
            (:class:`~microbatch.IncompatibleCheckpointError`) or damaged. Any other
            error of opening the sources and sinks is raised here too.

        Examples
        --------
        >>> import tempfile
        >>> checkpoint = tempfile.mkdtemp()
        >>> stream = mb.generate(
        ...     rows_per_second=None, total_rows=500, start="2026-01-01T00:00:00+00:00", seed=3
        ... )
        >>> writer = stream.filter(pl.col("amount") > 50).write_memory("doc_start")
        >>> first = writer.start(checkpoint, trigger="available-now")
        >>> first.await_termination()
        True
        >>> n = mb.table("doc_start").height
        >>> n
        158

        Starting again on the same checkpoint resumes: every row was processed, so
        nothing is read or written twice.

        >>> again = writer.start(checkpoint, trigger="available-now")
        >>> again.await_termination()
        True
        >>> again.id == first.id, again.run_id == first.run_id
        (True, False)
        >>> mb.table("doc_start").height == n
        True
        """
        if retention < 1:
            raise PlanError(f"retention must be at least 1 batch, got {retention}")
        if durability not in DURABILITY_LEVELS:
            raise PlanError(
                f"durability must be one of {', '.join(map(repr, DURABILITY_LEVELS))}, "
                f"got {durability!r}"
            )
        budget = StateBudget.of(state_memory_budget)
        backend = parse_state_backend(state_backend)
        spec = parse_trigger(trigger)
        if hold_watermark and isinstance(spec, ProcessingTime):
            raise TriggerError(
                "hold_watermark=True needs a bounded trigger, 'available-now' or 'once'; got "
                f"trigger {str(spec)!r}, whose input never ends, so the held watermark would "
                "never be released and state would grow forever. Use "
                "trigger='available-now', or drop hold_watermark."
            )
        if flush_at_end and isinstance(spec, ProcessingTime):
            raise TriggerError(
                "flush_at_end=True (CLI: --flush) needs a bounded trigger, 'available-now' "
                f"or 'once'; got trigger {str(spec)!r}, whose input never ends, so there is "
                "no end at which to flush the open windows. Use trigger='available-now' (CLI: "
                "--trigger available-now --flush), or drop flush_at_end."
            )
        root = (
            Path(checkpoint)
            if checkpoint is not None
            else Path(tempfile.mkdtemp(prefix="microbatch-chk-"))
        )
        execution = self._execution(
            Checkpoint(root), spec, retention=retention, name=name, durability=durability,
            executor=executor, state_budget=budget, flush_at_end=flush_at_end,
            hold_watermark=hold_watermark, pipelined=pipelined, state_backend=backend,
        )
        return StreamingQuery(execution, name=name)._start(
            metrics_port=metrics_port, metrics_host=metrics_host
        )

    def replay(
        self,
        from_checkpoint: str | os.PathLike[str],
        checkpoint: str | os.PathLike[str],
        *,
        batches: str | tuple[int, int] | None = None,
        name: str | None = None,
        retention: int = 100,
        durability: Durability = "fsync",
        executor: Executor | None = None,
        pipelined: bool = False,
    ) -> StreamingQuery:
        """Run this job's code over exactly the batches ``from_checkpoint`` recorded
        (their ranges, watermarks, timestamps and batch ids) into this writer's
        sink, on the new checkpoint ``checkpoint``; the query stops after the last.

        The same code writes the same rows as the recorded run (bit for bit, with
        the same sink); new code writes the change's effect on those batches. Only
        batches the old run committed are replayed, and no flush batch is added
        (the old run's flush batch, if any, is one of the recorded ones). Calling
        it again on the same ``checkpoint`` resumes an interrupted replay; once it
        finished, ``start(checkpoint)`` continues live from the last replayed ends.

        Parameters
        ----------
        from_checkpoint
            The checkpoint of the run to replay; only read (its job may go on
            running), so its offsets log must still hold batch 0 (``retention``).
        checkpoint
            A new directory (or this replay's own, to resume it). Its metadata
            records ``replay_of``: the old checkpoint, its query id, the range.
        batches
            ``"A..B"`` or ``(A, B)``, both included: write only batches A to B.
            Batches 0 to A-1 still run first, with their sink writes skipped, to
            rebuild the state batch A starts from (a warm-up). ``None``: every
            committed batch.
        name, retention, durability, executor, pipelined
            As for :meth:`start`.

        Raises
        ------
        ReplayError
            When the old checkpoint lacks a batch of the range (never committed,
            or purged), the job reads other sources than the ones recorded, or
            ``checkpoint`` holds something else than this replay.

        Examples
        --------
        >>> import tempfile
        >>> old, new = tempfile.mkdtemp(), tempfile.mkdtemp()
        >>> stream = mb.generate(
        ...     rows_per_second=None, total_rows=300, start="2026-01-01T00:00:00+00:00",
        ...     seed=3, max_records_per_batch=100,
        ... )
        >>> live = stream.write_memory("doc_replay_live").start(old, trigger="available-now")
        >>> live.await_termination()
        True
        >>> again = stream.write_memory("doc_replay_new").replay(old, new)
        >>> again.await_termination()
        True
        >>> mb.table("doc_replay_new").equals(mb.table("doc_replay_live"))
        True
        """
        if retention < 1:
            raise PlanError(f"retention must be at least 1 batch, got {retention}")
        recorded = prepare_replay(from_checkpoint, checkpoint, batches)
        chk = Checkpoint(checkpoint)
        execution = self._execution(chk, AvailableNow(), retention=retention, name=name,
                                    durability=durability, executor=executor,
                                    replay=recorded, pipelined=pipelined)
        recorded.check_identity(execution.identity())
        start_checkpoint(recorded, chk)
        return StreamingQuery(execution, name=name)._start()

    def _execution(
        self, chk: Checkpoint, spec: Trigger, *, retention: int, name: str | None,
        durability: Durability, executor: Executor | None,
        state_budget: StateBudget | None = None, flush_at_end: bool = False,
        hold_watermark: bool = False, replay: RecordedBatches | None = None,
        pipelined: bool = False, state_backend: str = "memory",
    ) -> MicroBatchExecution:
        return MicroBatchExecution(
            plan=self.plan,
            sink=LatencyProbe(self.sink, latency_columns(self.plan)),
            output_mode=self.output_mode,
            checkpoint=chk,
            trigger=spec,
            dead_letter_sink=self.dead_letter or _default_dead_letter_sink(chk),
            late_sink=self.late_sink,
            key_columns=tuple(output_keys(self.plan)),
            retention=retention,
            name=name,
            durability=durability,
            executor=executor,
            state_budget=state_budget,
            flush_at_end=flush_at_end,
            hold_watermark=hold_watermark,
            replay=replay,
            pipelined=pipelined,
            state_backend=state_backend,
        )

    def describe(self) -> dict[str, Any]:
        return {"sink": self.sink.describe(), "output_mode": self.output_mode}


def output_keys(plan: PlanNode) -> list[str]:
    """Columns identifying a result row: the outermost aggregation's keys."""
    for node in plan.walk():
        if isinstance(node, AggregateNode):
            return node.output_keys()
    return []


def validate_aggregations(plan: PlanNode, mode: OutputMode) -> None:
    """Refuse aggregations that cannot run in ``mode`` (Spark's rules), when built."""
    for node in plan.walk():
        if isinstance(node, DiscardingAggregateNode):
            node.check_output_mode(mode)
        if not isinstance(node, AggregateNode):
            continue
        marks = [n.spec for n in node.child.walk() if isinstance(n, WatermarkNode)]
        if node.window is None:
            if mode == "append":
                raise PlanError(
                    "output_mode='append' cannot emit a group_by without a window: a key's "
                    "result is never final. Pass output_mode='update' or 'complete' to the "
                    "writer, e.g. .write_delta(path, output_mode='update') or "
                    ".write_memory(name, output_mode='complete'), or group by "
                    "mb.window(...) with a watermark."
                )
            continue
        column = node.window.column
        if not any(m.column == column for m in marks) and mode not in ("update", "changelog"):
            raise PlanError(
                f"output_mode={mode!r} with a window on {column!r} needs "
                f".with_watermark({column!r}, delay) before group_by: without a watermark "
                "windows never close, so state grows forever. Add a watermark, or pass "
                "output_mode='update' to the writer (e.g. .write_memory(name, "
                "output_mode='update'))."
            )


def _default_dead_letter_sink(chk: Checkpoint) -> Sink:
    from sinks.parquet import ParquetSink

    return ParquetSink(chk.dead_letter_dir)
