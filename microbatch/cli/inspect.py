"""The commands that read a checkpoint: ``status`` and ``report``."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.live import Live
from rich.markup import escape

from microbatch.cli.common import fail
from microbatch.cli.display import (
    err,
    fmt_ms_time,
    out,
)
from microbatch.exceptions import USER_ERRORS

# ------------------------------------------------------------------ status


def status_document(checkpoint: Path, *, last: int = 10) -> dict[str, Any]:
    """Everything ``microbatch status`` shows (see :mod:`microbatch.observability.status`)."""
    from microbatch.observability.status import status_document as document

    return document(checkpoint, last=last)


WATCH_MIN_S, WATCH_MAX_S = 0.2, 3600.0
"""Bounds of ``status --watch`` (seconds between refreshes)."""


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
        except USER_ERRORS as exc:
            raise fail(str(exc), 2) from None
        except OSError as exc:
            raise fail(f"cannot read checkpoint {checkpoint}: {exc}", 2) from None

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
    # Ctrl-C is how a watch ends: let it raise KeyboardInterrupt here (exit 0)
    signal.signal(signal.SIGINT, signal.default_int_handler)
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
    except USER_ERRORS as exc:
        raise fail(str(exc), 2) from None
    except OSError as exc:
        raise fail(f"cannot write the report to {output}: {exc}", 2) from None
    err.print(f"report written: {escape(str(written.html))} "
              f"({written.batches} batches, {len(written.images)} plots)", soft_wrap=True)
