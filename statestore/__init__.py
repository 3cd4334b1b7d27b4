"""Versioned, keyed, columnar state for stateful stream operators.

Window aggregates, sessions, dedupe and joins keep their state here: a table
of rows with unique keys, loaded at a committed version, changed by one batch
and committed as the next version (the numbering, and how the engine maps
batches to versions, is stated once in :mod:`statestore.contract`: batch N
loads version N and commits N + 1)::

    provider = StateStoreProvider(path, {"window_start": pl.Datetime("ms", "UTC"),
                                         "card_id": pl.Int64},
                                  {"n": pl.Int64, "amount_sum": pl.Float64},
                                  time_column="window_start")
    store = provider.load(n)                  # batch n starts from version n
    old = store.lookup(batch_keys)            # one row per key, "__found"
    store.upsert(new_rows)
    closed = store.pop_expired(watermark)     # rows whose time <= watermark
    store.commit()                            # -> n + 1

Design: **the cost of a batch follows the batch's size, not the state's.**

- Rows live in memory column by column (numpy arrays; temporal columns as
  their int64/int32 physical values, strings and nested types as object
  arrays), addressed by row slot. Arrays grow by doubling; deleted slots go to
  a free-list. Every operation is one scatter or gather per column over the
  batch's slots (:mod:`statestore.rows`).
- A vectorized open-addressing hash index maps a 64-bit key hash
  (``DataFrame.hash_rows``) to a slot. Linear probing runs in rounds over all
  unresolved keys at once; candidates are confirmed by comparing the real key
  columns, so hash collisions are exact-correct. Load stays <= 1/2; resizes
  and tombstone cleanups rehash everything, amortized O(1) per change
  (:mod:`statestore.hashindex`). Hashes are never persisted.
- With a ``time_column``, a time index of sorted runs finds the rows that
  ``pop_expired(t)`` removes without a scan (:mod:`statestore.timeindex`).
- On disk: a changelog per version (the keys deleted and rows upserted, as a
  checksummed, compressed Arrow IPC file) and snapshots of all rows, written
  when the changelog bytes since the last snapshot reach its size (amortized:
  no commit is O(state) on average). Loading = newest snapshot + changelogs;
  the provider keeps the current version in memory so the steady state never
  reads disk (:mod:`statestore.files`, :mod:`statestore.provider`).

For rows that are only ever combined when their time comes (partial
aggregates of append-mode windows), ``layout="append"`` keeps an
:class:`AppendBuffer` instead: appends without a key lookup, pops by time
(:mod:`statestore.buffer`).

Only ``to_frame``, ``evict``, snapshots and rebuilds are O(state), and say so.
This package imports only polars, pyarrow, numpy and the standard library.
"""

from __future__ import annotations

from statestore.buffer import AppendBuffer
from statestore.exceptions import StateCorruptError, StateStoreError
from statestore.provider import StateStoreProvider
from statestore.store import StateStore

__all__ = [
    "AppendBuffer",
    "StateCorruptError",
    "StateStore",
    "StateStoreError",
    "StateStoreProvider",
]
