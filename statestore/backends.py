"""Choosing where a keyed store's rows live: ``"memory"`` or ``"lmdb"`` (alias ``"disk"``).

Both backends keep the same files (an Arrow changelog per version, snapshots),
so the choice can change between runs of a query: the other backend rebuilds
from the files. :func:`make_provider` is the one place that maps a name to a
provider class.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import polars as pl

from statestore.exceptions import StateStoreError
from statestore.provider import StateStoreProvider

__all__ = ["BACKENDS", "Backend", "canonical_backend", "make_provider"]

Backend = Literal["memory", "lmdb", "disk"]
BACKENDS: dict[str, str] = {"memory": "memory", "lmdb": "lmdb", "disk": "lmdb"}
"""Accepted names -> the backend they select (``"disk"`` is the generic alias)."""


def canonical_backend(name: str) -> str:
    """The backend ``name`` selects (``"disk"`` -> ``"lmdb"``); StateStoreError otherwise."""
    backend = BACKENDS.get(str(name).lower()) if isinstance(name, str) else None
    if backend is None:
        raise StateStoreError(
            f"unknown state backend {name!r}: use 'memory' (the default: rows in this "
            "process's memory), 'lmdb' or its alias 'disk' (rows in an on-disk LMDB "
            "database: state larger than memory)"
        )
    return backend


def make_provider(
    directory: str | Path,
    key_schema: dict[str, pl.DataType],
    value_schema: dict[str, pl.DataType],
    *,
    backend: str = "memory",
    **options: Any,
) -> StateStoreProvider:
    """The provider of a store under ``directory`` on ``backend``.

    An append buffer (``layout="append"``) stays in memory on every backend: its
    rows are partials of open windows, popped when the watermark closes them.
    """
    if canonical_backend(backend) == "lmdb" and options.get("layout", "keyed") == "keyed" \
            and not options.get("read_only"):
        from statestore.disk_provider import DiskStateStoreProvider

        return DiskStateStoreProvider(directory, key_schema, value_schema, **options)
    return StateStoreProvider(directory, key_schema, value_schema, **options)
