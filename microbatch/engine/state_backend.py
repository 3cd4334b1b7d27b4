"""Where a query's keyed state lives: ``writer.start(state_backend=...)``.

``"memory"`` (default) keeps every store's rows in numpy arrays in the
process; ``"lmdb"`` (alias ``"disk"``) keeps the keyed stores' rows in an
embedded LMDB database beside their files (:mod:`statestore.disk`), so a job
may hold more keys than memory. The files that make a version durable (an
Arrow changelog per version, snapshots) are the same on both, so the backend
may change between runs.

The backend is recorded per operator in ``state/<operator>/backend.json``. A
restart with another backend is a **conversion**, not an error: the databases
of the old backend are deleted (they would be stale after batches run without
them) and the new backend rebuilds its stores from the files at the first load.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Literal

from microbatch.checkpoint.files import read_json, write_json_atomic
from microbatch.exceptions import PlanError
from statestore.backends import BACKENDS

__all__ = ["BACKEND_FILE", "StateBackend", "parse_state_backend", "record_backend"]

log = logging.getLogger("microbatch.state")

StateBackend = Literal["memory", "lmdb", "disk"]
BACKEND_FILE = "backend.json"


def parse_state_backend(value: str) -> str:
    """The backend ``value`` names (``"disk"`` -> ``"lmdb"``); PlanError otherwise,
    or when the backend's package is missing."""
    backend = BACKENDS.get(value.lower()) if isinstance(value, str) else None
    if backend is None:
        raise PlanError(
            f"state_backend must be one of {', '.join(map(repr, BACKENDS))}, got {value!r}: "
            "'memory' keeps the state in this process, 'lmdb' (alias 'disk') on disk"
        )
    if backend == "lmdb":
        try:
            import lmdb  # noqa: F401
        except ImportError as exc:
            raise PlanError(
                "state_backend='lmdb' needs the lmdb package: pip install 'microbatch[disk]'"
            ) from exc
    return backend


def record_backend(op_dir: Path, backend: str) -> None:
    """Record ``backend`` for the operator whose state is in ``op_dir``; on a change,
    delete the old backend's databases so that the new one rebuilds from the files."""
    path = op_dir / BACKEND_FILE
    before = "memory"
    if path.exists():
        before = str(read_json(path, "state-backend").get("backend", "memory"))
    elif backend == "memory":
        return  # a checkpoint of the in-memory backend needs no record
    if before == backend and path.exists():
        return
    for db in sorted(op_dir.rglob("lmdb")):
        if db.is_dir():
            shutil.rmtree(db)
    if before != backend:
        log.info("state of %s: backend %s -> %s (rebuilt from its files)", op_dir.name,
                 before, backend)
    write_json_atomic(path, "state-backend", {"backend": backend})
