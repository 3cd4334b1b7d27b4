"""Crash semantics on real files: commit points, recovery, corruption, retention."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest
from statestore_model import make_provider

from statestore import StateCorruptError, StateStoreError, StateStoreProvider


def rows(**columns: list) -> pl.DataFrame:
    return pl.DataFrame(columns, schema={"k": pl.Int64, "v": pl.Int64})


def content(provider: StateStoreProvider, version: int) -> dict[int, int]:
    return dict(provider.load(version).to_frame().select("k", "v").iter_rows())


def files(directory: Path) -> dict[str, list[int]]:
    return {
        kind: sorted(int(p.name.split(".")[0]) for p in (directory / kind).glob("*.arrow"))
        for kind in ("changelog", "snapshot")
    }


def commit_versions(provider: StateStoreProvider, count: int) -> None:
    """Commit versions latest+1 .. latest+count; version v sets k=v%5 to v."""
    store = provider.load(provider.latest_version())
    for _ in range(count):
        v = store.version + 1
        store.upsert(rows(k=[v % 5], v=[v]))
        store.commit()


def test_only_committed_versions_survive_a_restart(tmp_path: Path) -> None:
    provider = make_provider(tmp_path)
    store = provider.load(0)
    store.upsert(rows(k=[1, 2], v=[1, 2]))
    assert store.commit() == 1
    store.upsert(rows(k=[3], v=[3]))
    store.delete(rows(k=[1], v=[0]).select("k"))  # staged, never committed: a crash here
    restarted = make_provider(tmp_path)
    assert restarted.latest_version() == 1
    assert content(restarted, 1) == {1: 1, 2: 2}


def test_steady_state_load_reuses_the_in_memory_version(tmp_path: Path) -> None:
    provider = make_provider(tmp_path)
    store = provider.load(0)
    store.upsert(rows(k=[1], v=[1]))
    store.commit()
    assert provider.load(1) is store  # no rebuild: the same object, already version 1
    assert store.metrics["rows_read"] == 0


def test_abort_discards_staged_changes_and_reloads_from_disk(tmp_path: Path) -> None:
    provider = make_provider(tmp_path)
    store = provider.load(0)
    store.upsert(rows(k=[1], v=[1]))
    store.commit()
    store.upsert(rows(k=[1, 2], v=[9, 9]))
    store.abort()
    with pytest.raises(StateStoreError, match="aborted"):
        store.lookup(rows(k=[1], v=[0]))
    store.abort()  # idempotent
    again = provider.load(1)
    assert again is not store
    assert content(provider, 1) == {1: 1}


def test_recommitting_a_version_replaces_it(tmp_path: Path) -> None:
    provider = make_provider(tmp_path)
    store = provider.load(0)
    store.upsert(rows(k=[1], v=[1]))
    store.commit()
    store.upsert(rows(k=[2], v=[2]))
    store.commit()
    # The engine crashed before its commit log said batch 2 was done: re-run batch 2.
    rerun = make_provider(tmp_path).load(1)
    rerun.upsert(rows(k=[3], v=[3]))
    assert rerun.commit() == 2
    assert content(make_provider(tmp_path), 2) == {1: 1, 3: 3}


def test_loading_an_older_version_discards_newer_files(tmp_path: Path) -> None:
    provider = make_provider(tmp_path, max_changelog_chain=2)
    commit_versions(provider, 6)
    assert files(tmp_path) == {"changelog": [1, 2, 3, 4, 5, 6], "snapshot": [2, 4, 6]}
    store = provider.load(3)  # the in-memory copy is version 6: rebuild from disk
    assert store.to_frame().sort("k").rows() == [(1, 1), (2, 2), (3, 3)]
    assert files(tmp_path) == {"changelog": [1, 2, 3], "snapshot": [2]}
    assert provider.latest_version() == 3
    with pytest.raises(StateCorruptError, match="does not exist"):
        make_provider(tmp_path).load(4)


def test_loading_a_version_never_committed_names_the_directory(tmp_path: Path) -> None:
    provider = make_provider(tmp_path)
    with pytest.raises(StateCorruptError) as info:
        provider.load(5)
    message = str(info.value)
    assert str(tmp_path) in message
    assert "newest committed version is 0" in message


def test_missing_changelog_in_the_chain_is_a_clear_error(tmp_path: Path) -> None:
    commit_versions(make_provider(tmp_path), 3)
    missing = tmp_path / "changelog" / "2.arrow"
    missing.unlink()
    with pytest.raises(StateCorruptError) as info:
        make_provider(tmp_path).load(3)
    message = str(info.value)
    assert str(missing) in message
    assert "restore the file" in message
    assert content(make_provider(tmp_path), 1) == {1: 1}  # the older version still loads


def _flip(path: Path, where: float) -> None:
    data = bytearray(path.read_bytes())
    i = min(int(len(data) * where), len(data) - 1)
    data[i] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("kind", ["changelog", "snapshot"])
@pytest.mark.parametrize(
    "damage",
    ["flip_start", "flip_middle", "flip_end", "truncate", "empty", "garbage"],
)
def test_damaged_files_are_refused_naming_the_file(tmp_path: Path, kind: str, damage: str) -> None:
    provider = make_provider(tmp_path, min_snapshot_bytes=0)  # snapshot on every commit
    store = provider.load(0)
    store.upsert(rows(k=list(range(200)), v=list(range(200))))
    store.commit()
    path = tmp_path / kind / "1.arrow"
    if damage.startswith("flip"):
        _flip(path, {"flip_start": 0.0, "flip_middle": 0.5, "flip_end": 0.999}[damage])
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:-100])
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        path.write_bytes(b"not an arrow file at all" * 10)
    if kind == "changelog":
        (tmp_path / "snapshot" / "1.arrow").unlink()  # make the changelog the way to version 1
    with pytest.raises(StateCorruptError, match=str(path)):
        make_provider(tmp_path).load(1)


def test_a_renamed_file_is_detected(tmp_path: Path) -> None:
    commit_versions(make_provider(tmp_path), 2)
    changelog = tmp_path / "changelog"
    shutil.copy(changelog / "1.arrow", changelog / "2.arrow")
    with pytest.raises(StateCorruptError, match="renamed or copied"):
        make_provider(tmp_path).load(2)


def test_a_changed_schema_is_refused(tmp_path: Path) -> None:
    commit_versions(make_provider(tmp_path), 1)
    other = make_provider(tmp_path, values={"v": pl.Int64, "w": pl.String})
    with pytest.raises(StateStoreError, match="state schema changed"):
        other.load(1)


def test_retention_keeps_exactly_the_files_needed(tmp_path: Path) -> None:
    provider = make_provider(
        tmp_path, retention_versions=3, max_changelog_chain=4, min_snapshot_bytes=1 << 30
    )
    commit_versions(provider, 21)
    # Snapshots every 4th version; versions 19..21 must load: snapshot 16 + changelogs 17..21.
    assert files(tmp_path) == {"changelog": [17, 18, 19, 20, 21], "snapshot": [16, 20]}
    for version in (19, 20, 21):
        copy = tmp_path.parent / f"copy-{version}"
        shutil.copytree(tmp_path, copy)  # loading an older version discards newer ones
        expected = {v % 5: v for v in range(1, version + 1)}
        assert content(make_provider(copy), version) == expected
    with pytest.raises(
        StateCorruptError, match=r"changelog/1\.arrow is missing.*oldest snapshot is version 16"
    ):
        make_provider(tmp_path).load(15)


def test_leftover_temp_files_of_a_crashed_write_are_ignored(tmp_path: Path) -> None:
    commit_versions(make_provider(tmp_path), 1)
    leftover = tmp_path / "changelog" / ".2.arrow.1234.tmp"
    leftover.write_bytes(b"half a file")
    provider = make_provider(tmp_path)
    assert provider.latest_version() == 1
    assert not leftover.exists()
    assert content(provider, 1) == {1: 1}


_WRITER = textwrap.dedent(
    """
    import sys
    import polars as pl
    from statestore import StateStoreProvider

    provider = StateStoreProvider(sys.argv[1], {"k": pl.Int64}, {"v": pl.Int64},
                                  max_changelog_chain=3, retention_versions=5)
    store = provider.load(provider.latest_version())
    while True:
        v = store.version + 1
        ks = list(range(v % 7, 400, 7))
        store.upsert(pl.DataFrame({"k": ks, "v": [v] * len(ks)}))
        store.delete(pl.DataFrame({"k": [(v * 3) % 400]}))
        store.commit()
        print(v, flush=True)
    """
)


def _expected_after(version: int) -> dict[int, int]:
    state: dict[int, int] = {}
    for v in range(1, version + 1):
        state.update(dict.fromkeys(range(v % 7, 400, 7), v))
        state.pop((v * 3) % 400, None)
    return state


@pytest.mark.crash
def test_kill_during_commits_leaves_the_last_committed_version(tmp_path: Path) -> None:
    """SIGKILL a writer mid-stream (twice); every restart sees an exact committed version."""
    for _ in range(2):
        with subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(tmp_path)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        ) as proc:
            assert proc.stdout is not None
            printed = [int(proc.stdout.readline()) for _ in range(15)]
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        provider = make_provider(tmp_path)
        latest = provider.latest_version()
        assert latest >= printed[-1]
        assert content(provider, latest) == _expected_after(latest)
