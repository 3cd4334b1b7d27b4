"""Progress records: one JSON-serializable dict per batch.

Kept in memory for ``query.recent_progress`` and written (without fsync:
they are informational) to ``chk/progress/N`` for ``microbatch status``;
only the newest ``retain`` records are kept on disk.
"""

from __future__ import annotations

import collections
import json
import logging
import os
from pathlib import Path
from typing import Any

from microbatch.checkpoint.files import read_json, write_json_atomic
from microbatch.exceptions import CheckpointError

log = logging.getLogger("microbatch.progress")


class ProgressStore:
    """A bounded store of progress records, in memory and in the checkpoint."""

    def __init__(self, directory: Path | None, *, retain: int = 100) -> None:
        self.directory = directory
        self.retain = retain
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=retain)
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            self.recent.extend(load_progress(directory, limit=retain))

    def add(self, record: dict[str, Any]) -> None:
        """Keep ``record``; drop the oldest beyond the retention."""
        self.recent.append(record)
        log.info("%s", json.dumps(record, default=str, separators=(",", ":")))
        if self.directory is None:
            return
        batch_id = int(record["batch_id"])
        write_json_atomic(self.directory / str(batch_id), "progress", record, durable=False)
        stale = batch_id - self.retain
        if stale >= 0:
            (self.directory / str(stale)).unlink(missing_ok=True)


def load_progress(directory: Path, *, limit: int = 100) -> list[dict[str, Any]]:
    """The newest ``limit`` progress records under ``directory``, oldest first.

    Unreadable records are skipped: progress is informational and must never
    stop a query or a status command.
    """
    if not directory.exists():
        return []
    ids = sorted(int(n) for n in os.listdir(directory) if n.isdigit())[-limit:]
    records = []
    for batch_id in ids:
        try:
            records.append(read_json(directory / str(batch_id), "progress"))
        except CheckpointError:
            continue
    return records
