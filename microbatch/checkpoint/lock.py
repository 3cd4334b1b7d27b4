"""One running query per checkpoint, enforced with an OS file lock.

The lock is ``fcntl.flock`` on ``chk/lock``. The kernel drops it when the
holder exits for any reason (SIGKILL included), so a killed process never
leaves a lock that blocks the next start. The file also records the holder's
pid, host and start time for ``microbatch status``.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from microbatch.exceptions import CheckpointLockedError

LOCK_RETRIES = 5
LOCK_RETRY_S = 0.02


def read_lock_owner(path: Path) -> dict[str, Any] | None:
    """What the lock file says about its last holder (may be stale)."""
    try:
        owner = json.loads(path.read_text() or "null")
    except (OSError, json.JSONDecodeError):
        return None
    return owner if isinstance(owner, dict) else None


def is_locked(path: Path) -> bool:
    """True when a live process holds the lock at ``path`` right now."""
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


class CheckpointLock:
    """An exclusive, process-crash-safe lock on a checkpoint directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`CheckpointLockedError` naming the holder."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        # NOTE: `is_locked` (microbatch status) probes by taking the lock for a
        # moment; retry briefly so that a probe is never mistaken for a holder.
        for attempt in range(LOCK_RETRIES + 1):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt < LOCK_RETRIES:
                    time.sleep(LOCK_RETRY_S)
        else:
            os.close(fd)
            owner = read_lock_owner(self.path) or {}
            raise CheckpointLockedError(
                f"checkpoint {self.path.parent} is in use by another running query "
                f"(pid {owner.get('pid', '?')} on {owner.get('host', '?')}, since "
                f"{owner.get('started_at', '?')}). Stop that query first, or use another "
                "checkpoint directory."
            ) from None
        owner = {"pid": os.getpid(), "host": socket.gethostname(),
                 "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(owner).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
