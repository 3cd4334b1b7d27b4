"""The commands over tables and logs: ``diff`` (two Delta or Iceberg tables) and ``lateness``
(what watermark delays and allowed lateness cost on a log)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from microbatch.cli.common import CliError, fail, parse_params
from microbatch.cli.display import (
    fmt_int,
    out,
)
from microbatch.exceptions import USER_ERRORS


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


def diff(
    table_a: Annotated[str, typer.Argument(
        metavar="TABLE_A", show_default=False,
        help="A Delta table (a path or URI, s3://...), an Iceberg table directory or "
             ".metadata.json file, or NAMESPACE.TABLE of the --catalog.")],
    table_b: Annotated[str, typer.Argument(metavar="TABLE_B", show_default=False,
                                           help="The table to compare it with.")],
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
    catalog: Annotated[str | None, typer.Option(
        "--catalog", metavar="SPEC",
        help="The Iceberg catalog of NAMESPACE.TABLE arguments: sqlite:///PATH.db, "
             "http(s)://HOST (REST) or a configured catalog's name.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Compare two tables (Delta or Iceberg): rows only in A, only in B, and changed.

    Exit code 0 when the tables are equal, 1 when they differ, 2 on an error
    (a table that cannot be read, a key column that is missing or not unique).
    """
    from microbatch.cli.table_refs import parse_table_ref
    from microbatch.tools.diff import diff_frames

    try:
        options = parse_params(storage_option or []) or None
        keys = [k.strip() for item in key or [] for k in item.split(",") if k.strip()]
        frames = [parse_table_ref(ref, catalog=catalog).read(options)
                  for ref in (table_a, table_b)]
        result = diff_frames(frames[0], frames[1], keys=keys, tolerance=tolerance,
                             rel_tolerance=rel_tolerance, sample=sample)
    except USER_ERRORS as exc:
        raise fail(str(exc), 2) from None
    if as_json:
        sys.stdout.write(json.dumps(result.to_json(), default=str) + "\n")
    else:
        _print_diff(result, table_a, table_b)
    raise typer.Exit(0 if result.equal else 1)


def lateness(
    log: Annotated[str, typer.Argument(
        metavar="LOG", show_default=False,
        help="A directory of Parquet files (arrival = mtime), a Delta table (arrival = "
             "commit time), or kafka://HOST:PORT/TOPIC (arrival = message timestamp).")],
    *,
    time_column: Annotated[str, typer.Option("--time", metavar="COL",
                                             help="The event-time column.")] = "event_time",
    key: Annotated[list[str] | None, typer.Option(
        "--key", "-k", metavar="COL[,COL...]",
        help="The group keys (repeatable or comma-separated).")] = None,
    window: Annotated[str, typer.Option(metavar="DURATION",
                                        help="The tumbling window.")] = "1m",
    delay: Annotated[str, typer.Option(
        metavar="D[,D...]", help="Watermark delays to try.")] = "1s,5s,10s,30s,1m,5m",
    allowed_lateness: Annotated[str, typer.Option(
        metavar="L[,L...]", help="Allowed lateness values to try.")] = "0s,1m,10m,1h",
    trigger: Annotated[str, typer.Option(
        metavar="DURATION", help="The batch interval the replay assumes.")] = "1s",
    min_count: Annotated[int | None, typer.Option(
        min=1, metavar="N", help="A rule: a window alerts with at least N rows.")] = None,
    plot: Annotated[Path | None, typer.Option(metavar="FILE.png",
                                              help="Also draw the grid.")] = None,
    storage_option: Annotated[list[str] | None, typer.Option(
        "--storage-option", metavar="KEY=VALUE",
        help="A delta-rs storage option (e.g. AWS_ENDPOINT_URL=...); repeatable.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON rows.")] = False,
) -> None:
    """What each watermark delay and allowed lateness costs on a real log.

    Replays the log as a live query batched by the trigger would and reports,
    per (delay, allowed lateness): the share of rows late, of windows differing
    from a batch recompute, of a rule's alerts missed, the windows held in state,
    and how long after a window's end its first and final results come.
    """
    from microbatch.durations import parse_duration_ms
    from microbatch.tools import lateness as profiles

    try:
        keys = [k.strip() for item in key or [] for k in item.split(",") if k.strip()]
        if log.startswith("kafka://"):
            where, _, topic = log.removeprefix("kafka://").partition("/")
            if not where or not topic:
                raise CliError(f"a Kafka log is kafka://HOST:PORT/TOPIC, got {log!r}")
            data = profiles.load_kafka(where, topic, time_column=time_column, keys=keys)
        elif Path(log, "_delta_log").is_dir() or "://" in log:
            data = profiles.load_delta(log, time_column=time_column, keys=keys,
                                       storage_options=parse_params(storage_option or []))
        elif Path(log).is_dir():
            data = profiles.load_parquet_dir(log, time_column=time_column, keys=keys)
        else:
            raise CliError(f"{log} is not a directory, a Delta table or kafka://HOST:PORT/TOPIC")
        table = profiles.profile(
            data,
            window_ms=parse_duration_ms(window, what="--window"),
            delays_ms=[parse_duration_ms(d, what="--delay") for d in delay.split(",")],
            lateness_ms=[parse_duration_ms(a, what="--allowed-lateness")
                         for a in allowed_lateness.split(",")],
            trigger_ms=parse_duration_ms(trigger, what="--trigger"),
            min_count=min_count,
        )
    except USER_ERRORS as exc:
        raise fail(str(exc), 2) from None
    if plot is not None:
        profiles.plot(table, plot, title=f"lateness profile of {data.source} "
                      f"({data.rows.height:,} rows, {window} windows)")
    if as_json:
        sys.stdout.write(table.write_json() + "\n")
        return
    _print_profile(table, data.rows.height, plot)


def _print_profile(table: Any, rows: int, plot: Path | None) -> None:
    grid = Table(box=box.SIMPLE_HEAD, title=f"lateness profile: {rows:,} rows")
    heads = {"delay_s": "delay s", "allowed_lateness_s": "lateness s", "late_rows": "late rows",
             "windows_differ": "windows differ", "alerts_missed": "alerts missed",
             "state_peak": "state peak", "state_mean": "state mean",
             "first_result_s": "first result s", "final_result_s": "final result s"}
    columns = [c for c in heads if c in table.columns]
    for c in columns:
        grid.add_column(heads[c], justify="right", no_wrap=True, min_width=len(heads[c]))
    for row in table.iter_rows(named=True):
        grid.add_row(*[
            f"{row[c]:.2%}" if c in ("late_rows", "windows_differ", "alerts_missed")
            else "-" if row[c] is None else f"{row[c]:,}" if isinstance(row[c], int)
            else f"{row[c]:g}" for c in columns])
    # piped: no terminal width to fit, so never fold or cut a header to 80 columns
    out.print(grid, width=None if out.is_terminal else max(out.width, 400), crop=False)
    if plot is not None:
        out.print(f"plot: {escape(str(plot))}")
