"""Replay: run a job's (possibly new) code over exactly the batches an old
checkpoint recorded (``microbatch replay``, ``DataStreamWriter.replay``).

A live run cuts batches by arrival (a trigger interval, a batch cap), and
lateness, so the output, depends on where the cuts fell. A replay does not
plan: batch N is ``OLD/offsets/N`` as recorded (its ranges, watermark and
timestamp, the same batch id), written ahead into the NEW checkpoint and run
through steps 2..7 like any batch::

    next batch N:   N <= last and commits/N exists in OLD -> OLD's offsets/N
                    otherwise                            -> none: the run ends
    N < first:      warm-up: state only, no sink writes (``--batches A..B``)
    at the end:     no flush batch (OLD's flush batch, if any, is recorded)

The NEW checkpoint is a fresh one whose ``metadata`` records ``replay_of``
(OLD's path and query id, the batch range); the sources' own state in OLD
(``sources/<id>/``, e.g. the file ledger that names a files source's offsets)
is copied into it first, so the recorded ranges name the same rows. A SIGKILL
costs nothing: the same replay on NEW recovers the last uncommitted batch from
NEW's own write-ahead entry, then goes on with OLD's. Once it has run, NEW is
an ordinary checkpoint: ``run`` on it continues live from the last replayed
ends.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from microbatch.checkpoint import Checkpoint, OffsetEntry
from microbatch.checkpoint.files import (
    make_dirs,
    read_json_object,
    write_bytes_atomic,
    write_json_atomic,
)
from microbatch.engine.trigger_loops import BatchRunner
from microbatch.exceptions import ReplayError

__all__ = [
    "RecordedBatches",
    "ReplayLoop",
    "parse_batches",
    "prepare_replay",
    "refuse_unfinished",
    "replay_of",
    "start_checkpoint",
]

_RANGE = re.compile(r"^\s*(\d+)\s*\.\.\s*(\d+)\s*$")


def parse_batches(text: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """``"A..B"`` (both included) or ``(A, B)`` as a checked pair; ``None`` unchanged."""
    if text is None:
        return None
    if isinstance(text, tuple):
        first, last = text
    else:
        match = _RANGE.match(text)
        if match is None:
            raise ReplayError(
                f"--batches {text!r} is not a range of batch ids: write A..B, both included "
                "(e.g. --batches 0..41), or leave it out to replay every committed batch"
            )
        first, last = int(match[1]), int(match[2])
    if isinstance(first, bool) or isinstance(last, bool) or not 0 <= first <= last:
        raise ReplayError(
            f"batches {first}..{last}: the first batch id must be at least 0 and at most "
            "the last (both are included)"
        )
    return first, last


@dataclass(frozen=True)
class RecordedBatches:
    """The batches ``0..last`` of an old checkpoint, to be run again as recorded;
    the ones below ``first`` only warm the state up (their sink writes are skipped).

    Holds the entries in memory: OLD may go on running (and purging) meanwhile.
    """

    old_root: Path
    old_query_id: str
    first: int
    last: int
    entries: Mapping[int, OffsetEntry]

    def entry(self, batch_id: int) -> OffsetEntry | None:
        """OLD's ``offsets/batch_id``, or ``None`` past the last batch to replay."""
        return self.entries.get(batch_id) if batch_id <= self.last else None

    def warms_up(self, batch_id: int) -> bool:
        """True for a batch run only to rebuild the state before ``first``."""
        return batch_id < self.first

    def describe(self) -> dict[str, Any]:
        """What NEW's ``metadata`` records as ``replay_of``."""
        return {"checkpoint": str(self.old_root), "query_id": self.old_query_id,
                "batches": [self.first, self.last]}

    def check_identity(self, identity: Mapping[str, Any]) -> None:
        """Refuse a job whose sources are not the ones OLD recorded (a batch cap
        is not identity: the ranges are recorded)."""
        recorded = dict(self.entries[self.last].identity).get("sources", {})
        current = dict(identity).get("sources", {})
        if recorded == current:
            return
        diffs = [
            f"source {sid}: recorded {recorded.get(sid)!r}, the job has {current.get(sid)!r}"
            for sid in sorted(set(recorded) | set(current), key=lambda s: (len(s), s))
            if recorded.get(sid) != current.get(sid)
        ]
        raise ReplayError(
            f"cannot replay {self.old_root}: the job reads other sources than the ones "
            f"its batches recorded ({'; '.join(diffs)}). A replay re-reads the recorded "
            "offsets of the same sources: pass the --param values that name the sources "
            "the old run read (the outputs may differ), and keep their order in the job."
        )

    @classmethod
    def load(cls, old: str | os.PathLike[str], batches: tuple[int, int] | None) -> RecordedBatches:
        """OLD's committed batches ``0..B`` (``batches`` or every committed one),
        refusing what cannot be replayed exactly."""
        chk = Checkpoint(old)
        if not chk.exists():
            raise ReplayError(
                f"--from {chk.root} is not a microbatch checkpoint (no metadata file): "
                "name the checkpoint directory of the run to replay"
            )
        query_id = str(chk.read_metadata()["query_id"])
        committed = chk.commits.batch_ids()
        if not committed:
            raise ReplayError(f"checkpoint {chk.root} has no committed batch: nothing to replay")
        first, last = batches if batches is not None else (0, committed[-1])
        if last > committed[-1] or chk.commits.get(last) is None:
            raise ReplayError(
                f"checkpoint {chk.root} has no committed batch {last} (its last committed "
                f"batch is {committed[-1]}): a replay runs only batches the old run "
                f"committed. Ask for --batches {first}..{committed[-1]} at most."
            )
        held = set(chk.offsets.batch_ids())
        missing = [b for b in range(last + 1) if b not in held]
        if missing:
            raise ReplayError(
                f"checkpoint {chk.root} no longer holds batch {missing[0]} in its offsets "
                f"log (it keeps batches {min(held, default=0)}..{max(held, default=0)}: older "
                "entries were purged after the writer's `retention` batches). A replay needs "
                f"every batch from 0 to {last} (batches before the range rebuild the state). "
                "Start the live job with a larger retention (start(..., retention=N)) to be "
                "able to replay it, or backfill from the sources instead."
            )
        entries: dict[int, OffsetEntry] = {}
        for batch_id in range(last + 1):
            entry = chk.offsets.get(batch_id)
            if entry is None:  # purged while we read
                raise ReplayError(
                    f"batch {batch_id} of {chk.root} was purged while the replay read it; "
                    "raise the live job's `retention` and replay again"
                )
            entries[batch_id] = entry
        return cls(chk.root, query_id, first, last, entries)


def prepare_replay(
    old: str | os.PathLike[str],
    new: str | os.PathLike[str],
    batches: str | tuple[int, int] | None,
) -> RecordedBatches:
    """The batches to replay from ``old`` into ``new``: a fresh ``new``, or one that
    holds an interrupted (or finished) replay of the same ``old`` and range."""
    wanted = parse_batches(batches)
    old_root = Path(old).expanduser().resolve()
    new_chk = Checkpoint(new)
    if new_chk.root == old_root:
        raise ReplayError(
            f"--checkpoint {new_chk.root} is the checkpoint to replay: a replay writes a new "
            "checkpoint; name a new directory"
        )
    stored: dict[str, Any] | None = None
    if new_chk.exists():
        stored = new_chk.read_metadata().get("replay_of")
        if not isinstance(stored, dict):
            raise ReplayError(
                f"--checkpoint {new_chk.root} already holds a checkpoint that is not a replay: "
                "a replay starts on a new directory (or resumes its own); name a new one"
            )
        if Path(str(stored.get("checkpoint"))) != old_root or (
            wanted is not None and list(wanted) != stored.get("batches")
        ):
            raise ReplayError(
                f"--checkpoint {new_chk.root} holds a replay of {stored.get('checkpoint')} "
                f"batches {_range(stored.get('batches'))}, not of {old_root} batches "
                f"{_range(wanted) if wanted else 'all'}: resume it with the same --from "
                "and --batches, or name a new directory"
            )
        if wanted is None:
            wanted = parse_batches(tuple(stored["batches"]))
    recorded = RecordedBatches.load(old_root, wanted)
    if stored is not None and stored.get("query_id") != recorded.old_query_id:
        raise ReplayError(
            f"--checkpoint {new_chk.root} replays query {stored.get('query_id')}, but "
            f"{old_root} now holds query {recorded.old_query_id} (the directory was "
            "replaced): name a new directory for this replay"
        )
    return recorded


def start_checkpoint(recorded: RecordedBatches, new: Checkpoint) -> None:
    """Make ``new`` a replay checkpoint of ``recorded`` (nothing when it is one).

    NOTE: the sources' state is copied before the metadata is written: the
    metadata is the commit point, a crash before it leaves a directory the
    next attempt copies into again. It is copied after the recorded entries
    were read: a source makes its state durable before the engine writes an
    offsets entry naming it (the file ledger), so the copy covers every range.
    """
    if new.exists():
        return
    make_dirs(new.root)
    new.lock()  # NOTE: two replays starting at once must not write two query ids
    try:
        if new.exists():
            return
        new.refuse_logs_without_metadata()
        for sid in sorted(dict(recorded.entries[recorded.last].identity).get("sources", {})):
            _copy_tree(recorded.old_root / "sources" / sid, new.root / "sources" / sid)
        write_json_atomic(new.metadata_path, "metadata", {
            "query_id": str(uuid.uuid4()),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "replay_of": recorded.describe(),
        })
    finally:
        new.unlock()


def replay_of(checkpoint: str | os.PathLike[str]) -> dict[str, Any] | None:
    """What a checkpoint is a replay of (its metadata's ``replay_of``), or ``None``."""
    chk = Checkpoint(checkpoint)
    if not chk.exists():
        return None
    stored = read_json_object(chk.metadata_path, "metadata").get("replay_of")
    return stored if isinstance(stored, dict) else None


def refuse_unfinished(meta: Mapping[str, Any], next_batch_id: int, root: Path) -> None:
    """Refuse to run a replay checkpoint live before its replay ended: the batches
    it has not replayed yet would be cut anew, by arrival, and differ from the
    record. (A finished replay is an ordinary checkpoint.)"""
    stored = meta.get("replay_of")
    if not isinstance(stored, dict):
        return
    last = stored.get("batches", [0, -1])[1]
    if next_batch_id <= last:
        raise ReplayError(
            f"checkpoint {root} holds a replay of {stored.get('checkpoint')} batches "
            f"{_range(stored.get('batches'))} that stopped before batch {next_batch_id} "
            "ended; running it live now would cut the remaining batches anew. Finish it "
            f"first: microbatch replay JOB --from {stored.get('checkpoint')} --checkpoint "
            f"{root} (the same command that started it)."
        )


def _copy_tree(src: Path, dst: Path) -> None:
    """Copy every file under ``src`` durably (atomic writes); nothing when absent."""
    if not src.is_dir():
        return
    for root, _, names in os.walk(src):
        target = dst / Path(root).relative_to(src)
        make_dirs(target)
        for name in sorted(names):
            if name.startswith("."):  # temp files of an atomic write in progress
                continue
            write_bytes_atomic(target / name, (Path(root) / name).read_bytes())


def _range(batches: object) -> str:
    if isinstance(batches, list | tuple) and len(batches) == 2:
        return f"{batches[0]}..{batches[1]}"
    return "all"


class ReplayLoop:
    """A replay's trigger loop: the recovered batch, then the recorded batches one
    after the other until none is left; then stop (like ``available-now``, but
    the engine's plan comes from the record, and no flush batch is added)."""

    drains_backlog = False

    def run(self, runner: BatchRunner) -> None:
        while not runner.stopping() and runner.run_batch():
            pass
        runner.end_of_input()
        runner.idle()
