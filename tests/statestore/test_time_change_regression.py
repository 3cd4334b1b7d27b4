"""A row whose time moves must expire at its new time, never at an old one.

The time index drops entries that disagree with a row's current time when it
merges runs; it once merged before the new time was written, losing the row's
only valid entry. The end-to-end regression for that is
tests/engine/test_windows.py::test_generated_traffic_at_scale_equals_oracle[session].
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from statestore import StateStoreError, StateStoreProvider


@pytest.mark.parametrize("updates", range(1, 10))
def test_moved_times_expire_after_index_merges(tmp_path: Path, updates: int) -> None:
    provider = StateStoreProvider(tmp_path, {"k": pl.Int64}, {"e": pl.Int64}, time_column="e")
    store = provider.load(0)
    store.upsert(pl.DataFrame({"k": list(range(100)), "e": [100] * 100}))
    # each update moves every time later and adds an index run; some adds merge runs
    for i in range(updates):
        store.upsert(pl.DataFrame({"k": list(range(100)), "e": [200 + i * 100] * 100}))
        assert store.pop_expired(150 + i * 100).height == 0
    popped = store.pop_expired(10_000)
    assert sorted(popped["k"].to_list()) == list(range(100))
    assert store.num_rows == 0


def test_upsert_reusing_the_lookup_equals_a_plain_upsert(tmp_path: Path) -> None:
    schema = ({"k": pl.Int64}, {"n": pl.Int64, "e": pl.Int64})
    plain = StateStoreProvider(tmp_path / "a", *schema, time_column="e").load(0)
    reuse = StateStoreProvider(tmp_path / "b", *schema, time_column="e").load(0)
    for step in range(4):
        keys = pl.DataFrame({"k": [(step * 7 + i) % 13 for i in range(9)]}).unique(
            maintain_order=True
        )
        for store, flag in ((plain, False), (reuse, True)):
            old = store.lookup(keys)
            merged = old.select(
                "k",
                (pl.col("n").fill_null(0) + 1).alias("n"),
                (pl.col("k") + step).alias("e"),
            )
            store.upsert(merged, keys_from_lookup=flag)
        assert plain.to_frame().sort("k").equals(reuse.to_frame().sort("k"))
        assert plain.pop_expired(step + 3).sort("k").equals(reuse.pop_expired(step + 3).sort("k"))
    reuse.lookup(pl.DataFrame({"k": [1, 2]}))
    reuse.delete(pl.DataFrame({"k": [1]}))
    with pytest.raises(StateStoreError, match="no change to the store in between"):
        reuse.upsert(pl.DataFrame({"k": [1, 2], "n": [0, 0], "e": [0, 0]}), keys_from_lookup=True)
