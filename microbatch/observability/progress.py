"""Progress records: one JSON-serializable dict per batch, and the last error.

A record is a :class:`~microbatch.observability.progress_schema.ProgressRecord`
(the typed, versioned schema); records read back from ``chk/progress/N`` go
through :func:`~microbatch.observability.progress_schema.read_progress`.

Kept in memory for ``query.recent_progress`` and written (without fsync:
they are informational) to ``chk/progress/N`` for ``microbatch status``;
only the newest ``retain`` records are kept on disk. Each record is also
logged as one JSON line on the ``microbatch.observability.progress`` logger (INFO), with
the dict itself as the log record's ``progress`` attribute for structured
handlers. Counters since the store was created (this run) are in
:attr:`ProgressStore.totals` (Prometheus counters are built from them).

``chk/last_error`` holds the error that stopped the last run of the query
(written by the query thread when a batch fails, removed when a run starts
successfully), so that ``microbatch status`` can show it after the process
is gone.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from microbatch.checkpoint.files import (
    make_dirs,
    read_json,
    read_json_object,
    remove,
    write_json_atomic,
)
from microbatch.exceptions import CheckpointError
from microbatch.observability.progress_schema import (
    ProgressRecord,
    ProgressVersionError,
    read_progress,
)

log = logging.getLogger("microbatch.observability.progress")

LAST_ERROR = "last_error"
"""File name of the last error in the checkpoint directory."""

COUNTED = ("input_rows", "output_rows", "late_rows", "dead_letter_rows")
"""Per-batch figures summed into :attr:`ProgressStore.totals`."""


class ProgressStore:
    """A bounded store of progress records, in memory and in the checkpoint."""

    def __init__(self, directory: Path | None, *, retain: int = 100) -> None:
        self.directory = directory
        self.retain = retain
        self.recent: collections.deque[ProgressRecord] = collections.deque(maxlen=retain)
        self.totals: dict[str, Any] = {"batches": 0, **dict.fromkeys(COUNTED, 0), "sources": {}}
        """Sums over the batches added to this store (not those loaded from disk);
        ``sources`` maps a source id to its input rows."""
        self._lock = threading.Lock()
        if directory is not None:
            make_dirs(directory)
            self.recent.extend(load_progress(directory, limit=retain))

    def add(self, record: ProgressRecord) -> None:
        """Keep ``record``; drop the oldest beyond the retention."""
        with self._lock:
            self.recent.append(record)
            self._count(record)
        if log.isEnabledFor(logging.INFO):
            log.info(
                "%s",
                json.dumps(record, default=str, separators=(",", ":")),
                extra={"progress": record},
            )
        if self.directory is None:
            return
        batch_id = record["batch_id"]
        write_json_atomic(self.directory / str(batch_id), "progress", record, durable=False)
        stale = batch_id - self.retain
        if stale >= 0:
            remove(self.directory / str(stale))

    def _count(self, record: ProgressRecord) -> None:
        totals = self.totals
        totals["batches"] += 1
        totals["input_rows"] += record["input_rows"]
        totals["output_rows"] += record["output_rows"]
        totals["late_rows"] += record["late_rows"]
        totals["dead_letter_rows"] += record["dead_letter_rows"]
        for source in record["sources"]:
            sid = source["id"]
            totals["sources"][sid] = totals["sources"].get(sid, 0) + source["input_rows"]

    def snapshot(self) -> tuple[list[ProgressRecord], dict[str, Any]]:
        """The recent records and a copy of the totals, consistent with each other."""
        with self._lock:
            totals = {**self.totals, "sources": dict(self.totals["sources"])}
            return list(self.recent), totals


def load_progress(directory: Path, *, limit: int = 100) -> list[ProgressRecord]:
    """The newest ``limit`` progress records under ``directory``, oldest first.

    Unreadable records are skipped: progress is informational and must never
    stop a query or a status command. Records of a newer ``progress_version``
    than this engine reads are skipped too, with one warning naming them (their
    fields may mean something else); records from before the version field
    are read as version 0 (see :func:`read_progress`).
    """
    if not directory.exists():
        return []
    ids = sorted(int(n) for n in os.listdir(directory) if n.isdigit())[-limit:]
    records = []
    newer: list[str] = []
    for batch_id in ids:
        path = directory / str(batch_id)
        try:
            records.append(read_progress(read_json(path, "progress"), where=str(path)))
        except ProgressVersionError as exc:
            newer.append(str(exc))
        except CheckpointError:
            continue
    if newer:
        log.warning("skipped %d progress record(s) written by a newer microbatch: %s",
                    len(newer), newer[-1])
    return records


def write_last_error(checkpoint_root: Path, error: dict[str, Any]) -> None:
    """Record the error that stopped the query (``chk/last_error``)."""
    write_json_atomic(checkpoint_root / LAST_ERROR, "last-error", error)


def clear_last_error(checkpoint_root: Path) -> None:
    """Forget the last error (a run started successfully)."""
    remove(checkpoint_root / LAST_ERROR)


def read_last_error(checkpoint_root: Path) -> dict[str, Any] | None:
    """The recorded last error, ``None`` when there is none.

    An unreadable file is reported as such rather than raised: status must
    work on a damaged checkpoint too.
    """
    path = checkpoint_root / LAST_ERROR
    if not path.exists():
        return None
    try:
        return read_json_object(path, "last-error")
    except CheckpointError as exc:
        return {"type": "unreadable", "message": str(exc)}
