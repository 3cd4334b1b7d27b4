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

**The version rule** (stated here once; every other doc points here). Version
``v`` of a store is its rows after ``v`` commits; version 0 is the empty state
and needs no file. ``provider.load(v)`` gives a store holding committed version
``v`` (loading a version drops the files of newer ones: an uncommitted batch's
orphans); ``store.commit()`` writes and returns version ``v + 1``. Loading a
version above the newest committed one raises ``StateCorruptError``.

How the engine numbers them (``microbatch/operators``):

- one store per operator (window aggregates, ``drop_duplicates``,
  ``fire_once``) and the stores of a ``StoreSet`` of sessions and
  ``transform_with_state``: **batch N loads version N and commits version
  N + 1**, so version N is the state after batches ``0 .. N-1``. The commit log
  orders it: version N + 1 of every store is committed before ``commits/N``;
  a restart that re-runs batch N loads version N again (discarding an orphaned
  N + 1). ``provider.load(batch_id)`` in ``window_agg.py``, ``dedupe.py``,
  ``fire_once.py``; ``StoreSet.load_all(batch_id)`` in ``session.py`` and
  ``transform.py``.
- stream-stream joins (``interval_join.py``, ``asof_join.py``) count **per
  input, from the batch in which that input first had columns**: that batch id,
  ``base``, is recorded in the input's ``meta.json``, and batch N loads version
  ``N - base`` and commits ``N - base + 1``
  (``operators/join_state.py`` ``InputState.version``). An input of a source
  without a declared schema may show its columns only in a later batch, when
  the other input's stores are already further on; the numbering is part of
  existing checkpoints and is kept. For ``base = 0`` it is the rule above.

Either way a store's version never exceeds ``N + 1`` for a batch ``N`` that has
``offsets/N``, which is what recovery and the crash explorer check.

An operator of the first rule defined in a later batch B than 0 (over a source
without a declared schema whose batches before B had no columns: every record
a dead letter) starts its store at version B: ``provider.begin_at(B)`` writes
the empty state as version B before the operator records its schema, so batch
B loads version B as every batch does.
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
