"""The offline reader's view of a store: ``read_only=True`` and ``read_version``."""

from __future__ import annotations

import polars as pl
import pytest

from statestore import StateStoreError, StateStoreProvider
from statestore.durable import TMP_SUFFIX

KEYS = {"k": pl.Int64()}
VALUES = {"n": pl.Int64(), "t": pl.Int64()}


def _write(directory, batches, **kw):
    provider = StateStoreProvider(directory, KEYS, VALUES, time_column="t", **kw)
    for v, rows in enumerate(batches):
        store = provider.load(v)
        store.upsert(pl.DataFrame(rows, schema={**KEYS, **VALUES}))
        if v == 2:
            store.pop_expired(1)
        store.commit()
    return provider


def test_read_version_rebuilds_any_committed_version_and_touches_nothing(tmp_path):
    batches = [{"k": [1, 2], "n": [1, 1], "t": [1, 5]}, {"k": [2], "n": [2], "t": [5]},
               {"k": [3], "n": [7], "t": [9]}]
    _write(tmp_path, batches)
    leftover = tmp_path / "changelog" / f".4.arrow{TMP_SUFFIX}"
    leftover.write_bytes(b"a live write")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    reader = StateStoreProvider(tmp_path, KEYS, VALUES, time_column="t", read_only=True)
    assert reader.committed_versions() == [1, 2, 3]
    assert reader.read_version(2).sort("k").to_dicts() == [
        {"k": 1, "n": 1, "t": 1}, {"k": 2, "n": 2, "t": 5}]
    assert reader.read_version(3).sort("k")["k"].to_list() == [2, 3]  # k=1 popped at t<=1
    assert reader.read_version(0).height == 0
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # version 3 not discarded
    with pytest.raises(StateStoreError, match="read-only"):
        reader.load(3)


def test_committed_versions_after_a_purge_start_at_the_oldest_snapshot(tmp_path):
    rows = [{"k": [i], "n": [i], "t": [i + 10]} for i in range(6)]
    _write(tmp_path, rows, retention_versions=2, max_changelog_chain=2)
    reader = StateStoreProvider(tmp_path, KEYS, VALUES, time_column="t", read_only=True)
    readable = reader.committed_versions()
    assert readable[-1] == 6
    assert readable[0] > 1
    assert readable == list(range(readable[0], 7))
    assert reader.read_version(6)["k"].sort().to_list() == [0, 1, 2, 3, 4, 5]
