"""The checkpoint directory: metadata, write-ahead offsets, commits, progress, lock.

Layout (docs/design.md)::

    chk/
      metadata            query id (stable across restarts), created_at, format
      offsets/N           write-ahead log, one entry per batch (with commits/N-1)
      commits/N           commit log (group commit: durable through offsets/N+1)
      sources/<id>/...    a source's own durable log (e.g. the file ledger)
      state/<op>/...      state store versions
      progress/N          recent progress records (bounded)
      dead_letter/        records that could not be decoded, with the reason
      lock                one running query per checkpoint
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

from microbatch.checkpoint.batch_log import BatchLog
from microbatch.checkpoint.entries import CommitEntry, OffsetEntry
from microbatch.checkpoint.files import (
    fsync_dir,
    make_dirs,
    read_json_object,
    remove,
    write_json_atomic,
)
from microbatch.checkpoint.lock import CheckpointLock, is_locked, read_lock_owner
from microbatch.exceptions import CheckpointCorruptError, CheckpointError

__all__ = [
    "BatchLog",
    "Checkpoint",
    "CheckpointLock",
    "CommitEntry",
    "OffsetEntry",
    "is_locked",
    "read_lock_owner",
]

log = logging.getLogger("microbatch.checkpoint")


class Checkpoint:
    """Handle on one checkpoint directory; creating it is idempotent.

    ``open_for_run`` takes the lock; read-only users (``microbatch status``)
    use the same class without it.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().resolve()
        self.offsets: BatchLog[OffsetEntry] = BatchLog(self.root / "offsets", OffsetEntry)
        """The write-ahead log: ``offsets/N`` fixes batch N before it is read."""
        self.commits: BatchLog[CommitEntry] = BatchLog(self.root / "commits", CommitEntry)
        """The commit log: ``commits/N`` says batch N is done."""
        self._lock = CheckpointLock(self.root / "lock")

    def _exists(self) -> bool:
        return (self.root / "metadata").exists()

    @property
    def metadata_path(self) -> Path:
        return self.root / "metadata"

    def exists(self) -> bool:
        """True when the directory holds a checkpoint (its metadata file)."""
        return self._exists()

    def create_or_open(self) -> dict[str, Any]:
        """Create the layout (first start) and return the metadata."""
        try:
            make_dirs(self.root)
            probe = self.root / f".probe.{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()  # never fsync'ed nor recorded: a probe left by a crash is ignored
        except OSError as exc:
            raise CheckpointError(
                f"cannot write to checkpoint directory {self.root}: {exc.strerror or exc}. "
                "Choose a writable directory with --checkpoint."
            ) from exc
        if not self.metadata_path.exists():
            self.refuse_logs_without_metadata()
            meta = {"query_id": str(uuid.uuid4()),
                    "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            write_json_atomic(self.metadata_path, "metadata", meta)
        return read_json_object(self.metadata_path, "metadata")

    def refuse_logs_without_metadata(self) -> None:
        """A fresh query id over existing logs would break the sinks' idempotency
        (it is their transaction id): a lost metadata file is an error."""
        for log in ("offsets", "commits"):
            directory = self.root / log
            if directory.is_dir() and any(n.isdigit() for n in os.listdir(directory)):
                raise CheckpointCorruptError(
                    f"checkpoint file {self.metadata_path} is missing but {directory} has "
                    "entries: the query id it held is lost, and a new one would make sinks "
                    "write replayed batches again. Restore the file, or start the query on "
                    "a new checkpoint directory."
                )

    def repair_commits(self) -> list[int]:
        """Recovery's half of group commit; return the batch ids whose commit entry
        was restored.

        ``commits/N`` is written without fsync and made durable by a copy inside
        ``offsets/N+1`` (or by its own fsync when the query goes idle or stops),
        so after a power loss a commit file may be missing, empty or cut short::

            for each offsets/K+1 embedding commit K, K above commits/durable
            (the newest id synced on its own, at idle or stop: every entry up
            to it is durable, so a missing one was deleted, an error later):
                commits/K missing or torn -> write it again, durably
            commits/last torn, and commits/durable below last -> remove it: batch
                last was never durably committed and is re-run from offsets/last
            no commits/durable (a new checkpoint, or one written before group
                commit, whose commits were all fsync'ed) -> write it
            (a torn commit that was made durable is damage: reading it fails,
            naming the file)

        NOTE: runs before anything reads ``commits/``.
        """
        ids = self.offsets.batch_ids()
        committed = set(self.commits.batch_ids())
        synced = self.commits.synced()
        if synced is None:  # a new checkpoint, or one written before group commit
            self.commits.mark_synced(max(committed, default=-1))
            return []
        restored = []
        for batch_id in ids[1:]:
            previous = batch_id - 1
            # NOTE: entries up to `synced` were durable: a missing one was deleted
            if previous <= synced or (previous in committed
                                      and not self.commits.is_torn(previous)):
                continue
            entry = self.offsets.get(batch_id)
            if entry is not None and entry.previous_commit is not None:
                self.commits.restore(entry.previous_commit)
                restored.append(previous)
        last = ids[-1] if ids else -1
        if last in committed and synced < last and self.commits.is_torn(last):
            log.warning("%s is torn (written without fsync, cut by a power loss?); batch %d "
                        "is re-run from its write-ahead entry", self.commits.path(last), last)
            remove(self.commits.path(last))
            fsync_dir(self.commits.directory)
        if restored:
            log.warning("restored the commit entries of batches %s from the write-ahead log",
                        restored)
        return restored

    def read_metadata(self) -> dict[str, Any]:
        """The metadata of an existing checkpoint."""
        if not self.metadata_path.exists():
            raise CheckpointError(f"{self.root} is not a microbatch checkpoint (no metadata file)")
        return read_json_object(self.metadata_path, "metadata")

    def lock(self) -> None:
        """Take the exclusive run lock (see :class:`CheckpointLock`)."""
        self._lock.acquire()

    def unlock(self) -> None:
        self._lock.release()

    def is_running(self) -> bool:
        """True when some process holds the run lock now."""
        return is_locked(self.root / "lock")

    def source_dir(self, source_id: str) -> Path:
        path = self.root / "sources" / source_id
        make_dirs(path)
        return path

    def state_dir(self, operator_id: str) -> Path:
        return self.root / "state" / operator_id

    @property
    def progress_dir(self) -> Path:
        return self.root / "progress"

    @property
    def dead_letter_dir(self) -> Path:
        return self.root / "dead_letter"
