"""``microbatch state`` (an operator's state at a committed batch, read offline) and
``microbatch savepoint`` (every operator's state and offsets, for an upgraded job)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.markup import escape
from rich.table import Table

from microbatch.cli.common import CliError, fail
from microbatch.cli.display import out
from microbatch.exceptions import USER_ERRORS

if TYPE_CHECKING:
    from microbatch.api.writer import DataStreamWriter

__all__ = ["savepoint", "start_from_savepoint", "state"]

Format = Literal["table", "json", "csv"]


def state(
    checkpoint: Annotated[Path, typer.Argument(help="The query's checkpoint directory.",
                                               metavar="CHECKPOINT", show_default=False)],
    operator: Annotated[str | None, typer.Option(
        "--operator", metavar="ID", help="The operator (default: the only stateful one).")] = None,
    batch: Annotated[int | None, typer.Option(
        "--batch", metavar="N", min=0,
        help="The state after committed batch N (default: the last committed).")] = None,
    fmt: Annotated[str, typer.Option(
        "--format", metavar="table|json|csv",
        help="table (operators, then the state), or the state alone as JSON lines or CSV.")
    ] = "table",
    limit: Annotated[int, typer.Option(min=1, metavar="ROWS",
                                       help="With --format table: rows shown.")] = 50,
) -> None:
    """Print the stateful operators of a checkpoint and one operator's state
    (keys, state columns, timers, waiting rows) after a committed batch.

    Reads only files and takes no lock: safe on a running query.
    """
    from microbatch.state.reader import StateCatalog, batch_ranges

    if fmt not in ("table", "json", "csv"):
        raise fail(f"--format must be table, json or csv, not {fmt!r}", 2)
    try:
        catalog = StateCatalog.open(checkpoint)
        chosen = None
        if operator is not None or len(catalog.operators) == 1 or fmt != "table":
            chosen = catalog.choose(operator)
        at = catalog.batch(chosen, batch) if chosen is not None else None
        frame = catalog.frame(chosen, at) if chosen is not None and at is not None else None
        listing = [] if fmt != "table" else [
            (op, kind, catalog.readable_batches(op)) for op, kind in catalog.kinds().items()]
    except USER_ERRORS as exc:
        raise fail(str(exc), 2) from None
    except OSError as exc:
        raise fail(f"cannot read checkpoint {checkpoint}: {exc}", 2) from None
    if fmt == "json":
        assert frame is not None
        for row in frame.to_dicts():
            sys.stdout.write(json.dumps(row, default=str) + "\n")
        return
    if fmt == "csv":
        assert frame is not None
        sys.stdout.write(frame.write_csv())
        return
    table = Table(title=f"stateful operators of {escape(str(catalog.root))}")
    for name in ("operator", "kind", "stores", "readable batches"):
        table.add_column(name)
    for op, kind, readable in listing:
        stores = ", ".join(s.name for s in catalog.operators[op][0][1].stores) or "-"
        table.add_row(op, kind, escape(stores), batch_ranges(readable) or "none")
    out.print(table)
    if frame is None:
        if catalog.operators:
            out.print("choose an operator with --operator ID to see its state")
        return
    shown = Table(title=f"{chosen} after batch {at}: {frame.height} rows"
                  + (f" (first {limit})" if frame.height > limit else ""))
    for name in frame.columns:
        shown.add_column(escape(name))
    for values in frame.head(limit).iter_rows():
        shown.add_row(*(escape("null" if v is None else str(v)) for v in values))
    out.print(shown)


def savepoint(
    checkpoint: Annotated[Path, typer.Argument(help="The query's checkpoint directory.",
                                               metavar="CHECKPOINT", show_default=False)],
    directory: Annotated[Path, typer.Argument(help="A new directory for the savepoint.",
                                              metavar="DIR", show_default=False)],
) -> None:
    """Save every operator's state at the last committed batch, with its offsets, to
    Parquet in DIR; start a changed job from it with `run --from-savepoint DIR`.

    Reads only files and takes no lock: the query may keep running.
    """
    from microbatch.state.savepoint import write_savepoint

    try:
        manifest = write_savepoint(checkpoint, directory)
    except USER_ERRORS as exc:
        raise fail(str(exc), 2) from None
    except OSError as exc:
        raise fail(f"cannot write the savepoint: {exc}", 2) from None
    ops = ", ".join(f"{k} ({v['kind']})" for k, v in manifest["operators"].items()) or "none"
    out.print(f"savepoint of batch {manifest['batch_id']} written to {escape(str(directory))}; "
              f"operators: {escape(ops)}")


def start_from_savepoint(savepoint: Path | None, state_map: list[str], checkpoint: Path,
                         writer: DataStreamWriter, *, sharded: bool,
                         note: Callable[[str], None]) -> None:
    """``run --from-savepoint DIR [--map OLD=NEW]``: make ``checkpoint`` continue from
    the savepoint (see :func:`microbatch.state.restore.restore_savepoint`)."""
    from microbatch.state.restore import parse_map, restore_savepoint

    if savepoint is None:
        raise CliError("--map pairs operators of a savepoint: use it with --from-savepoint")
    if sharded:
        raise CliError("--from-savepoint starts a single-process checkpoint; starting a "
                       "Ray-sharded one from a savepoint is not supported yet (leave "
                       "--workers/--ray-address out)")
    done = restore_savepoint(savepoint, checkpoint, writer, parse_map(state_map))
    note(f"{checkpoint} {done} from savepoint {savepoint}")
