"""The ``microbatch`` command line: ``run``, ``status``, ``report``, ``demo``,
``backfill`` and ``diff``.

Exit codes:

- ``0``: the query ended (its trigger finished, or a first SIGINT/SIGTERM
  stopped it after the batch in flight was committed);
- ``1``: the query failed while running a batch (the message names the cause;
  the batch was not committed and is retried on the next start);
- ``2``: the command could not start: a wrong option, a job file problem, a
  checkpoint that is locked, corrupt or unwritable, or a bad trigger;
- ``130``: a second signal ended the process at once (the batch in flight is
  recovered from its write-ahead entry on the next start).

User mistakes are reported as one red paragraph on stderr, never a Python
traceback (``--verbose`` adds the traceback of a failed query).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer
from rich import box
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from microbatch.api.query import StreamingQuery
from microbatch.api.writer import DataStreamWriter
from microbatch.cli.display import (
    BatchLines,
    DemoTable,
    LiveLine,
    RunStats,
    err,
    fmt_int,
    fmt_ms_time,
    out,
)
from microbatch.exceptions import MicrobatchError, QueryTerminatedError
from microbatch.plan.triggers import Trigger, parse_trigger

app = typer.Typer(
    name="microbatch",
    help="Micro-batch stream processing on Arrow and Polars.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


POLL_S = 0.2
"""How often the CLI looks at the query's progress while it runs."""



class CliError(Exception):
    """A problem the user can fix; printed as one paragraph, exit code ``code``."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def _fail(message: str, code: int) -> typer.Exit:
    err.print(f"[bold red]error:[/] [red]{escape(message)}[/]", soft_wrap=True)
    return typer.Exit(code)


def _user_errors() -> tuple[type[BaseException], ...]:
    from sinks.exceptions import SinkError

    return (MicrobatchError, SinkError, CliError)


# ------------------------------------------------------------------ globals


def _show_version(value: bool) -> None:
    if value:
        from microbatch import __version__

        out.print(f"microbatch {__version__}")
        raise typer.Exit(0)


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    if verbose == 0:
        # The query thread logs a failure with its traceback; the CLI reports
        # the failure itself in one paragraph, and shows the traceback with -v.
        logging.getLogger("microbatch.api.query").setLevel(logging.CRITICAL)


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True,
                     help="Print the version and exit."),
    ] = False,
    verbose: Annotated[
        int,
        typer.Option("--verbose", "-v", count=True,
                     help="More logging: -v info, -vv debug (and tracebacks of failed queries)."),
    ] = 0,
) -> None:
    """Micro-batch stream processing on Arrow and Polars."""
    _setup_logging(verbose)


# ------------------------------------------------------------------ helpers


def parse_params(items: list[str]) -> dict[str, str]:
    """``["k=v", ...]`` as a dict; a later value for the same key wins."""
    params: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CliError(
                f"--param {item!r} is not of the form KEY=VALUE (e.g. --param output=out/dir)"
            )
        params[key.strip()] = value
    return params


def _latest_progress_id(checkpoint: Path) -> int:
    """The highest batch id with a progress record on disk, or -1."""
    try:
        names = os.listdir(checkpoint / "progress")
    except OSError:
        return -1
    return max((int(n) for n in names if n.isdigit()), default=-1)


class StopOnSignal:
    """First SIGINT/SIGTERM: graceful stop; second: ``os._exit(130)`` at once.

    The handler only sets flags and calls ``request_stop`` (which just sets
    events), so it is safe whatever the main thread is doing.
    """

    def __init__(self) -> None:
        self.query: StreamingQuery | None = None
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

    def attach(self, query: StreamingQuery) -> None:
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
) -> tuple[StreamingQuery, RunStats, QueryTerminatedError | None]:
    """Start ``writer`` and follow it until it ends.

    Raises what ``start`` raises (a locked, corrupt or unwritable checkpoint,
    a source or sink that cannot open, a metrics port in use); returns the
    error of a query that failed while running instead of raising it, with
    the query and its totals.
    """
    baseline = _latest_progress_id(checkpoint)
    query = writer.start(checkpoint, trigger, name=name, metrics_port=metrics_port,
                         metrics_host=metrics_host)
    stopper.attach(query)
    if query.metrics_url:
        display.note(f"serving Prometheus metrics on {query.metrics_url}")
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
    return query, stats, error


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
    return _fail(message, 1)


def _finish(query: StreamingQuery, stats: RunStats, stopper: StopOnSignal) -> None:
    why = f" ({stopper.reason})" if stopper.reason else ""
    committed = query.status["next_batch_id"] - 1
    err.print(
        f"query {query.id} stopped{why}: {stats.batches} batches, "
        f"{stats.input_rows:,} rows in, {stats.output_rows:,} rows out in this run; "
        f"last committed batch: {committed if committed >= 0 else 'none'}.",
        soft_wrap=True,
    )


@app.command()
def run(
    job: Annotated[Path, typer.Argument(help="The job file: a .py defining build(params).",
                                        metavar="JOB.py", show_default=False)],
    *,
    checkpoint: Annotated[Path, typer.Option("--checkpoint", "-c", help=(
        "Checkpoint directory: makes the query restartable exactly where it stopped."),
        metavar="DIR", show_default=False)],
    trigger: Annotated[str, typer.Option(metavar="TRIGGER", help=(
        "'10s'/'1m' (interval), 'once' or 'available-now'; 0s: batches back to back."
    ))] = "0s",
    param: Annotated[list[str] | None, typer.Option(
        "--param", "-p", metavar="KEY=VALUE",
        help="A parameter passed to build(params); repeatable.")] = None,
    name: Annotated[str | None, typer.Option(metavar="NAME",
                                                help="A name for the query (logs, progress).")]
    = None,
    metrics_port: Annotated[int | None, typer.Option(
        min=0, max=65535, metavar="PORT",
        help="Serve Prometheus metrics on http://HOST:PORT/metrics while running "
             "(0: any free port).")] = None,
    metrics_host: Annotated[str, typer.Option(
        metavar="HOST", help="Address the metrics are served on (0.0.0.0: every "
                             "interface).")] = "127.0.0.1",
) -> None:
    """Run a job file until its trigger ends or SIGINT/SIGTERM stops it."""
    from microbatch.cli.jobfile import build_writer

    try:
        with StopOnSignal() as stopper:
            params = parse_params(param or [])
            spec = parse_trigger(trigger)
            writer = build_writer(job, params)
            display = LiveLine("microbatch") if out.is_terminal else BatchLines()
            query, stats, error = _run_query(writer, checkpoint=checkpoint, trigger=spec,
                                             name=name, stopper=stopper, display=display,
                                             metrics_port=metrics_port,
                                             metrics_host=metrics_host)
    except _user_errors() as exc:
        raise _fail(str(exc), getattr(exc, "code", 2)) from None
    except OSError as exc:
        raise _fail(f"cannot start the query: {exc}", 2) from None
    if error is not None:
        raise _query_failed(query, error, job)
    _finish(query, stats, stopper)


# ------------------------------------------------------------------ status


def status_document(checkpoint: Path, *, last: int = 10) -> dict[str, Any]:
    """Everything ``microbatch status`` shows (see :mod:`microbatch.observability.status`)."""
    from microbatch.observability.status import status_document as document

    return document(checkpoint, last=last)


WATCH_MIN_S, WATCH_MAX_S = 0.2, 3600.0
"""Bounds of ``status --watch`` (seconds between refreshes)."""


@app.command()
def status(
    checkpoint: Annotated[Path, typer.Argument(help="The query's checkpoint directory.",
                                               metavar="CHECKPOINT", show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object "
                                          "(with --watch: one per line).")] = False,
    last: Annotated[
        int, typer.Option(min=1, metavar="N", help="How many recent batches to show.")
    ] = 10,
    watch: Annotated[float | None, typer.Option(
        min=WATCH_MIN_S, max=WATCH_MAX_S, metavar="SECONDS",
        help="Refresh every SECONDS until Ctrl-C (which exits 0).")] = None,
    count: Annotated[int | None, typer.Option(
        min=1, metavar="K", help="With --watch: stop after K refreshes.")] = None,
) -> None:
    """Show where a query is (running, stopped or failed), its lag, state and alarms.

    Reads only the checkpoint, so it works on a running query (from any
    process) as on a stopped one.
    """
    from microbatch.observability.status_view import render_status

    def document() -> dict[str, Any]:
        try:
            return status_document(checkpoint, last=last)
        except _user_errors() as exc:
            raise _fail(str(exc), 2) from None
        except OSError as exc:
            raise _fail(f"cannot read checkpoint {checkpoint}: {exc}", 2) from None

    def show(doc: dict[str, Any]) -> None:
        if as_json:
            sys.stdout.write(json.dumps(doc, default=str) + "\n")
            sys.stdout.flush()
        else:
            out.print(render_status(doc))

    if watch is None:
        show(document())
        return
    shown = 0
    try:
        if out.is_terminal and not as_json:
            with Live(render_status(document()), console=out, auto_refresh=False,
                      screen=False) as live:
                shown = 1
                while count is None or shown < count:
                    time.sleep(watch)
                    live.update(render_status(document()), refresh=True)
                    shown += 1
            return
        while count is None or shown < count:
            if shown:
                time.sleep(watch)
                if not as_json:
                    out.print(f"[dim]--- {fmt_ms_time(int(time.time() * 1000))}[/]")
            show(document())
            shown += 1
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


# ------------------------------------------------------------------ report


@app.command()
def report(
    checkpoint: Annotated[Path, typer.Argument(help="The query's checkpoint directory.",
                                               metavar="CHECKPOINT", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", metavar="FILE.html",
                                         help="The HTML page to write.")] = Path("report.html"),
) -> None:
    """Write an HTML page of plots over the recorded batches (PNGs next to it).

    Rows/s in and processed, batch duration against the trigger interval,
    watermark lag, source lag, state size, late and dead-letter rows, and
    end-to-end latency; the page embeds the images, so it is one file to
    share.
    """
    from microbatch.observability.report import write_report

    try:
        written = write_report(checkpoint, output)
    except _user_errors() as exc:
        raise _fail(str(exc), 2) from None
    except OSError as exc:
        raise _fail(f"cannot write the report to {output}: {exc}", 2) from None
    err.print(f"report written: {escape(str(written.html))} "
              f"({written.batches} batches, {len(written.images)} plots)", soft_wrap=True)


# ------------------------------------------------------------------ demo


@app.command()
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
    try:
        with StopOnSignal() as stopper, running(receiver) as base_url:
            spec = parse_trigger(trigger)
            writer = demo_job.build(
                {"output": str(output), "rows_per_second": f"{rows_per_second:g}",
                 "webhook": f"{base_url}/alerts"}
            )
            display = DemoTable(seconds) if out.is_terminal else BatchLines()
            query, stats, error = _run_query(writer, checkpoint=checkpoint, trigger=spec,
                                             name="demo", stopper=stopper, display=display,
                                             seconds=seconds)
    except _user_errors() as exc:
        raise _fail(str(exc), getattr(exc, "code", 2)) from None
    except OSError as exc:
        raise _fail(f"cannot start the demo: {exc}", 2) from None
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
        f"  late:       {escape(str(out_dir))}-late  (payments more than an hour late)\n"
        f"  checkpoint: {escape(str(chk_dir))}  (run the demo again to continue from it; "
        f"`microbatch status {escape(str(chk_dir))}` shows its batches)\n"
        "read the alerts with:\n"
        f"  [cyan]import polars as pl; df = pl.read_delta({str(out_dir)!r})[/]",
        soft_wrap=True,
    )


# ------------------------------------------------------------------ backfill


@app.command()
def backfill(
    job: Annotated[Path, typer.Argument(help="The job file: a .py defining build(params).",
                                        metavar="JOB.py", show_default=False)],
    checkpoint: Annotated[Path, typer.Option("--checkpoint", "-c", help=(
        "Checkpoint directory of the replay: a new one replays the sources from their "
        "start; an existing one resumes an interrupted backfill."),
        metavar="DIR", show_default=False)],
    param: Annotated[list[str] | None, typer.Option(
        "--param", "-p", metavar="KEY=VALUE",
        help="A parameter passed to build(params); repeatable.")] = None,
    name: Annotated[str | None, typer.Option(metavar="NAME",
                                                help="A name for the query (logs, progress).")]
    = None,
) -> None:
    """Replay a job over its sources' history (available-now), with progress.

    Runs JOB.py exactly as `run --trigger available-now` does: every batch up to
    what the sources hold now, the final no-data batch, then exit. For Delta
    sources the backlog is known from the table's log: a terminal shows a
    progress bar (rows, versions and files done of total, rate, ETA); other
    outputs get one plain line per batch.
    """
    from microbatch.cli.backfill import BackfillBar, BackfillLines, BackfillTracker
    from microbatch.cli.jobfile import build_writer

    try:
        with StopOnSignal() as stopper:
            params = parse_params(param or [])
            spec = parse_trigger("available-now")
            writer = build_writer(job, params)
            tracker = BackfillTracker(writer, checkpoint)
            display = BackfillBar(tracker) if out.is_terminal else BackfillLines(tracker)
            query, stats, error = _run_query(writer, checkpoint=checkpoint, trigger=spec,
                                             name=name or "backfill", stopper=stopper,
                                             display=display)
    except _user_errors() as exc:
        raise _fail(str(exc), getattr(exc, "code", 2)) from None
    except OSError as exc:
        raise _fail(f"cannot start the backfill: {exc}", 2) from None
    if error is not None:
        raise _query_failed(query, error, job)
    _finish(query, stats, stopper)


# ------------------------------------------------------------------ diff


def _print_diff(result: Any, a: str, b: str) -> None:
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column(justify="right")
    verdict = "[green]equal[/]" if result.equal else "[red]different[/]"
    for key, value in (
        ("A", escape(a)), ("B", escape(b)),
        ("key", ", ".join(result.keys) or "(whole rows)"),
        ("rows in A", fmt_int(result.rows_a)), ("rows in B", fmt_int(result.rows_b)),
        ("only in A", fmt_int(result.only_in_a)), ("only in B", fmt_int(result.only_in_b)),
        ("changed", fmt_int(result.changed)), ("result", verdict),
    ):
        summary.add_row(key, value)
    out.print(summary)
    for line in result.schema_differences:
        out.print(f"[yellow]schema:[/] {escape(line)}")
    if result.changed_columns:
        out.print("changed columns: " + ", ".join(
            f"{escape(c)} ({n:,})" for c, n in result.changed_columns.items()))
    for title, frame in (("only in A", result.sample_only_in_a),
                         ("only in B", result.sample_only_in_b),
                         ("changed (A value, then B value)", result.sample_changed)):
        if frame.height == 0:
            continue
        table = Table(title=f"sample: {title}", title_justify="left", box=box.SIMPLE_HEAD)
        for col in frame.columns:
            table.add_column(escape(col.replace("__mb_b", " (B)")), overflow="fold")
        for row in frame.iter_rows():
            table.add_row(*(escape("null" if v is None else str(v)) for v in row))
        out.print(table)


@app.command()
def diff(
    table_a: Annotated[str, typer.Argument(metavar="TABLE_A", show_default=False,
                                           help="A Delta table: a path or URI (s3://...).")],
    table_b: Annotated[str, typer.Argument(metavar="TABLE_B", show_default=False,
                                           help="The Delta table to compare it with.")],
    *,
    key: Annotated[list[str] | None, typer.Option(
        "--key", "-k", metavar="COL[,COL...]",
        help="Columns identifying a row (repeatable or comma-separated); without, whole "
             "rows are compared as multisets.")] = None,
    sample: Annotated[int, typer.Option(min=0, metavar="N",
                                        help="Rows shown per kind of difference.")] = 5,
    tolerance: Annotated[float, typer.Option(min=0.0, metavar="X", help=(
        "Float values within X of each other are equal."))] = 0.0,
    rel_tolerance: Annotated[float, typer.Option(min=0.0, metavar="R", help=(
        "Float values within R times the larger magnitude are equal (sums taken in "
        "another order differ in the last bits); 0 compares exactly."))] = 1e-9,
    storage_option: Annotated[list[str] | None, typer.Option(
        "--storage-option", metavar="KEY=VALUE",
        help="A delta-rs storage option for both tables (e.g. AWS_ENDPOINT_URL=...); "
             "repeatable.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Compare two Delta tables: rows only in A, only in B, and changed.

    Exit code 0 when the tables are equal, 1 when they differ, 2 on an error
    (a table that cannot be read, a key column that is missing or not unique).
    """
    import polars as pl

    from microbatch.tools.diff import diff_frames

    try:
        options = parse_params(storage_option or []) or None
        keys = [k.strip() for item in key or [] for k in item.split(",") if k.strip()]
        frames = []
        for uri in (table_a, table_b):
            try:
                frames.append(pl.read_delta(uri, storage_options=options))
            except Exception as exc:
                raise CliError(f"cannot read Delta table {uri}: "
                               f"{str(exc).splitlines()[0] if str(exc) else exc!r}") from exc
        result = diff_frames(frames[0], frames[1], keys=keys, tolerance=tolerance,
                             rel_tolerance=rel_tolerance, sample=sample)
    except _user_errors() as exc:
        raise _fail(str(exc), 2) from None
    if as_json:
        sys.stdout.write(json.dumps(result.to_json(), default=str) + "\n")
    else:
        _print_diff(result, table_a, table_b)
    raise typer.Exit(0 if result.equal else 1)


def main() -> None:
    """Entry point of the ``microbatch`` console script."""
    app()


if __name__ == "__main__":
    main()
