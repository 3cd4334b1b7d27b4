"""A batch's work follows the batch's size, not the state's (counted, never timed).

The store counts the elements it touches: hash-table slots probed, rows
scattered and gathered, rows copied by growth and rehashing, time-index
entries merged. The same batch against states 100x apart must touch the same
number of rows; the O(state) maintenance (resizes, cleanups, merges) must be
amortized: a constant per inserted row over a store's life.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from statestore import StateStore, StateStoreProvider

KEYS = {"w": pl.Int64, "card": pl.Int64}
VALUES = {"n": pl.Int64}
PER_WINDOW = 1_000
BATCH = 2_000


def state_of(directory: Path, size: int) -> StateStore:
    """A committed store of ``size`` keys, PER_WINDOW per window ``w``."""
    provider = StateStoreProvider(directory, KEYS, VALUES, time_column="w")
    store = provider.load(0)
    ids = np.arange(size)
    store.upsert(pl.DataFrame({"w": ids // PER_WINDOW, "card": ids, "n": ids}))
    store.commit()
    return provider.load(1)  # resets the per-batch counters


def one_batch(store: StateStore, size: int) -> dict[str, float]:
    """Half the batch updates existing keys, half inserts; then deletes and a pop."""
    rng = np.random.default_rng(size)
    old = rng.choice(np.arange(PER_WINDOW, size), BATCH // 2, replace=False)
    new = size + np.arange(BATCH // 2)
    ids = np.concatenate([old, new])
    keys = pl.DataFrame({"w": ids // PER_WINDOW + np.where(ids >= size, 10**6, 0), "card": ids})
    found = store.lookup(keys)
    store.upsert(keys.with_columns(n=found["n"].fill_null(0) + 1))
    store.delete(keys.head(BATCH // 4))
    popped = store.pop_expired(0)  # window 0: PER_WINDOW rows at every size
    assert popped.height == PER_WINDOW
    return store.metrics


@pytest.mark.parametrize("size", [3_000, 30_000, 300_000])
def test_batch_work_is_bounded_by_the_batch_not_the_state(tmp_path: Path, size: int) -> None:
    metrics = one_batch(state_of(tmp_path, size), size)
    keys_handled = BATCH * 2 + BATCH // 4 + PER_WINDOW  # lookup, upsert, delete, pop
    # Linear probing at load <= 1/2: ~1.5 probes per hit, ~2.5 per miss, whatever the size.
    assert metrics["index_probes"] <= 3 * keys_handled
    assert metrics["rows_written"] == BATCH  # values of updated rows + new rows
    assert metrics["rows_read"] == BATCH + PER_WINDOW  # lookup gathers + popped rows


def test_same_batch_touches_the_same_rows_at_any_state_size(tmp_path: Path) -> None:
    work = {
        size: one_batch(state_of(tmp_path / str(size), size), size)
        for size in (3_000, 30_000, 300_000)
    }
    for counter in ("rows_written", "rows_read", "upserted", "deleted"):
        assert len({m[counter] for m in work.values()}) == 1, counter
    probes = [m["index_probes"] for m in work.values()]
    assert max(probes) <= 1.6 * min(probes)  # only the table's load factor differs


def test_state_wide_maintenance_is_amortized_per_inserted_row(tmp_path: Path) -> None:
    provider = StateStoreProvider(tmp_path, KEYS, VALUES, time_column="w")
    rng = np.random.default_rng(3)
    store = provider.load(0)
    inserted = 0
    total = dict.fromkeys(("rehashed_rows", "rows_moved", "time_index_merged"), 0)
    for i in range(60):
        ids = np.arange(i * 1000, (i + 1) * 1000)
        store.upsert(pl.DataFrame({"w": ids % 97, "card": ids, "n": ids}))
        inserted += len(ids)
        gone = rng.integers(0, (i + 1) * 1000, 500)
        store.delete(pl.DataFrame({"w": gone % 97, "card": gone}))
        if i % 10 == 9:
            store.pop_expired(i)
        for counter in total:
            total[counter] += store.metrics[counter]
        store.commit()
        store = provider.load(store.version)
    assert total["rows_moved"] <= 2 * inserted  # doubling
    assert total["rehashed_rows"] <= 4 * inserted  # resizes + tombstone cleanups
    assert total["time_index_merged"] <= 4 * inserted  # size-tiered runs, fanout 4
