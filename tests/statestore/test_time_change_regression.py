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

from statestore import StateStoreProvider


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
