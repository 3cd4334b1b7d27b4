"""The on-disk (LMDB) backend against the same model as the in-memory store, and
its recovery paths: a crash between the changelog file and the database commit,
a database ahead of the commit log, a lost or foreign database, snapshots
streamed in chunks.

The model machines are the in-memory store's (``test_statestore_model.py``),
unchanged: random upserts, deletes, pop_expired (content and order), evict,
commits, aborts, reopenings by a new provider (a new process) and rewinds to
older versions; after every step the whole content and lookups equal the dict
model that the in-memory store is held to, so both backends answer alike.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, ClassVar

import polars as pl
import pytest
from hypothesis import settings
from test_statestore_model import SessionMachine, WindowMachine, _settings

from statestore import StateCorruptError, StateStoreProvider
from statestore.backends import canonical_backend, make_provider
from statestore.disk_provider import DiskStateStoreProvider
from statestore.exceptions import StateStoreError

KEYS = {"k": pl.Int64, "s": pl.String}
VALUES = {"n": pl.Int64, "t": pl.Int64}


class DiskMixin:
    """Runs the machine's store on the disk backend."""

    directory: Path
    provider: Any
    KEYS: ClassVar[dict[str, pl.DataType]]
    VALUES: ClassVar[dict[str, pl.DataType]]
    TIME: ClassVar[str]

    def _provider(self) -> StateStoreProvider:
        old = getattr(self, "provider", None)
        if isinstance(old, DiskStateStoreProvider):
            old.close()  # a new process: the old one is gone
        return make_provider(
            self.directory, self.KEYS, self.VALUES, backend="disk", time_column=self.TIME,
            retention_versions=4, max_changelog_chain=3, min_snapshot_bytes=4000,
        )

    def teardown(self) -> None:
        self.provider.close()
        shutil.rmtree(self.directory, ignore_errors=True)


class DiskWindowMachine(DiskMixin, WindowMachine):  # type: ignore[misc]
    """String + Datetime keys, nullable values, on LMDB."""


class DiskSessionMachine(DiskMixin, SessionMachine):  # type: ignore[misc]
    """Integer keys, a moving nullable time value, on LMDB."""


TestDiskWindowModel = DiskWindowMachine.TestCase
TestDiskSessionModel = DiskSessionMachine.TestCase
_disk_settings = settings(_settings, max_examples=20)
TestDiskWindowModel.settings = _disk_settings
TestDiskSessionModel.settings = _disk_settings


# ---------------------------------------------------------------- recovery


def _rows(n: int, start: int = 0, t: int = 0) -> pl.DataFrame:
    return pl.DataFrame({
        "k": range(start, start + n), "s": [f"u{i % 7}" for i in range(start, start + n)],
        "n": range(n), "t": [t + i % 5 for i in range(n)],
    }, schema={**KEYS, **VALUES})


def _disk(path: Path, **options: Any) -> DiskStateStoreProvider:
    provider = make_provider(path, KEYS, VALUES, backend="disk", time_column="t", **options)
    assert isinstance(provider, DiskStateStoreProvider)
    return provider


def _memory(path: Path) -> StateStoreProvider:
    return StateStoreProvider(path, KEYS, VALUES, time_column="t")


def _frame(store: Any) -> pl.DataFrame:
    return store.to_frame().sort("k")


def test_database_ahead_of_the_commit_log_steps_back_without_a_rebuild(tmp_path: Path) -> None:
    """Batch N committed state N+1 (and a pipelined N+1 state N+2), then the process
    died before commits/N: the restart loads N from the database's before-images."""
    provider = _disk(tmp_path)
    expected = {}
    for v in range(4):
        store = provider.load(v)
        expected[v] = _frame(store)
        store.upsert(_rows(50, start=v * 20, t=v))
        store.delete(pl.DataFrame({"k": [v * 3], "s": [f"u{(v * 3) % 7}"]}))
        store.pop_expired(v)
        store.commit()
    provider.close()
    again = _disk(tmp_path)
    assert _frame(again.load(2)).equals(expected[2])
    assert again.rebuilds == 0
    assert again.latest_version() == 2  # files of 3 and 4 discarded, after the database moved
    again.close()


def test_crash_between_changelog_and_database_rolls_forward(tmp_path: Path) -> None:
    provider = _disk(tmp_path)
    store = provider.load(0)
    store.upsert(_rows(30))
    store.commit()
    store = provider.load(1)
    store.upsert(_rows(10, start=100))
    # the changelog file of version 2 is durable, the LMDB transaction is not
    changelog = store._changelog()
    from statestore.files import write_arrow

    write_arrow(provider._files.path("changelog", 2), changelog, kind="changelog", version=2,
                compression="lz4")
    store.abort()
    provider.close()
    again = _disk(tmp_path)
    got = _frame(again.load(2))
    assert got.height == 40
    assert again.rebuilds == 0
    assert got.equals(_memory(tmp_path).read_version(2).sort("k"))
    again.close()


def test_lost_or_foreign_database_is_rebuilt_from_the_files(tmp_path: Path) -> None:
    provider = _disk(tmp_path, min_snapshot_bytes=1)  # a snapshot at every commit
    for v in range(3):
        store = provider.load(v)
        store.upsert(_rows(40, start=v * 25))
        store.commit()
    want = _frame(provider.load(3))
    provider.close()
    shutil.rmtree(tmp_path / "lmdb")
    again = _disk(tmp_path)
    assert _frame(again.load(3)).equals(want)
    assert again.rebuilds == 1
    again.close()
    # the in-memory backend writes version 4: the database (at 3) must not be reused for 4
    memory = _memory(tmp_path)
    store = memory.load(3)
    store.upsert(_rows(5, start=1000))
    store.commit()
    want4 = _frame(memory.load(4))
    back = _disk(tmp_path)
    assert _frame(back.load(4)).equals(want4)
    back.close()


def test_snapshot_streamed_in_chunks_reads_back(tmp_path: Path, monkeypatch: Any) -> None:
    from statestore import disk

    monkeypatch.setattr(disk, "CHUNK", 7)  # many chunks from a small state
    provider = _disk(tmp_path, min_snapshot_bytes=1)
    store = provider.load(0)
    store.upsert(_rows(100))
    store.commit()
    assert provider._files.versions("snapshot") == [1]
    snapshot = _memory(tmp_path).read_version(1).sort("k")
    assert snapshot.equals(_frame(provider.load(1)))
    provider.close()
    path = tmp_path / "snapshot" / "1.arrow"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    shutil.rmtree(tmp_path / "lmdb")
    (tmp_path / "changelog" / "1.arrow").unlink()
    with pytest.raises(StateCorruptError, match=r"checksum|readable|decoded"):
        _disk(tmp_path).load(1)


def test_aborted_batch_leaves_the_database_at_its_version(tmp_path: Path) -> None:
    provider = _disk(tmp_path)
    store = provider.load(0)
    store.upsert(_rows(10))
    store.commit()
    store = provider.load(1)
    store.upsert(_rows(10, start=50))
    assert store.num_rows == 20  # read-your-writes
    store.abort()
    assert provider.load(1).num_rows == 10
    provider.close()


def test_backend_names_and_unsupported_columns(tmp_path: Path) -> None:
    assert canonical_backend("disk") == "lmdb"
    assert canonical_backend("memory") == "memory"
    with pytest.raises(StateStoreError, match="unknown state backend 'rocks'"):
        canonical_backend("rocks")
    provider = make_provider(tmp_path, {"k": pl.Int64}, {"l": pl.List(pl.Int64)}, backend="disk")
    with pytest.raises(StateStoreError, match="cannot hold value column"):
        provider.load(0)
    with pytest.raises(StateStoreError, match="longer than 500 bytes"):
        _disk(tmp_path / "long").load(0).upsert(
            pl.DataFrame({"k": [1], "s": ["x" * 600], "n": [1], "t": [1]})
        )
