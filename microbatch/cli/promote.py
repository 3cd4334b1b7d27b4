"""``microbatch promote``: swap a rebuilt Delta table in for the live one."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from microbatch.cli.common import fail, parse_params
from microbatch.cli.display import out
from microbatch.exceptions import USER_ERRORS

__all__ = ["promote"]


def promote(
    rebuild: Annotated[str, typer.Argument(
        metavar="REBUILD", show_default=False,
        help="The rebuilt Delta table (a path or URI), written by --checkpoint.")],
    *,
    to: Annotated[str, typer.Option(
        "--to", metavar="LIVE", show_default=False,
        help="The live Delta table whose rows are replaced.")],
    checkpoint: Annotated[str, typer.Option(
        "--checkpoint", metavar="NEW", show_default=False,
        help="The rebuild's checkpoint: the query that writes LIVE from now on.")],
    storage_option: Annotated[list[str] | None, typer.Option(
        "--storage-option", metavar="KEY=VALUE",
        help="A delta-rs storage option for both tables; repeatable.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Make REBUILD the live table: replace LIVE's rows with REBUILD's in one Delta
    commit, and hand LIVE over to the query of checkpoint NEW.

    Two commits on LIVE: first its other writers are retired (their checkpoints
    are refused on LIVE from then on) and NEW is registered; then one overwrite
    commit writes REBUILD's rows (its schema and partitioning) with NEW's app
    transaction at NEW's last committed batch. Readers see the old rows or the
    new ones, never a mix; the old rows stay readable by time travel (undo:
    DeltaTable(LIVE).restore(VERSION), the version printed). Afterwards run the
    job with --checkpoint NEW writing to LIVE. Refused (exit 2, nothing
    changed) while NEW or a writer of LIVE is running, or while NEW has a batch
    not committed. Re-running after a crash finishes the promote, or does
    nothing when it had landed. Promote a job's late and dead-letter tables the
    same way, one command per table, with the same NEW.
    """
    from microbatch.tools.promote import promote as run_promote

    try:
        result = run_promote(rebuild, live=to, checkpoint=checkpoint,
                             storage_options=parse_params(storage_option or []))
    except USER_ERRORS as exc:
        raise fail(str(exc), 2) from None
    if as_json:
        sys.stdout.write(json.dumps(result.to_json()) + "\n")
        return
    if result.already:
        out.print(f"{result.live} already holds {result.rebuild} (version {result.version}, "
                  f"query {result.query_id} up to batch {result.batch}); nothing to do")
        return
    retired = ", ".join(result.retired) or "none"
    out.print(f"promoted {result.rebuild} (version {result.rebuild_version}) into "
              f"{result.live} as version {result.version}; writer from now on: query "
              f"{result.query_id} (checkpoint {Path(checkpoint).resolve()}, batches up to "
              f"{result.batch} are in); retired writers: {retired}. Undo: "
              f"DeltaTable({result.live!r}).restore({result.previous_version})")
