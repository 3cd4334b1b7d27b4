"""The trigger loop and the lifecycle of one micro-batch.

This module is the engine's spine. :meth:`MicroBatchExecution.run_batch`
reads top to bottom as the protocol of docs/design.md::

    1. plan         each source's end offset (capped); no new data, no watermark
                    move past state and no timer or TTL due -> no batch
    2. write-ahead  offsets/N = ranges, watermark, timestamp, fingerprint
    3. read         exactly the recorded ranges
    4. execute      the plan, vectorized over the whole batch (on Ray workers
                    that write the sink's data files when the sink lets them:
                    their descriptions come back instead of the rows)
    5. sink         sink.add_batch(N, rows), or sink.commit_files(N, files);
                    dead letters and late rows likewise, by the driver
    6. commit       commits/N; sources may forget what is before their ends
    7. report       one progress record

End of a bounded input (``once``/``available-now``, :meth:`end_of_input`)::

    (hold_watermark: every batch before this one ran at the watermark the run
     started with, None on a new checkpoint: no row late, no window closed)
    if (flush_at_end or hold_watermark) and some row was seen:
        W = newest event time + the plan's event-time reach
        if the watermark is below W: raise it to W and run one no-data batch
            through steps 1..7 (offsets/N records W: a crash re-runs it as is)
    if this run ran no batch:         say so ("nothing new since batch N")

A pipelined query (``pipelined=True``) splits step 6: batch N's state commit
stays in the query's thread, then step 5 and ``commits/N`` run on the
committer thread (:meth:`MicroBatchExecution.hand_off`) while the thread goes
on with batch N+1's steps 1..4; N+1's write-ahead entry records N as
``in_flight``. Before N+1's state commit (or when the query waits, idles or
ends), N is settled: waited for, then its step 7::

    thread:     1 2 3 4 (N)  settle(N-1) 6a(N) | 1 2 3 4 (N+1)  settle(N) 6a(N+1) | ...
    committer:                                 | 5(N) 6b(N)                       | 5(N+1) ...

So state version N+2 is written only after ``commits/N``: state is never more
than one version ahead of the commit log, and recovery loads version N as it
always did (a store keeping 2 versions suffices).

Recovery (:meth:`MicroBatchExecution.recover`)::

    last = latest entry of offsets/
    if there is none:                 start every source at its initial offset
    elif an offsets/ entry other than
         last and last's in_flight
         has no commits/ entry:       refuse (files deleted by hand; nothing runs)
    elif commits/ has last:           next batch = last + 1, from last's ends
    else:                             re-run the uncommitted batches (last, and
                                      the one it records in flight, first) with
                                      their recorded ranges and watermarks
                                      (steps 3..7); the sinks' idempotency
                                      absorbs a write that already landed

Everything a batch does is a function of (offsets/N, code), so the re-run
produces the same rows.

A replay (:mod:`microbatch.engine.replay`) takes step 1's batch from an old
checkpoint's record instead of the sources (:meth:`next_batch`), and skips
step 5 for the warm-up batches before its range.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from microbatch.checkpoint import Checkpoint, CommitEntry, OffsetEntry
from microbatch.engine.batch_executor import input_frame
from microbatch.engine.committer import Committer
from microbatch.engine.durability import Durability, durability_level
from microbatch.engine.executors import (
    Executor,
    FileWritingRunner,
    LocalExecutor,
    PlanRunner,
    SplitRunner,
)
from microbatch.engine.faults import fault_point, side_fault_point
from microbatch.engine.read_ahead import ReadAhead, read_ranges
from microbatch.engine.replay import RecordedBatches, ReplayLoop, refuse_unfinished
from microbatch.engine.split_reads import BatchInputs, input_of
from microbatch.engine.state_budget import StateBudget
from microbatch.engine.trigger_loops import loop_for
from microbatch.engine.watermark import closes_state, event_time_reach_ms
from microbatch.exceptions import CheckpointCorruptError, IncompatibleCheckpointError, PlanError
from microbatch.observability.latency import LatencyProbe
from microbatch.observability.progress import ProgressStore
from microbatch.observability.record import BatchFacts, progress_record
from microbatch.operators.base import OperatorContext
from microbatch.operators.changes import sink_rows
from microbatch.plan.nodes import PlanNode
from microbatch.plan.triggers import ProcessingTime, Trigger
from microbatch.sources.base import (
    ReadSplit,
    Source,
    SourceContext,
    count_schema_mismatches,
)
from microbatch.types import Offset, OutputMode
from sinks.base import Sink, SinkContext, WriteTask, WrittenBatch

log = logging.getLogger("microbatch.engine.execution")

SinkOutput = pl.DataFrame | WrittenBatch
"""Step 4's result for step 5: the output rows, or the files workers wrote of them."""

@dataclass
class PlannedBatch:
    """Batch N as fixed by its write-ahead entry (``offsets/N``)."""

    batch_id: int
    ranges: dict[str, tuple[Offset, Offset]]
    timestamp_ms: int
    watermark_ms: int | None = None
    recovered: bool = False
    durations_ms: dict[str, float] = field(default_factory=dict)

    @classmethod
    def recovered_from(cls, entry: OffsetEntry) -> PlannedBatch:
        """The batch ``entry`` fixed, to be re-run exactly as recorded."""
        batch = cls.recorded_in(entry)
        batch.recovered = True  # NOTE: already written ahead: steps 3..7 only
        return batch

    @classmethod
    def recorded_in(cls, entry: OffsetEntry) -> PlannedBatch:
        """The batch ``entry`` fixed, as a new batch of this checkpoint: to be
        written ahead and run exactly as recorded (a replay of another checkpoint's)."""
        return cls(
            batch_id=entry.batch_id,
            ranges=dict(entry.sources),
            timestamp_ms=entry.timestamp_ms,
            watermark_ms=entry.watermark_ms,
        )


@dataclass
class BatchResult:
    """What steps 3-5 produced, for the progress record."""

    input_rows: dict[str, int]
    output_rows: int
    dead_letter_rows: int
    late_rows: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    schema_mismatch: int = 0
    """Dead letters for whole inputs that do not fit the schema (files)."""


class Timer:
    """Accumulates wall time per lifecycle step of one batch."""

    def __init__(self, durations: dict[str, float]) -> None:
        self.durations = durations

    def step(self, name: str) -> _Span:
        return _Span(self.durations, name)


class _Span:
    def __init__(self, durations: dict[str, float], name: str) -> None:
        self.durations, self.name = durations, name

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        elapsed = (time.perf_counter() - self.t0) * 1000
        self.durations[self.name] = round(self.durations.get(self.name, 0.0) + elapsed, 3)


def predecessors_of(metadata: dict[str, Any]) -> dict[str, int]:
    """The query a checkpoint continues, from its metadata (``from_savepoint``:
    the savepoint's query id and batch), as sinks take it
    (:attr:`sinks.base.SinkContext.predecessors`)."""
    origin = metadata.get("from_savepoint")
    if not isinstance(origin, dict) or not isinstance(origin.get("query_id"), str):
        return {}
    return {origin["query_id"]: int(origin.get("batch_id", -1))}


def _id_list(ids: list[int], limit: int = 10) -> str:
    """``[7, 8, 9]``, or the first ``limit`` ids and how many more."""
    shown = ", ".join(map(str, ids[:limit]))
    return f"[{shown}]" if len(ids) <= limit else f"[{shown}, ... {len(ids) - limit} more]"


def bind_state_backend(runner: PlanRunner, backend: str) -> PlanRunner:
    """Give the runner's operators ``backend`` (the local executor's, or every Ray
    shard's: each shard's stores keep a database in their own directory); PlanError
    for a runner that cannot."""
    if backend != "memory":
        if not hasattr(runner, "state_backend"):
            raise PlanError(
                f"state_backend={backend!r} is not supported by the {type(runner).__name__} "
                "executor: use state_backend='memory'"
            )
        runner.state_backend = backend
    return runner


class MicroBatchExecution:
    """Runs one query: recovers from its checkpoint, then batches per trigger."""

    def __init__(
        self,
        *,
        plan: PlanNode,
        sink: Sink,
        output_mode: OutputMode,
        checkpoint: Checkpoint,
        trigger: Trigger,
        dead_letter_sink: Sink | None = None,
        late_sink: Sink | None = None,
        key_columns: tuple[str, ...] = (),
        retention: int = 100,
        clock: Callable[[], float] = time.time,
        name: str | None = None,
        durability: Durability = "fsync",
        executor: Executor | None = None,
        state_budget: StateBudget | None = None,
        flush_at_end: bool = False,
        hold_watermark: bool = False,
        replay: RecordedBatches | None = None,
        pipelined: bool = False,
        state_backend: str = "memory",
    ) -> None:
        self.plan = plan
        self.pipelined = pipelined
        """Steps 5-6 of batch N run on the committer thread while batch N+1 is
        read and executed (:meth:`hand_off`)."""
        self.committer = Committer(durability, name)
        # the batch handed to the committer, with its result and engine facts for step 7
        self.in_flight: tuple[PlannedBatch, BatchResult, dict[str, Any]] | None = None
        self.replay = replay
        """The old checkpoint's batches this run replays (``None``: plan from the sources)."""
        # NOTE: a held watermark is released by the flush at the end of input
        self.flush_at_end = flush_at_end or hold_watermark
        self.state_budget = state_budget
        self.durability = durability
        self.sink = sink
        self.output_mode = output_mode
        self.checkpoint = checkpoint
        self.trigger = trigger
        self.loop = ReplayLoop() if replay is not None else loop_for(trigger)
        self.dead_letter_sink = dead_letter_sink
        self.late_sink = late_sink
        self.key_columns = key_columns
        self.retention = retention
        self.clock = clock
        self.name = name
        self.sources: dict[str, Source] = {str(i): s for i, s in enumerate(plan.sources())}
        self.executor: PlanRunner = bind_state_backend(
            (executor or LocalExecutor()).runner(plan, output_mode=output_mode,
                                                 durability=durability),
            state_backend,
        )
        self.tracker = self.executor.tracker
        if hold_watermark:
            self.tracker.hold()
        self.watermark_in_force: int | None = None
        self.input_schemas: dict[str, pl.Schema] = {}
        self.read_ahead = ReadAhead(self.sources)
        self.query_id = ""
        self.predecessors: dict[str, int] = {}
        """Query id -> savepoint batch of the query this checkpoint continues
        (``run --from-savepoint``): its tables are handed over to this one."""
        self.run_id = str(uuid.uuid4())
        self.next_batch_id = 0
        self.committed: dict[str, Offset] = {}
        # the batch this thread runs (written ahead, not yet handed off or committed)
        self.pending: PlannedBatch | None = None
        # batches written ahead but not committed before a restart: re-run first, in order
        self.recovered: list[PlannedBatch] = []
        # group commit: commits/N written without fsync, made durable by offsets/N+1
        # (which embeds it) or by sync_commit()
        self.unsynced_commit: CommitEntry | None = None
        self._fingerprint: str | None = None
        self.progress = ProgressStore(None)
        self.falling_behind = False
        # coordination with the StreamingQuery handle (other threads)
        self.stop_requested = threading.Event()
        self.wake = threading.Event()
        self.cond = threading.Condition()
        self.plans_started = 0
        self.last_idle_plan = -1
        self.status_message = "initializing"
        self.batches_this_run = 0
        self.caught_up: str | None = None
        """Set when a bounded run found nothing new: what to tell the user."""

    # ------------------------------------------------------------------ setup

    def open(self) -> None:
        """Create/lock the checkpoint, open sources and sinks, recover (at the
        query's durability level, like its batches)."""
        with durability_level(self.durability):
            self._open()

    def _open(self) -> None:
        meta = self.checkpoint.create_or_open()
        self.checkpoint.lock()
        try:
            self.query_id = meta["query_id"]
            self.predecessors = predecessors_of(meta)
            self.progress = ProgressStore(self.checkpoint.progress_dir, retain=self.retention)
            for sid, source in self.sources.items():
                source.open(SourceContext(sid, self.checkpoint.source_dir(sid)))
            self.sink.open(self._sink_context())
            for side, name in ((self.dead_letter_sink, "dead_letter"), (self.late_sink, "late")):
                if side is not None:
                    side.open(self._sink_context(mode="append", keys=(), side=name))
            self.recover()
            if self.replay is None:
                refuse_unfinished(meta, self.next_batch_id, self.checkpoint.root)
            self.executor.open(self.checkpoint.root / "state", self.next_batch_id)
        except BaseException:
            self.close()
            raise

    def _sink_context(
        self, mode: OutputMode | None = None, keys: tuple[str, ...] | None = None,
        side: str | None = None,
    ) -> SinkContext:
        # NOTE: a side output's points are its own (``dead_letter.sink.after_data``):
        # the dead-letter sink is written before the sink in every batch with a bad
        # record, and would otherwise take the kills meant for the sink's points
        points = fault_point if side is None else side_fault_point(side)
        return SinkContext(
            query_id=self.query_id,
            output_mode=mode or self.output_mode,
            checkpoint_dir=self.checkpoint.root,
            key_columns=self.key_columns if keys is None else keys,
            fault_point=points,
            predecessors=self.predecessors,
            role=side or "output",
        )

    def close(self) -> None:
        """Close sources, sinks and the executor, and release the lock (idempotent);
        a pipelined batch in flight finishes first."""
        self.committer.close()
        self.read_ahead.close()
        try:
            self.executor.close()
        except Exception:
            log.exception("error while closing the executor")
        for closer in [s.close for s in self.sources.values()] + [self.sink.close]:
            try:
                closer()
            except Exception:
                log.exception("error while closing")
        for side in (self.dead_letter_sink, self.late_sink):
            if side is not None:
                side.close()
        self.checkpoint.unlock()

    def identity(self) -> dict[str, Any]:
        """What must not change across restarts on one checkpoint."""
        return {"sources": {sid: s.identity() for sid, s in self.sources.items()}}

    def fingerprint(self) -> str:
        """A hash of the whole job's configuration, recorded per batch (computed
        once: the configuration cannot change while the query runs)."""
        if self._fingerprint is None:
            self._fingerprint = self._compute_fingerprint()
        return self._fingerprint

    def _compute_fingerprint(self) -> str:
        doc = {
            "identity": self.identity(),
            "plan": self.plan.explain(),
            "sink": self.sink.describe(),
            "output_mode": self.output_mode,
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[
            :16
        ]

    def recover(self) -> None:
        """Find where to resume; see the module docstring for the rule."""
        offsets, commits = self.checkpoint.offsets, self.checkpoint.commits
        self.checkpoint.repair_commits()  # NOTE: group commit; before commits/ is read
        offsets.check_contiguous()
        commits.check_contiguous()
        last = offsets.latest()
        if last is None:
            if commits.batch_ids():
                raise CheckpointCorruptError(
                    f"{commits.directory} has entries but {offsets.directory} is empty; "
                    "the write-ahead log was deleted. Start on a new checkpoint directory."
                )
            self.committed = {sid: s.initial_offset() for sid, s in self.sources.items()}
            self.next_batch_id = 0
            return
        self._check_compatible(last)
        uncommitted = sorted(set(offsets.batch_ids()) - set(commits.batch_ids()))
        # NOTE: only the last batch may lack its commit, and those it was written
        # ahead beside (a pipelined query); re-running these alone would leave the
        # others unaccounted for, so nothing runs
        stray = [b for b in uncommitted if b != last.batch_id and b not in last.in_flight]
        if stray:
            raise CheckpointCorruptError(
                f"{commits.directory} is missing entries for batches {_id_list(stray)} "
                f"although {offsets.directory} has them and later batches; files were deleted "
                "by hand. Only the last batch may be uncommitted. Restore the missing commit "
                "files from a backup, or start the job on a new checkpoint directory and "
                "backfill what it should hold."
            )
        last_commit = commits.latest()
        if last_commit is not None and last_commit.batch_id > last.batch_id:
            raise CheckpointCorruptError(
                f"{commits.path(last_commit.batch_id)} commits batch {last_commit.batch_id} but "
                f"the write-ahead log ends at batch {last.batch_id}; the offsets log was "
                "truncated."
            )
        if last_commit is not None:
            self.tracker.restore(last_commit.watermark)
        if not uncommitted:
            self.watermark_in_force = last.watermark_ms
            self.committed = {sid: end for sid, (_, end) in last.sources.items()}
            self.next_batch_id = last.batch_id + 1
            return
        for batch_id in uncommitted:
            entry = offsets.get(batch_id)
            assert entry is not None  # NOTE: listed by batch_ids() just above
            self.recovered.append(PlannedBatch.recovered_from(entry))
            log.warning("recovering batch %d from its write-ahead entry", batch_id)
        first = self.recovered[0]
        self.committed = {sid: start for sid, (start, _) in first.ranges.items()}
        self.next_batch_id = first.batch_id

    def _check_compatible(self, entry: OffsetEntry) -> None:
        recorded = dict(entry.identity)
        current = self.identity()
        batch_id = entry.batch_id
        if recorded != current:
            raise IncompatibleCheckpointError(
                f"checkpoint {self.checkpoint.root} was written by a job with different "
                f"sources (batch {batch_id} recorded {json.dumps(recorded, sort_keys=True)}, "
                f"this job has {json.dumps(current, sort_keys=True)}). A checkpoint holds "
                "positions in specific sources: start the changed job on a new checkpoint."
            )

    # ---------------------------------------------------------- the lifecycle

    def run_batch(self, *, capped: bool = True, bounds: dict[str, Offset] | None = None) -> bool:
        """Run the next batch through steps 1-7; False when there was nothing to do.

        A pipelined query settles batch N-1 (waits for its sink and commit, then
        step 7), commits this batch's state, then hands steps 5-6 (sink,
        ``commits/N``) to the committer thread and returns: the next call
        plans, writes ahead, reads and executes batch N+1 meanwhile."""
        batch = self.recovered.pop(0) if self.recovered else self.next_batch(
            capped=capped, bounds=bounds
        )
        if batch is None:
            return False
        timer = Timer(batch.durations_ms)
        try:
            if not batch.recovered:
                with timer.step("write_ahead"):
                    self.write_ahead(batch)
                fault_point("after_write_ahead", batch.batch_id)
            self.pending = batch
            with timer.step("read"):
                inputs = self.read_inputs(batch)
            fault_point("after_read", batch.batch_id)
            with timer.step("execute"):
                output, ctx = self.execute(batch, inputs)
                self.check_state_budget(batch, ctx)
            fault_point("after_execute", batch.batch_id)
            if not inputs.on_workers:
                self.start_read_ahead(batch, capped=capped, bounds=bounds)
            dead_letters = inputs.dead_letters(batch.batch_id)
            result = BatchResult(
                input_rows=inputs.input_rows(),
                output_rows=output.height,
                dead_letter_rows=dead_letters.height,
                late_rows=sum(f.height for f in ctx.late_rows),
                state=ctx.metrics,
                schema_mismatch=count_schema_mismatches(dead_letters),
            )
            if self.pipelined:
                # NOTE: state version N+1 only after commits/N-1: state is never more
                # than one version ahead of the commit log, as without pipelining
                self.settle()
                with timer.step("commit"):
                    self.commit_state(batch)
                self.hand_off(batch, output, dead_letters, ctx, result)
                return True
            with timer.step("sink"):
                self.write_sink(batch, output, dead_letters, ctx)
            fault_point("after_sink", batch.batch_id)
            with timer.step("commit"):
                self.commit(batch)
        except BaseException:
            self.executor.abort()
            raise
        fault_point("after_commit", batch.batch_id)
        self.report(batch, result, self.engine_facts(batch))
        self.batches_this_run += 1
        fault_point("after_report", batch.batch_id)
        return True

    def next_batch(
        self, *, capped: bool = True, bounds: dict[str, Offset] | None = None
    ) -> PlannedBatch | None:
        """Step 1's one decision: a replay's next recorded batch, else a plan from
        the sources now (:meth:`plan_batch`); ``None``: nothing to run."""
        if self.replay is None:
            return self.plan_batch(capped=capped, bounds=bounds)
        entry = self.replay.entry(self.next_batch_id)
        return None if entry is None else PlannedBatch.recorded_in(entry)

    def plan_batch(
        self, *, capped: bool = True, bounds: dict[str, Offset] | None = None
    ) -> PlannedBatch | None:
        """Step 1: each source's end offset now.

        ``None`` when no source has new data, the watermark did not move past
        state waiting to be emitted, and no processing-time timer or TTL is due;
        otherwise the batch (a no-data batch when only the watermark moved or a
        timer is due: an idle query still fires timers on its trigger).
        """
        t0 = time.perf_counter()
        self.read_ahead.wait()  # NOTE: a source is never used by two threads at once
        with self.cond:
            self.plans_started += 1
            plan_no = self.plans_started
        ranges: dict[str, tuple[Offset, Offset]] = {}
        for sid, source in self.sources.items():
            start = self.committed[sid]
            end = source.latest_offset(start, capped=capped)
            if bounds is not None and sid in bounds:
                end = source.bound(end, bounds[sid])
                if source.compare(end, start) < 0:
                    end = start
            ranges[sid] = (start, end)
        # NOTE: a read-ahead ending within what is available now is the next batch
        ranges = self.read_ahead.ends_within(ranges) or ranges
        has_data = any(self.sources[sid].compare(e, s) > 0 for sid, (s, e) in ranges.items())
        now_ms = int(self.clock() * 1000)
        next_watermark = self.tracker.planned(now_ms)
        watermark_moved = next_watermark != self.watermark_in_force
        if watermark_moved and self.tracker.has_processing_time():
            # NOTE: a processing-time watermark moves at every trigger; a no-data
            # batch only when it crosses the end of some window
            watermark_moved = closes_state(self.plan, self.watermark_in_force, next_watermark)
        if not has_data and not (
            watermark_moved and self.executor.has_expirable_state(next_watermark)
        ) and not self.executor.due(now_ms, next_watermark):
            self.settle()  # NOTE: "idle" below tells waiters that everything is committed
            self.sync_commit()  # idle: no next write-ahead to carry the last commit
            with self.cond:
                self.last_idle_plan = plan_no
                self.cond.notify_all()
            return None
        batch = PlannedBatch(
            batch_id=self.next_batch_id,
            ranges=ranges,
            timestamp_ms=now_ms,
            watermark_ms=next_watermark,
        )
        batch.durations_ms["plan"] = round((time.perf_counter() - t0) * 1000, 3)
        fault_point("after_plan", batch.batch_id)
        return batch

    def write_ahead(self, batch: PlannedBatch) -> None:
        """Step 2: record batch N durably; from here it is fixed forever.

        Group commit: the entry carries ``commits/N-1`` when that was written
        without fsync, so one durable write makes both durable."""
        previous = self.unsynced_commit
        if previous is not None and previous.batch_id != batch.batch_id - 1:
            self.sync_commit()  # NOTE: only the batch right before may ride along
            previous = None
        self.checkpoint.offsets.add(
            OffsetEntry(
                batch_id=batch.batch_id,
                sources=batch.ranges,
                watermark_ms=batch.watermark_ms,
                timestamp_ms=batch.timestamp_ms,
                identity=self.identity(),
                fingerprint=self.fingerprint(),
                in_flight=() if self.in_flight is None else (self.in_flight[0].batch_id,),
                previous_commit=previous,
            )
        )
        self.unsynced_commit = None

    def read_inputs(self, batch: PlannedBatch) -> BatchInputs:
        """Step 3: exactly the recorded range of every source, and its dead letters;
        or, when the executor's workers read, the splits they read it in
        (:mod:`~microbatch.engine.split_reads`: no row on the driver)."""
        return self.plan_splits(batch) or self.read_here(batch)

    def plan_splits(self, batch: PlannedBatch) -> BatchInputs | None:
        """Step 3 for workers that read: every source's recorded range as one
        split per worker; ``None`` when the executor cannot take splits, no
        source has new rows, or a source with new rows cannot be split."""
        runner = self.executor
        if not isinstance(runner, SplitRunner) or runner.read_pieces is None:
            return None
        splits: dict[str, list[ReadSplit]] = {}
        empty: dict[str, pl.DataFrame] = {}
        for sid, (start, end) in batch.ranges.items():
            source = self.sources[sid]
            if source.compare(end, start) <= 0:
                empty[sid] = self.empty_input(sid)
                continue
            planned = source.read_splits(start, end, runner.read_pieces)
            if planned is None:
                return None
            splits[sid] = planned
        if not splits:
            return None
        return BatchInputs(empty, splits, partitions=bool(self.tracker.specs))

    def read_here(self, batch: PlannedBatch) -> BatchInputs:
        """Step 3 on the driver: every source's rows (a read-ahead's when it
        read exactly these ranges)."""
        got = self.read_ahead.take(batch.ranges) or read_ranges(self.sources, batch.ranges)
        inputs = BatchInputs({})
        for sid, read in got.items():
            if read is None:
                inputs.frames[sid] = self.empty_input(sid)
                continue
            source = self.sources[sid]
            seen = input_frame(source, read.data)
            if seen.width:
                self.input_schemas[sid] = seen.schema
            inputs.frames[sid] = input_of(read, source.schema, partitions=bool(self.tracker.specs))
            inputs.dead.append(read.dead_letters)
        return inputs

    def empty_input(self, sid: str) -> pl.DataFrame:
        """The frame of a source without new rows: the columns it last had."""
        known = self.input_schemas.get(sid)
        return known.to_frame() if known is not None else input_frame(
            self.sources[sid], pl.DataFrame())

    def start_read_ahead(
        self, batch: PlannedBatch, *, capped: bool, bounds: dict[str, Offset] | None
    ) -> None:
        """With a backlog, read what the next batch will most likely be, in the
        background, while this batch is in its sink (see :mod:`read_ahead`); a
        replay reads its next recorded batch."""
        ranges = self._upcoming_ranges(batch, capped=capped, bounds=bounds)
        if ranges and any(
            self.sources[sid].compare(e, s) > 0 for sid, (s, e) in ranges.items()
        ):
            self.read_ahead.start(ranges)

    def _upcoming_ranges(
        self, batch: PlannedBatch, *, capped: bool, bounds: dict[str, Offset] | None
    ) -> dict[str, tuple[Offset, Offset]] | None:
        """The next batch's ranges: a replay's next recorded entry (known exactly),
        else a guess from the sources when there is a backlog; ``None``: none."""
        if self.replay is not None:
            upcoming = self.replay.entry(batch.batch_id + 1)
            return None if upcoming is None else dict(upcoming.sources)
        backlog = self.loop.drains_backlog or self.falling_behind
        if not backlog or not capped:
            return None
        ranges: dict[str, tuple[Offset, Offset]] = {}
        try:
            for sid, (_, end) in batch.ranges.items():
                source = self.sources[sid]
                nxt = source.latest_offset(end, capped=True)
                if bounds is not None and sid in bounds:
                    nxt = source.bound(nxt, bounds[sid])
                ranges[sid] = (end, nxt if source.compare(nxt, end) > 0 else end)
        except Exception as exc:  # a guess failed: the next plan will ask (and raise) again
            log.debug("no read-ahead for batch %d: %s", batch.batch_id + 1, exc)
            return None
        return ranges

    def execute(
        self, batch: PlannedBatch, inputs: BatchInputs
    ) -> tuple[SinkOutput, OperatorContext]:
        """Step 4: the plan over the whole batch, with the recorded watermark;
        then the watermark that the next batch will use. When the workers write
        the sink's files (:meth:`sink_task`), the files, not the rows."""
        ctx = OperatorContext(
            batch_id=batch.batch_id,
            watermark_ms=batch.watermark_ms,
            timestamp_ms=batch.timestamp_ms,
        )
        task = self.sink_task(batch)
        output: SinkOutput
        if task is not None:
            assert isinstance(self.executor, FileWritingRunner)
            output = self.executor.execute_writing(inputs, ctx, task)
        elif inputs.on_workers:
            assert isinstance(self.executor, SplitRunner)  # NOTE: only it is given splits
            output = sink_rows(self.executor.execute_splits(inputs, ctx), self.output_mode)
        else:
            output = sink_rows(self.executor.execute(inputs.frames, ctx), self.output_mode)
        if inputs.on_workers:
            self.input_schemas.update(inputs.schemas)
        self.tracker.advance(batch.timestamp_ms)
        # NOTE: never below the watermark this batch ran at (a re-run flush batch)
        self.tracker.raise_to(batch.watermark_ms)
        return output, ctx

    def sink_task(self, batch: PlannedBatch) -> WriteTask | None:
        """The sink's task for workers that write its data files (step 5's data
        part moved into step 4), or ``None``: the rows come to this process. Never
        for a replay's warm-up batch (its output is not written)."""
        if not isinstance(self.executor, FileWritingRunner):
            return None
        if self.replay is not None and self.replay.warms_up(batch.batch_id):
            return None
        return self.sink.distributed_writer(batch.batch_id)

    def check_state_budget(self, batch: PlannedBatch, ctx: OperatorContext) -> None:
        """End of step 4: refuse a batch whose state outgrew ``state_memory_budget``
        (:mod:`microbatch.engine.state_budget`); nothing of it is committed."""
        if self.state_budget is None or not self.executor.operators:
            return
        fallback = None
        if any(op.operator_id not in ctx.metrics for op in self.executor.operators):
            fallback = self.executor.state_metrics()  # an operator that did not run
        self.state_budget.check(
            batch.batch_id, ctx.metrics, self.executor.operators,
            has_watermark=bool(self.tracker.specs), fallback=fallback,
        )

    def write_sink(
        self, batch: PlannedBatch, output: SinkOutput, dead: pl.DataFrame, ctx: OperatorContext
    ) -> None:
        """Step 5: hand the batch to the sinks (each idempotent on the batch id);
        files the workers wrote are committed as the batch."""
        if self.replay is not None and self.replay.warms_up(batch.batch_id):
            return  # a replay's warm-up batch rebuilds state only (``--batches A..B``)
        if dead.height and self.dead_letter_sink is not None:
            self.dead_letter_sink.add_batch(batch.batch_id, dead)
        if ctx.late_rows and self.late_sink is not None:
            late = pl.concat(ctx.late_rows, how="diagonal_relaxed").with_columns(
                pl.lit(batch.batch_id, pl.Int64).alias("batch_id")
            )
            self.late_sink.add_batch(batch.batch_id, late)
        if isinstance(output, WrittenBatch):
            self.sink.commit_files(batch.batch_id, output)
        else:
            self.sink.add_batch(batch.batch_id, output)

    def commit(self, batch: PlannedBatch) -> None:
        """Step 6: state version N+1, then ``commits/N`` with the next watermark.

        Group commit: ``commits/N`` is written atomically but without fsync; it
        is made durable inside ``offsets/N+1`` (the next write-ahead), or by
        :meth:`sync_commit` when the query finds nothing new or stops. A power loss before
        that re-runs batch N from ``offsets/N`` (the recovery rule), which the
        sinks' idempotency absorbs; a killed process loses nothing."""
        self.commit_state(batch)
        entry = self.commit_entry(batch)
        self.checkpoint.commits.add(entry, durable=False)
        self.unsynced_commit = entry
        self.advance(batch)
        self.forget_before(batch)

    def commit_state(self, batch: PlannedBatch) -> None:
        """Step 6's first half: every operator's state as version N+1."""
        self.executor.commit()
        fault_point("after_state_commit", batch.batch_id)

    def commit_entry(self, batch: PlannedBatch) -> CommitEntry:
        """``commits/N``: the watermark batch N+1 starts from (taken right after
        batch N executed)."""
        return CommitEntry(
            batch_id=batch.batch_id,
            next_watermark_ms=self.tracker.current,
            watermark=self.tracker.to_json(),
            committed_at_ms=int(self.clock() * 1000),
        )

    def advance(self, batch: PlannedBatch) -> None:
        """Batch N+1 starts where batch N ended (planned from here on)."""
        self.pending = None
        self.watermark_in_force = batch.watermark_ms
        self.committed = {sid: end for sid, (_, end) in batch.ranges.items()}
        self.next_batch_id = batch.batch_id + 1

    def forget_before(self, batch: PlannedBatch) -> None:
        """After ``commits/N``: sources may drop what is before their ends, and
        the logs keep ``retention`` batches."""
        for sid, (_, end) in batch.ranges.items():
            self.sources[sid].commit(end)
        keep_from = batch.batch_id + 1 - self.retention
        if keep_from > 0:
            self.checkpoint.offsets.purge_before(keep_from)
            self.checkpoint.commits.purge_before(keep_from)

    # ------------------------------------------------------ a pipelined batch

    def hand_off(
        self,
        batch: PlannedBatch,
        output: SinkOutput,
        dead: pl.DataFrame,
        ctx: OperatorContext,
        result: BatchResult,
    ) -> None:
        """Steps 5-6 of a pipelined batch on the committer thread: the sinks,
        then ``commits/N``. Its state is already version N+1, and what batch N+1
        needs (offsets, watermark) is taken now, so N+1 can be planned at once."""
        entry = self.commit_entry(batch)
        engine = self.engine_facts(batch)
        self.advance(batch)

        def finish() -> None:
            timer = Timer(batch.durations_ms)
            with timer.step("sink"):
                self.write_sink(batch, output, dead, ctx)
            fault_point("after_sink", batch.batch_id)
            with timer.step("commit"):
                self.checkpoint.commits.add(entry)
            fault_point("after_commit", batch.batch_id)

        self.in_flight = (batch, result, engine)
        self.committer.hand_off(batch.batch_id, finish)

    def settle(self) -> None:
        """Wait for the pipelined batch in flight (if any), then its step 7.

        Raises what its sink or commit raised: the query fails, and a restart
        re-runs it (and the batch written ahead beside it) from ``offsets/``."""
        if self.in_flight is None:
            return
        batch, result, engine = self.in_flight
        self.in_flight = None
        try:
            self.committer.settle()
        except BaseException:
            # NOTE: the batch the error belongs to (``last_error``), and where the next
            # start resumes (``status``, the CLI's message)
            self.pending, self.next_batch_id = batch, batch.batch_id
            raise
        self.forget_before(batch)
        self.report(batch, result, engine)
        self.batches_this_run += 1
        fault_point("after_report", batch.batch_id)

    def engine_facts(self, batch: PlannedBatch) -> dict[str, Any]:
        """What the progress record says of the engine right after batch N's
        state commit (a pipelined batch reports later, when the next has run)."""
        has_watermark = bool(self.tracker.specs)
        return {
            "next_watermark_ms": self.tracker.current,
            "state_committed": self.executor.state_metrics(),
            "eviction": {
                op.operator_id: op.eviction(has_watermark=has_watermark)
                for op in self.executor.operators
            },
            "watermark_partitions": self.tracker.partition_report(batch.timestamp_ms),
            "executor": self.executor.batch_profile(),
        }

    def report(self, batch: PlannedBatch, result: BatchResult, engine: dict[str, Any]) -> None:
        """Step 7: push the batch's facts to the progress record.

        The fields are listed in :mod:`microbatch.observability.record`; the
        record goes to ``query.recent_progress``, ``chk/progress/N`` and the
        ``microbatch.progress`` logger (one JSON line).
        """
        interval_ms = (
            self.trigger.interval_ms if isinstance(self.trigger, ProcessingTime) else None
        )
        facts = BatchFacts(
            query_id=self.query_id,
            run_id=self.run_id,
            name=self.name,
            trigger=str(self.trigger),
            interval_ms=interval_ms,
            batch_id=batch.batch_id,
            timestamp_ms=batch.timestamp_ms,
            recovered=batch.recovered,
            watermark_ms=batch.watermark_ms,
            durations_ms=batch.durations_ms,
            ranges=batch.ranges,
            sources=self.sources,
            input_rows=result.input_rows,
            output_rows=result.output_rows,
            dead_letter_rows=result.dead_letter_rows,
            schema_mismatch=result.schema_mismatch,
            late_rows=result.late_rows,
            state=result.state,
            sink_description=self.sink.describe(),
            sink_metrics=self.sink.metrics(),
            latency=self.sink.latency(batch.batch_id)
            if isinstance(self.sink, LatencyProbe)
            else None,
            previous=self.progress.recent[-1] if self.progress.recent else None,
            **engine,
        )
        record = progress_record(facts, now_ms=int(self.clock() * 1000))
        self.falling_behind = record["falling_behind"]
        self.progress.add(record)

    # ---------------------------------------------------------- trigger loop

    def run(self) -> None:
        """Run batches as the trigger's loop says, until it ends or stop is asked;
        the last batch's commit is durable when it returns."""
        self.status_message = "running"
        with durability_level(self.durability):
            try:
                self.loop.run(self)
                self.settle()
            except BaseException:
                try:
                    self.sync_commit()
                except Exception:  # NOTE: the batch's own error is the one to report
                    log.exception("could not make the last commit entry durable")
                raise
            self.sync_commit()

    def sync_commit(self) -> None:
        """Make the last ``commits/N`` durable on its own (group commit had no next
        write-ahead to ride in: the query found nothing new, or stops)."""
        if self.unsynced_commit is not None:
            self.checkpoint.commits.sync(self.unsynced_commit.batch_id)
            self.unsynced_commit = None

    # the BatchRunner protocol of microbatch.engine.trigger_loops

    def has_pending(self) -> bool:
        return bool(self.recovered)

    def committed_offsets(self) -> dict[str, Offset]:
        return dict(self.committed)

    def available_offsets(self) -> dict[str, Offset]:
        return {
            sid: s.latest_offset(self.committed[sid], capped=False)
            for sid, s in self.sources.items()
        }

    def stopping(self) -> bool:
        return self.stop_requested.is_set()

    def now(self) -> float:
        return self.clock()

    def wait(self, seconds: float) -> None:
        """Wait for the next tick; ``stop`` and ``process_all_available`` wake it early.
        A pipelined batch in flight settles first (back to back, it overlaps the next)."""
        if seconds > 0:
            self.settle()
            self.wake.wait(seconds)
        self.wake.clear()

    def end_of_input(self) -> None:
        """A bounded trigger processed everything: the flush batch when
        ``flush_at_end`` asks for it, and a note when the run found nothing new."""
        self.settle()
        if self.stopping():
            return
        if self.flush_at_end:
            self.flush()
            self.settle()
        if self.batches_this_run == 0:
            self.caught_up = self._caught_up_message()

    def flush(self) -> None:
        """Advance the watermark to the end of input and run the batch that emits
        every window still open (module docstring); nothing when no row was
        seen or the watermark is already there (a flushed, caught-up checkpoint)."""
        target = self.tracker.end_of_input(event_time_reach_ms(self.plan))
        current = self.tracker.current
        if target is None or (current is not None and current >= target):
            return
        self.tracker.raise_to(target)
        if self.run_batch(bounds=self.committed_offsets()):
            log.info("flush batch %d ran at the end-of-input watermark %s",
                     self.next_batch_id - 1, target)

    def _caught_up_message(self) -> str:
        root = self.checkpoint.root
        if self.next_batch_id == 0:
            return (f"no input: the sources have no data yet, so nothing was written and "
                    f"checkpoint {root} holds no batch. Run again once data arrives.")
        return (f"nothing new since batch {self.next_batch_id - 1}: checkpoint {root} has "
                "already processed every input available, so this run wrote nothing. To "
                "recompute the results from the start, run on a new checkpoint directory.")

    def idle(self) -> None:
        self.settle()
        with self.cond:
            self.last_idle_plan = self.plans_started + 1
            self.cond.notify_all()
