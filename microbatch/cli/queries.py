"""The commands that run a query: ``run``, ``demo``, ``backfill`` and ``replay``, with the
signal handling (a first SIGINT/SIGTERM finishes the batch in flight) and the
live display they share."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Annotated, Any, Protocol

import typer
from rich.markup import escape

from microbatch._interrupt import EXIT_INTERRUPTED
from microbatch.api.query import StreamingQuery
from microbatch.api.writer import DataStreamWriter
from microbatch.cli import preflight
from microbatch.cli.common import CliError, fail, parse_params
from microbatch.cli.display import (
    BatchLines,
    DemoTable,
    LiveLine,
    RunStats,
    err,
    out,
)
from microbatch.engine.durability import Durability
from microbatch.engine.executors import Executor
from microbatch.exceptions import USER_ERRORS, QueryTerminatedError
from microbatch.observability.progress_schema import ProgressRecord
from microbatch.plan.triggers import Trigger, parse_trigger

JobFile = Annotated[Path, typer.Argument(
    help="The job file: a .py defining build(params).", metavar="JOB.py", show_default=False)]
"""The JOB.py argument of the commands that run a job file."""
JobParams = Annotated[list[str] | None, typer.Option(
    "--param", "-p", metavar="KEY=VALUE",
    help="A parameter of the job, checked against the ones it declares "
         "(`JOB.py --help` lists them); repeatable.")]
"""``--param KEY=VALUE`` of the commands that run a job file."""
QueryName = Annotated[str | None, typer.Option(
    metavar="NAME", help="A name for the query (logs, progress).")]
"""``--name`` of the commands that start a query."""

POLL_S = 0.2
"""How often the CLI looks at the query's progress while it runs."""





def _latest_progress_id(checkpoint: Path) -> int:
    """The highest batch id with a progress record on disk, or -1."""
    try:
        names = os.listdir(checkpoint / "progress")
    except OSError:
        return -1
    return max((int(n) for n in names if n.isdigit()), default=-1)


class DurabilityOption(StrEnum):
    """``--durability`` choices (see :mod:`microbatch.engine.durability`)."""

    fsync = "fsync"
    process = "process"


class Stoppable(Protocol):
    """What a signal stops: a query, or several (``microbatch sql``)."""

    def request_stop(self) -> None:
        """Stop after the batch in flight is committed."""


class StopOnSignal:
    """First SIGINT/SIGTERM: graceful stop (then exit 130 for SIGINT, 0 for
    SIGTERM); second: ``os._exit(130)`` at once.

    The handler only sets flags and calls ``request_stop`` (which just sets
    events), so it is safe whatever the main thread is doing.
    """

    def __init__(self) -> None:
        self.query: Stoppable | None = None
        self.reason: str | None = None
        """Why a stop was requested (``"SIGTERM"``, ``"20s elapsed"``), or ``None``."""
        self.announced = False
        self._signals = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopOnSignal:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def attach(self, query: Stoppable) -> None:
        """Follow ``query``; stop it at once if a signal came while it was starting."""
        self.query = query
        if self.reason is not None:
            query.request_stop()

    def request(self, reason: str) -> None:
        """Ask for a graceful stop for ``reason`` (e.g. the demo's time is up)."""
        if self.reason is None:
            self.reason = reason
            if self.query is not None:
                self.query.request_stop()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals > 1:
            if out.is_terminal:
                os.write(1, b"\x1b[?25h")  # the live display hid the cursor
            os.write(2, b"\nsecond signal: exiting now; the batch in flight will be "
                        b"recovered on the next start\n")
            os._exit(130)
        self.reason = signal.Signals(signum).name
        if self.query is not None:
            self.query.request_stop()


# ------------------------------------------------------------------ running


def _run_query(
    writer: DataStreamWriter,
    *,
    checkpoint: Path,
    trigger: Trigger,
    name: str | None,
    stopper: StopOnSignal,
    display: BatchLines | LiveLine,
    seconds: float = 0,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    durability: Durability = "fsync",
    executor: Executor | None = None,
    state_memory_budget: str | None = None,
    flush_at_end: bool = False,
    hold_watermark: bool = False,
    pipelined: bool = False,
    state_backend: str = "memory",
) -> tuple[StreamingQuery, RunStats, QueryTerminatedError | None]:
    """Start ``writer`` and follow it until it ends.

    Raises what ``start`` raises (a locked, corrupt or unwritable checkpoint,
    a source or sink that cannot open, a metrics port in use); returns the
    error of a query that failed while running instead of raising it, with
    the query and its totals.
    """
    baseline = _latest_progress_id(checkpoint)
    query = writer.start(checkpoint, trigger, name=name, metrics_port=metrics_port,
                         metrics_host=metrics_host, durability=durability,
                         executor=executor, state_memory_budget=state_memory_budget,
                         flush_at_end=flush_at_end, hold_watermark=hold_watermark,
                         pipelined=pipelined, state_backend=state_backend)  # type: ignore[arg-type]
    if query.metrics_url:
        display.note(f"serving Prometheus metrics on {query.metrics_url}")
    stats, error = _follow(query, stopper, display, baseline, seconds=seconds)
    return query, stats, error


def _follow(
    query: StreamingQuery, stopper: StopOnSignal, display: BatchLines | LiveLine,
    baseline: int, *, seconds: float = 0,
) -> tuple[RunStats, QueryTerminatedError | None]:
    """Show ``query``'s batches after ``baseline`` until it ends (``seconds``: then
    stop it); the error of a query that failed while running, if any."""
    stopper.attach(query)
    stats = RunStats()
    seen = baseline
    error: QueryTerminatedError | None = None
    with display:
        while True:
            try:
                done = query.await_termination(timeout=POLL_S)
            except QueryTerminatedError as exc:
                error, done = exc, True
            for record in query.recent_progress:
                if record["batch_id"] > seen:
                    seen = record["batch_id"]
                    stats.add(record)
                    display.batch(record, stats)
            if seconds > 0 and time.monotonic() - stats.started >= seconds:
                stopper.request(f"{seconds:g}s elapsed")
            if stopper.reason is not None and not stopper.announced:
                stopper.announced = True
                display.note(
                    f"{stopper.reason}: finishing the batch in flight, then stopping "
                    "(a second SIGINT/SIGTERM exits at once)"
                )
            display.refresh(stats, query)
            if done:
                break
    return stats, error


def _query_failed(query: StreamingQuery, exc: QueryTerminatedError, job: Path) -> typer.Exit:
    """Exit 1 with the cause of a query that failed while running a batch."""
    from microbatch.cli.jobfile import job_line

    cause = exc.__cause__ or exc
    message = (
        f"query {query.id} failed in batch {query.status['next_batch_id']}: "
        f"{type(cause).__name__}{job_line(cause, job.resolve())}: {cause}. The batch was not "
        "committed; the next start on this checkpoint runs it again."
    )
    if logging.getLogger("microbatch.api.query").getEffectiveLevel() > logging.ERROR:
        message += " Run with --verbose for the traceback."
    return fail(message, 1)


@contextlib.contextmanager
def _start_errors_reported(what: str) -> Iterator[None]:
    """Around a command's start: a user's mistake (``USER_ERRORS``) or an OS
    error exits 2 with one paragraph saying what could not start, as does a
    native library's panic (:func:`_native_panic`); anything else propagates."""
    try:
        yield
    except USER_ERRORS as exc:
        raise fail(str(exc), getattr(exc, "code", 2)) from None
    except OSError as exc:
        raise fail(f"cannot start the {what}: {exc}", 2) from None
    except BaseException as exc:
        raise _native_panic(exc, what) from None


def _native_panic(exc: BaseException, what: str) -> BaseException:
    """A panic of a native library (pyo3's ``PanicException`` derives from
    ``BaseException``) as exit code 2 with its message; anything else unchanged."""
    if type(exc).__name__ != "PanicException":
        return exc
    return fail(
        f"cannot start the {what}: a native library (delta-rs, Arrow) panicked: {exc}. "
        "This is often a permission or path problem of an input or output: check that "
        "this user can read the inputs and write the outputs", 2)


def _note(message: str) -> None:
    err.print(f"[yellow]note:[/] {escape(message)}", soft_wrap=True)


def _finish(query: StreamingQuery, stats: RunStats, stopper: StopOnSignal) -> None:
    """Print the run's totals; exit 130 when SIGINT stopped it (the batch in flight
    was committed first), else return (exit 0)."""
    status = query.status
    if status["caught_up"]:  # a bounded run with nothing new: say why nothing was written
        err.print(f"[yellow]{escape(status['message'].removeprefix('stopped: '))}[/]",
                  soft_wrap=True)
    why = f" ({stopper.reason})" if stopper.reason else ""
    committed = query.status["next_batch_id"] - 1
    err.print(
        f"query {query.id} stopped{why}: {stats.batches} batches, "
        f"{stats.input_rows:,} rows in, {stats.output_rows:,} rows out in this run; "
        f"last committed batch: {committed if committed >= 0 else 'none'}.",
        soft_wrap=True,
    )
    if stopper.reason == "SIGINT":
        raise typer.Exit(EXIT_INTERRUPTED)


def run(
    job: JobFile,
    *,
    checkpoint: Annotated[Path, typer.Option("--checkpoint", "-c", help=(
        "Checkpoint directory: makes the query restartable exactly where it stopped."),
        metavar="DIR", show_default=False)],
    trigger: Annotated[str, typer.Option(metavar="TRIGGER", help=(
        "'10s'/'1m' (interval), 'once' or 'available-now'; 0s: batches back to back."
    ))] = "0s",
    param: JobParams = None,
    name: QueryName = None,
    metrics_port: Annotated[int | None, typer.Option(
        min=0, max=65535, metavar="PORT",
        help="Serve Prometheus metrics on http://HOST:PORT/metrics while running "
             "(0: any free port).")] = None,
    metrics_host: Annotated[str, typer.Option(
        metavar="HOST", help="Address the metrics are served on (0.0.0.0: every "
                             "interface).")] = "127.0.0.1",
    durability: Annotated[DurabilityOption, typer.Option(
        help="fsync: a committed batch survives a power loss. process: the same atomic "
             "writes without fsyncs; survives the process crashing, not the machine "
             "(for tiny batches on slow disks).")] = DurabilityOption.fsync,
    workers: Annotated[int | None, typer.Option(
        min=1, metavar="N",
        help="Run the plan on N Ray workers (needs microbatch\\[ray]); a local Ray cluster "
             "is started unless --ray-address is given.")] = None,
    ray_address: Annotated[str | None, typer.Option(
        metavar="ADDR", help="The Ray cluster to run the workers on (host:port or "
                             "ray://host:port); implies --workers 2 unless given.")] = None,
    state_memory_budget: Annotated[str | None, typer.Option(
        metavar="SIZE", help="Stop with a clear error (exit 1), naming the operator and the "
                             "fix, when the state outgrows SIZE (e.g. 512MB, 2GB) in a batch; "
                             "the batch is not committed.")] = None,
    state_backend: Annotated[str, typer.Option(
        metavar="NAME", help="Where keyed state lives: memory (default) or lmdb (alias disk: "
                             "an on-disk database, for state larger than memory; needs "
                             "microbatch\\[disk]). Recorded in the checkpoint; a restart with "
                             "the other backend converts.")] = "memory",
    flush: Annotated[bool, typer.Option(
        "--flush", help="With --trigger available-now or once: after the last batch, advance "
                        "the watermark to the end of input and emit every window still open "
                        "(one more batch, committed like the others). Later rows for those "
                        "windows are late.")] = False,
    pipelined: Annotated[bool, typer.Option(
        "--pipelined", help="Write batch N's sinks and commit in the background while batch "
                            "N+1 is read and executed (exactly once still holds: a restart "
                            "re-runs both).")] = False,
    from_savepoint: Annotated[Path | None, typer.Option(
        "--from-savepoint", metavar="DIR",
        help="Start on a new --checkpoint from a savepoint (`microbatch savepoint`) when the "
             "operators' state is compatible.")] = None,
    state_map: Annotated[list[str] | None, typer.Option(
        "--map", metavar="OLD=NEW",
        help="With --from-savepoint: the new operator that takes an old one's state "
             "(OLD=: drop it; =NEW: start NEW empty); repeatable.")] = None,
) -> None:
    """Run a job file until its trigger ends or SIGINT/SIGTERM stops it."""
    from microbatch.cli.jobfile import build_writer

    with _start_errors_reported("query"), StopOnSignal() as stopper:
        params = parse_params(param or [])
        spec = parse_trigger(trigger)
        executor = None
        if workers is not None or ray_address is not None:
            from microbatch.distributed import RayExecutor

            executor = RayExecutor(workers=workers or 2, address=ray_address)
        writer = build_writer(job, params, note=_note)
        preflight.check(writer)
        if from_savepoint is not None or state_map:
            from microbatch.cli.state import start_from_savepoint

            start_from_savepoint(from_savepoint, state_map or [], checkpoint, writer,
                                 sharded=executor is not None, note=_note)
        display = LiveLine("microbatch") if out.is_terminal else BatchLines()
        query, stats, error = _run_query(writer, checkpoint=checkpoint, trigger=spec,
                                         name=name, stopper=stopper, display=display,
                                         metrics_port=metrics_port,
                                         metrics_host=metrics_host,
                                         durability=durability.value,
                                         executor=executor,
                                         state_memory_budget=state_memory_budget,
                                         flush_at_end=flush, pipelined=pipelined,
                                         state_backend=state_backend)
    if error is not None:
        raise _query_failed(query, error, job)
    _finish(query, stats, stopper)




# ------------------------------------------------------------------ demo


def demo(
    checkpoint: Annotated[
        Path, typer.Option(metavar="DIR", help="Checkpoint directory.")
    ] = Path("demo-output/checkpoint"),
    output: Annotated[
        Path, typer.Option(metavar="DIR", help="The Delta table the alerts go to.")
    ] = Path("demo-output/alerts"),
    rows_per_second: Annotated[float, typer.Option(min=1, metavar="N",
                                                  help="Generated rows per second.")]
    = 5_000,
    seconds: Annotated[float, typer.Option(min=0, metavar="N",
                                           help="Stop after N seconds; 0: on Ctrl-C.")]
    = 30,
    trigger: Annotated[str, typer.Option(metavar="TRIGGER", help="Batch interval.")] = "1s",
) -> None:
    """Run the built-in demo: fraud alerts over generated card payments, no services needed.

    It starts a local webhook receiver (the alerts' pages, one per alert id), writes
    the alerts to a Delta table and shows live progress.
    """
    from microbatch import demo as demo_job
    from microbatch.tools.receiver import Receiver, running

    output.expanduser().parent.mkdir(parents=True, exist_ok=True)
    receiver = Receiver(log=output.expanduser().parent / "webhook.jsonl")
    with _start_errors_reported("demo"), StopOnSignal() as stopper, \
            running(receiver) as base_url:
        spec = parse_trigger(trigger)
        writer = demo_job.build(
            {"output": str(output), "rows_per_second": f"{rows_per_second:g}",
             "webhook": f"{base_url}/alerts"}
        )
        display = DemoTable(seconds) if out.is_terminal else BatchLines()
        query, stats, error = _run_query(writer, checkpoint=checkpoint, trigger=spec,
                                         name="demo", stopper=stopper, display=display,
                                         seconds=seconds)
    if error is not None:
        raise _query_failed(query, error, Path(demo_job.__file__))
    out_dir, chk_dir = output.expanduser().resolve(), Path(query.checkpoint)
    pages = receiver.stats()
    out.print(
        f"\n[bold green]demo finished[/]: {stats.batches} batches, {stats.input_rows:,} "
        f"payments generated, {stats.output_rows:,} alert rows written in this run; the "
        f"webhook received {pages['accepted']:,} alerts ({pages['duplicates']:,} "
        f"redeliveries, {pages['conflicts']} with a changed body).\n"
        f"  alerts:     {escape(str(out_dir))}  (Delta, one row per alert_id)\n"
        f"  late:       {_late_line(Path(f'{out_dir}-late'))}\n"
        f"  checkpoint: {escape(str(chk_dir))}  (run the demo again to continue from it; "
        f"`microbatch status {escape(str(chk_dir))}` shows its batches)\n"
        "read the alerts with:\n"
        f"  [cyan]import polars as pl; df = pl.read_delta({str(out_dir)!r})[/]",
        soft_wrap=True,
    )
    if stopper.reason == "SIGINT":
        raise typer.Exit(EXIT_INTERRUPTED)


def _late_line(late: Path) -> str:
    """The demo's late-payments table: its path when a late payment was written,
    else where one would go (the table is created by the first late payment)."""
    if (late / "_delta_log").is_dir():
        return f"{escape(str(late))}  (Delta, payments more than an hour late)"
    return (f"none: no payment was more than an hour late in this run (they would go to "
            f"{escape(str(late))})")


# ------------------------------------------------------------------ backfill


def _side_note(counts: dict[str, int]) -> str:
    """``; kept out of the job's side outputs: 2 late rows`` (empty when none)."""
    labels = {"late_sink": "late rows", "dead_letter": "dead letters"}
    shown = [f"{n:,} {labels.get(side, side)}" for side, n in counts.items() if n]
    return f"; kept out of the job's side outputs: {', '.join(shown)}" if shown else ""


def backfill(
    job: JobFile,
    checkpoint: Annotated[Path, typer.Option("--checkpoint", "-c", help=(
        "Checkpoint directory of the replay: a new one replays the sources from their "
        "start; an existing one resumes an interrupted backfill."),
        metavar="DIR", show_default=False)],
    param: JobParams = None,
    name: QueryName = None,
    replace_where: Annotated[str | None, typer.Option(
        "--replace-where", metavar="PREDICATE", help=(
            "Restate: recompute the job's output from its sources on a new checkpoint "
            "and replace, in one Delta or Iceberg commit, exactly the rows of its output table "
            "matching PREDICATE (SQL over the output's columns, e.g. \"day = "
            "'2026-01-03'\"); the other rows are not touched."))] = None,
) -> None:
    """Replay a job over its sources' history (available-now), with progress.

    Runs JOB.py exactly as `run --trigger available-now` does: every batch up to
    what the sources hold now, the final no-data batch, then exit. For Delta
    sources the backlog is known from the table's log: a terminal shows a
    progress bar (rows, versions and files done of total, rate, ETA); other
    outputs get one plain line per batch. With --replace-where it restates
    rows of the job's Delta or Iceberg output instead of writing every batch to it.
    """
    from microbatch.checkpoint import Checkpoint
    from microbatch.cli.backfill import BackfillBar, BackfillLines, BackfillTracker
    from microbatch.cli.jobfile import build_writer
    from microbatch.tools.restate import Restatement

    restate = None
    with _start_errors_reported("backfill"), StopOnSignal() as stopper:
        params = parse_params(param or [])
        spec = parse_trigger("available-now")
        writer = build_writer(job, params, note=_note)
        preflight.check(writer)
        if replace_where is not None:
            if Checkpoint(checkpoint).exists():
                raise CliError(
                    f"--replace-where recomputes from the sources' start: use a new "
                    f"--checkpoint directory, not {checkpoint} (it holds a checkpoint; "
                    "an interrupted restatement replaced nothing, so run it again "
                    "on a new directory)"
                )
            restate = Restatement.of(writer, replace_where)
            writer = restate.staged
        tracker = BackfillTracker(writer, checkpoint)
        display = BackfillBar(tracker) if out.is_terminal else BackfillLines(tracker)
        query, stats, error = _run_query(writer, checkpoint=checkpoint, trigger=spec,
                                         name=name or "backfill", stopper=stopper,
                                         display=display,
                                         hold_watermark=restate is not None)
        if restate is not None and error is None and stopper.reason is None:
            rows = restate.rows()
            version = restate.commit(rows)
            unit = "snapshot" if type(restate.table).__name__ == "IcebergSink" else "version"
            out.print(f"restated {rows.height:,} rows where {escape(restate.predicate)} in "
                      f"{escape(restate.table.uri)} ({unit} {version}); the other "
                      f"rows are unchanged{_side_note(restate.side_rows())}", soft_wrap=True)
    if error is not None:
        raise _query_failed(query, error, job)
    _finish(query, stats, stopper)


# ------------------------------------------------------------------ replay


class ReplayLines(BatchLines):
    """One plain line per replayed batch on stderr, the warm-up ones marked."""

    def __init__(self, first: int, last: int) -> None:
        super().__init__()
        self.first, self.last = first, last

    def batch(self, record: ProgressRecord, stats: RunStats) -> None:
        batch_id = record["batch_id"]
        warm = " [warm-up: state only, sink skipped]" if batch_id < self.first else ""
        recovered = " [recovered]" if record["recovered"] else ""
        sys.stderr.write(
            f"replay batch {batch_id}/{self.last}: {record['input_rows']:,} rows in, "
            f"{record['output_rows']:,} rows out{warm}{recovered}\n"
        )
        sys.stderr.flush()


def replay(
    job: JobFile,
    *,
    from_checkpoint: Annotated[Path, typer.Option("--from", help=(
        "The checkpoint of the run to replay (only read: its job may keep running)."),
        metavar="CHECKPOINT", show_default=False)],
    checkpoint: Annotated[Path, typer.Option("--checkpoint", "-c", help=(
        "The replay's own checkpoint: a new directory, or this replay's to resume it. "
        "Afterwards `run --checkpoint` on it continues live."),
        metavar="NEW", show_default=False)],
    param: Annotated[list[str] | None, typer.Option(
        "--param", "-p", metavar="KEY=VALUE",
        help="A parameter of the job (name the replay's new outputs here; the sources "
             "must be the recorded ones); repeatable.")] = None,
    batches: Annotated[str | None, typer.Option(
        "--batches", metavar="A..B", help=(
            "Write only batches A to B (both included). Batches 0..A-1 run first with "
            "their sink writes skipped, to rebuild the state (warm-up). Default: every "
            "batch the old run committed."))] = None,
    name: QueryName = None,
) -> None:
    """Run JOB's (possibly new) code over exactly the batches CHECKPOINT recorded.

    Each batch of the old run's offset log is run again with its recorded ranges,
    watermark, processing time and batch id (no planning, no batch cap), into the
    outputs the --param values name, then the command exits. The same code writes
    the same rows (check with `microbatch diff`); new code writes the change's
    effect. Re-running the same command resumes an interrupted replay.
    """
    from microbatch.cli.jobfile import build_writer
    from microbatch.engine.replay import parse_batches, prepare_replay

    with _start_errors_reported("replay"), StopOnSignal() as stopper:
        params = parse_params(param or [])
        writer = build_writer(job, params, note=_note)
        preflight.check(writer)
        recorded = prepare_replay(from_checkpoint, checkpoint, parse_batches(batches))
        display = ReplayLines(recorded.first, recorded.last)
        if recorded.first > 0:
            display.note(f"replaying batches {recorded.first}..{recorded.last} of "
                         f"{recorded.old_root}; batches 0..{recorded.first - 1} warm "
                         "the state up first (their sink writes are skipped)")
        baseline = _latest_progress_id(checkpoint)
        query = writer.replay(from_checkpoint, checkpoint,
                              batches=(recorded.first, recorded.last), name=name)
        stats, error = _follow(query, stopper, display, baseline)
    if error is not None:
        raise _query_failed(query, error, job)
    _finish(query, stats, stopper)
