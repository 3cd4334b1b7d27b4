"""``microbatch sql FILE.sql --checkpoint DIR``: run the queries of a SQL script.

A script (see :mod:`microbatch.sql.script`) declares tables and defines one
query per ``INSERT INTO`` and per ``CREATE MATERIALIZED VIEW``. Each query
runs as ``microbatch run`` runs a job: its checkpoint is ``DIR/<table>`` (the
table it writes), so ``microbatch status DIR/<table>`` shows it and a restart
continues each query exactly where it stopped; the trigger, the progress
lines, the signals (a first SIGINT/SIGTERM finishes every query's batch in
flight) and the exit codes are ``run``'s. With one query the display is
``run``'s; with several, every progress line starts with ``[table]``.

A mistake in the script (a syntax error, an unknown option, a missing
``--param``, a query the engine cannot run incrementally) is one paragraph
naming ``FILE:LINE:COLUMN`` and the fix, exit code 2, before anything runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from microbatch.api.query import StreamingQuery
from microbatch.cli import preflight
from microbatch.cli.common import fail, parse_params
from microbatch.cli.display import BatchLines, LiveLine, RunStats, err, out
from microbatch.cli.queries import (
    POLL_S,
    StopOnSignal,
    _finish,
    _latest_progress_id,
    _native_panic,
    _query_failed,
    _run_query,
)
from microbatch.exceptions import USER_ERRORS, QueryTerminatedError
from microbatch.plan.triggers import parse_trigger

if TYPE_CHECKING:
    from microbatch.sql.script import ScriptQuery

__all__ = ["sql"]


class _AllQueries:
    """Every query of the script, stopped together (what a signal stops)."""

    def __init__(self) -> None:
        self.queries: list[StreamingQuery] = []

    def request_stop(self) -> None:
        """Ask every started query to stop after its batch in flight."""
        for query in self.queries:
            query.request_stop()


def sql(
    script: Annotated[Path, typer.Argument(help="The SQL script: CREATE TABLE, CREATE "
                                           "MATERIALIZED VIEW and INSERT INTO statements.",
                                           metavar="FILE.sql", show_default=False)],
    *,
    checkpoint: Annotated[Path, typer.Option("--checkpoint", "-c", help=(
        "Checkpoint directory: each query keeps its checkpoint in DIR/<the table it "
        "writes>, and restarts exactly where it stopped."),
        metavar="DIR", show_default=False)],
    trigger: Annotated[str, typer.Option(metavar="TRIGGER", help=(
        "'10s'/'1m' (interval), 'once' or 'available-now'; 0s: batches back to back."
    ))] = "0s",
    param: Annotated[list[str] | None, typer.Option(
        "--param", "-p", metavar="NAME=VALUE",
        help="Replaces ${NAME} in the script; every ${NAME} needs one, and every one "
             "given must be used; repeatable.")] = None,
) -> None:
    """Run the queries of a SQL script until their trigger ends or SIGINT/SIGTERM stops them."""
    queries: list[tuple[ScriptQuery, StreamingQuery]] = []
    try:
        with StopOnSignal() as stopper:
            params = parse_params(param or [])
            spec = parse_trigger(trigger)
            from microbatch.sql.script import load_script  # NOTE: sqlglot only for `sql`

            compiled = load_script(script, params)
            for item in compiled.queries:
                preflight.check(item.writer)
            if len(compiled.queries) == 1:
                item = compiled.queries[0]
                display = LiveLine(f"microbatch {item.name}") if out.is_terminal else BatchLines()
                query, stats, error = _run_query(item.writer, checkpoint=checkpoint / item.name,
                                                 trigger=spec, name=item.name, stopper=stopper,
                                                 display=display)
                results = [(item, query, stats, error)]
            else:
                group = _AllQueries()
                stopper.attach(group)
                baselines = {}
                for item in compiled.queries:
                    baselines[item.name] = _latest_progress_id(checkpoint / item.name)
                    query = item.writer.start(checkpoint / item.name, spec, name=item.name)
                    group.queries.append(query)
                    queries.append((item, query))
                    if stopper.reason is not None:
                        query.request_stop()
                results = _follow(queries, baselines, stopper)
    except USER_ERRORS as exc:
        _stop_all(queries)
        raise fail(str(exc), getattr(exc, "code", 2)) from None
    except OSError as exc:
        _stop_all(queries)
        raise fail(f"cannot start the queries of {script}: {exc}", 2) from None
    except BaseException as exc:
        _stop_all(queries)
        raise _native_panic(exc, "query") from None
    for _item, query, _stats, error in results:
        if error is not None:
            raise _query_failed(query, error, script)
    for index, (item, query, stats, _error) in enumerate(results):
        if len(results) > 1:
            err.print(escape(f"[{item.name}]"), end=" ")  # not rich markup
        if index < len(results) - 1:
            _finish_quietly(query, stats, stopper)
        else:
            _finish(query, stats, stopper)


def _follow(
    queries: list[tuple[ScriptQuery, StreamingQuery]], baselines: dict[str, int],
    stopper: StopOnSignal,
) -> list[tuple[ScriptQuery, StreamingQuery, RunStats, QueryTerminatedError | None]]:
    """Print each query's batches (prefixed by its table) until every one has ended;
    a failed query stops the others (after their batch in flight)."""
    stats = {item.name: RunStats() for item, _ in queries}
    seen = dict(baselines)
    errors: dict[str, QueryTerminatedError | None] = {item.name: None for item, _ in queries}
    done: set[str] = set()
    lines = {item.name: BatchLines(prefix=f"[{item.name}] ") for item, _ in queries}
    while len(done) < len(queries):
        for item, query in queries:
            if item.name in done:
                continue
            try:
                finished = query.await_termination(timeout=POLL_S / len(queries))
            except QueryTerminatedError as exc:
                errors[item.name], finished = exc, True
                for _, other in queries:
                    other.request_stop()
            for record in query.recent_progress:
                if record["batch_id"] > seen[item.name]:
                    seen[item.name] = record["batch_id"]
                    stats[item.name].add(record)
                    lines[item.name].batch(record, stats[item.name])
            if finished:
                done.add(item.name)
        if stopper.reason is not None and not stopper.announced:
            stopper.announced = True
            err.print(f"{stopper.reason}: finishing the batches in flight, then stopping "
                      "(a second SIGINT/SIGTERM exits at once)", soft_wrap=True)
    return [(item, query, stats[item.name], errors[item.name]) for item, query in queries]


def _finish_quietly(query: StreamingQuery, stats: RunStats, stopper: StopOnSignal) -> None:
    """The totals line of a query that is not the last (no exit)."""
    why = f" ({stopper.reason})" if stopper.reason else ""
    committed = query.status["next_batch_id"] - 1
    err.print(
        f"query {query.id} stopped{why}: {stats.batches} batches, "
        f"{stats.input_rows:,} rows in, {stats.output_rows:,} rows out in this run; "
        f"last committed batch: {committed if committed >= 0 else 'none'}.",
        soft_wrap=True,
    )


def _stop_all(queries: list[tuple[ScriptQuery, StreamingQuery]]) -> None:
    """Stop the queries already started when a later one cannot start."""
    for _, query in queries:
        query.stop()
