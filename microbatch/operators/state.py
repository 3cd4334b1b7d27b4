"""One container for an operator's state stores: ``StoreSet``.

Sessions keep sessions and a per-key index; each join input keeps rows and an
index; the temporal join keeps events, dimension versions and an index. A
:class:`StoreSet` holds such named stores of one operator: their providers
(one per subdirectory), the stores loaded for the batch, and the lifecycle the
engine drives: every loaded store is committed together, or aborted together.

NOTE: stores commit one after another, not atomically; a crash between two
commits leaves one store a version ahead. The next start loads every store at
the version the commit log says (``provider.load(v)`` discards newer files), so
the set is consistent again before the batch re-runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    from statestore import StateStore, StateStoreProvider

__all__ = ["StoreSet"]

_SUMMED = ("bytes", "commit_ms", "changelog_bytes")


class StoreSet:
    """Named state stores of one operator, loaded, committed and aborted together."""

    def __init__(self) -> None:
        self.backend = "memory"
        """Where stores defined from now on keep their rows (the operator's backend)."""
        self.providers: dict[str, StateStoreProvider] = {}
        self.loaded: dict[str, StateStore] = {}

    def __bool__(self) -> bool:
        """True once a store was defined (its schema known)."""
        return bool(self.providers)

    def define(
        self,
        name: str,
        directory: Path,
        *,
        key_schema: dict[str, pl.DataType],
        value_schema: dict[str, pl.DataType],
        time_column: str | None = None,
        added_values: tuple[str, ...] = (),
    ) -> None:
        """Add store ``name`` kept under ``directory`` (``added_values``: value columns
        that older versions lack; they read as nulls)."""
        from statestore.backends import make_provider

        self.providers[name] = make_provider(
            directory, backend=self.backend, key_schema=key_schema, value_schema=value_schema,
            time_column=time_column,
            added_values=added_values,
        )

    def begin_at(self, version: int) -> None:
        """Every store starts at ``version`` (see ``StateStoreProvider.begin_at``)."""
        for provider in self.providers.values():
            provider.begin_at(version)

    def load(self, name: str, version: int) -> StateStore:
        """Store ``name`` at committed ``version``, for this batch."""
        store = self.providers[name].load(version)
        self.loaded[name] = store
        return store

    def load_all(self, version: int) -> None:
        """Every store at committed ``version``."""
        for name in self.providers:
            self.load(name, version)

    def __getitem__(self, name: str) -> StateStore:
        """Store ``name`` as loaded for this batch."""
        store = self.loaded.get(name)
        if store is None:
            raise AssertionError(f"state store {name!r} is not loaded for this batch")
        return store

    def get(self, name: str) -> StateStore | None:
        return self.loaded.get(name)

    def commit(self) -> None:
        """Commit every loaded store (each becomes its next version)."""
        for store in self.loaded.values():
            store.commit()

    def abort(self) -> None:
        """Discard every loaded store's staged changes."""
        for store in self.loaded.values():
            store.abort()
        self.loaded = {}

    def rows(self, name: str) -> int:
        """Live rows of store ``name`` (0 when not loaded)."""
        store = self.loaded.get(name)
        return store.num_rows if store is not None else 0

    def totals(self) -> dict[str, Any]:
        """Bytes, commit time and changelog bytes summed over the loaded stores."""
        figures = [store.metrics for store in self.loaded.values()]
        out: dict[str, Any] = {k: sum(m.get(k, 0) for m in figures) for k in _SUMMED}
        out["commit_ms"] = round(out["commit_ms"], 3)
        return out
