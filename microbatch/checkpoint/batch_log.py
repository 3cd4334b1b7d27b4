"""The generic batch-id-keyed log behind ``offsets/`` and ``commits/``.

One file per batch id, named by the id, holding one typed entry
(:mod:`microbatch.checkpoint.entries`) in the checksummed envelope of
:mod:`microbatch.checkpoint.files`. ``add`` never overwrites; ``latest`` finds the
highest id; ``check_contiguous`` refuses gaps; ``purge_before`` removes ids below
a bound. Modeled on Spark's ``HDFSMetadataLog``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Generic, TypeVar

from microbatch.checkpoint.entries import LogEntry
from microbatch.checkpoint.files import (
    fsync_dir,
    fsync_file,
    make_dirs,
    read_json,
    remove,
    write_json_atomic,
)
from microbatch.exceptions import CheckpointCorruptError, CheckpointError

__all__ = ["BatchLog"]

E = TypeVar("E", bound=LogEntry)


class BatchLog(Generic[E]):
    """A directory of checksummed entries of type ``E``, one per batch id.

    The directory is created by the first ``add``: reading a log that was never
    written (``microbatch status`` on a fresh checkpoint) finds it empty.
    """

    def __init__(self, directory: Path, entry_type: type[E]) -> None:
        self.directory = directory
        self.entry_type = entry_type
        self.kind = entry_type.KIND
        self._purged_below = 0
        """Every id below this is known to be gone (this process purged them)."""

    def path(self, batch_id: int) -> Path:
        return self.directory / str(batch_id)

    def add(self, entry: E, *, durable: bool = True) -> None:
        """Record ``entry`` for its batch id; refuse to overwrite an entry.

        Always atomic; ``durable=False`` skips the fsyncs (group commit: the
        entry is made durable later by :meth:`sync`, or by a copy inside a
        durable entry of another log)."""
        path = self.path(entry.batch_id)
        if path.exists():
            raise CheckpointError(
                f"{self.kind} entry for batch {entry.batch_id} already exists at {path}; "
                "two writers on one checkpoint?"
            )
        make_dirs(self.directory)
        write_json_atomic(path, self.kind, entry.to_json(), durable=durable)

    @property
    def synced_path(self) -> Path:
        """``<log>-durable`` beside the log: the newest id made durable by :meth:`sync`."""
        return self.directory.with_name(f"{self.directory.name}-durable")

    def sync(self, batch_id: int) -> None:
        """Make an entry added with ``durable=False`` durable, and record that it is.

        NOTE: the entry's data and name are durable before the marker is written:
        a marker naming N means no entry up to N can be torn or lost by a power
        loss (one that is, is damage)."""
        fsync_file(self.path(batch_id))
        fsync_dir(self.directory)
        self.mark_synced(batch_id)

    def mark_synced(self, batch_id: int) -> None:
        """Record durably that every entry up to ``batch_id`` is durable."""
        write_json_atomic(self.synced_path, f"{self.kind}-durable", {"batch_id": batch_id})

    def synced(self) -> int | None:
        """The newest id made durable by :meth:`sync` (-1: none yet; ``None``: the
        log was never written with ``durable=False``, every entry is durable)."""
        if not self.synced_path.exists():
            return None
        body = read_json(self.synced_path, f"{self.kind}-durable")
        if not isinstance(body, dict) or not isinstance(body.get("batch_id"), int):
            raise CheckpointCorruptError(
                f"{self.synced_path} holds no batch id; the file was edited. Delete it: "
                "the next start re-runs a batch whose commit it cannot verify."
            )
        return int(body["batch_id"])

    def restore(self, entry: E) -> None:
        """Durably write ``entry`` over a missing or torn file (recovery only)."""
        make_dirs(self.directory)
        write_json_atomic(self.path(entry.batch_id), self.kind, entry.to_json())

    def is_torn(self, batch_id: int) -> bool:
        """The entry's file exists but is not whole JSON: what a power loss leaves of
        a file written without fsync (empty, or cut short)."""
        try:
            raw = self.path(batch_id).read_bytes()
        except FileNotFoundError:
            return False
        try:
            json.loads(raw)
        except ValueError:
            return True
        return False

    def get(self, batch_id: int) -> E | None:
        """The entry for ``batch_id`` or ``None`` when there is none."""
        path = self.path(batch_id)
        if not path.exists():
            return None
        body = read_json(path, self.kind)
        if not isinstance(body, dict) or body.get("batch_id") != batch_id:
            raise CheckpointCorruptError(
                f"{path} does not describe batch {batch_id}; the file was renamed or moved"
            )
        return self.entry_type.from_json(body, where=str(path))

    def batch_ids(self) -> list[int]:
        """All batch ids present, ascending (temp files and strays ignored)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(int(name) for name in names if name.isdigit())

    def latest(self) -> E | None:
        """The entry with the highest batch id, or ``None`` for an empty log."""
        ids = self.batch_ids()
        return self.get(ids[-1]) if ids else None

    def check_contiguous(self) -> None:
        """Raise when an id between the oldest and newest entry is missing."""
        ids = self.batch_ids()
        if ids and ids[-1] - ids[0] + 1 != len(ids):
            missing = sorted(set(range(ids[0], ids[-1] + 1)) - set(ids))
            raise CheckpointCorruptError(
                f"{self.directory} is missing entries for batches {missing[:10]}; "
                "files were deleted by hand. Restore them or start on a new checkpoint."
            )

    def purge_before(self, batch_id: int) -> int:
        """Delete entries with ids below ``batch_id``; return how many went.

        Lists the directory only when there can be something to delete, so a
        query purging after every batch pays one unlink, not a listing.
        """
        if batch_id <= self._purged_below:
            return 0
        if self._purged_below:
            ids: list[int] = list(range(self._purged_below, batch_id))
        else:
            ids = [old for old in self.batch_ids() if old < batch_id]
        removed = 0
        for old in ids:
            path = self.path(old)
            if path.exists():
                remove(path)
                removed += 1
        self._purged_below = batch_id
        return removed
