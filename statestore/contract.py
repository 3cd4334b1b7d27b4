"""The contract between a :class:`~statestore.StateStore` and its provider.

The provider owns the versions on disk; the store owns the rows of one version
in memory. Who calls what:

- the operator calls ``provider.load(v)`` (a store holding committed version
  ``v``), then the store's ``lookup``/``upsert``/``delete``/``pop_expired``, then
  exactly one of ``store.commit()`` (version ``v + 1``, returned) or
  ``store.abort()``;
- ``store.commit()`` calls :meth:`VersionKeeper.write_version`, and on failure or
  ``abort()`` :meth:`VersionKeeper.release`: nothing else of the provider;
- the provider builds a store and calls its ``load_rows``/``apply_changelog``
  (a rebuild), ``begin_batch`` (each load), ``holds_committed`` (may it reuse
  the store?) and ``close`` (replaced): nothing else of the store.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import polars as pl

__all__ = ["VersionKeeper"]


class VersionKeeper(Protocol):
    """What a store needs from whoever keeps its versions (the provider)."""

    @property
    def directory(self) -> Path:
        """Where the versions are kept (for error messages)."""
        ...

    def write_version(
        self,
        owner: object,
        version: int,
        changelog: pl.DataFrame,
        snapshot: Callable[[], pl.DataFrame],
    ) -> tuple[int, bool]:
        """Durably write ``version`` of ``owner`` (the store): its ``changelog``
        and, when the snapshot policy says so, ``snapshot()`` (every row).
        Returns the changelog's bytes and whether a snapshot was written."""
        ...

    def release(self, owner: object) -> None:
        """Forget ``owner`` (aborted, or its commit failed): the next load rebuilds."""
        ...
