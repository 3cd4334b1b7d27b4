"""Damaged checkpoints and incompatible job changes: a clear error that names
the file or says what changed, never a silent wrong result.

Extends ``tests/engine/test_checkpoint.py`` (offsets truncated, foreign or of
a newer format, a missing offsets entry, metadata garbage, a changed source)
to commits, state store files, the file source's ledger, the sink's
manifest and the operators of the job, on a windowed query with state.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import microbatch as mb
from statestore import StateStoreProvider

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FILES = 6


@pytest.fixture(autouse=True)
def small_snapshots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Snapshot every 4 state versions, so that checkpoints have snapshots too."""
    original = StateStoreProvider.__init__

    def init(self: StateStoreProvider, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("max_changelog_chain", 4)
        original(self, *args, **kwargs)

    monkeypatch.setattr(StateStoreProvider, "__init__", init)


def land(directory: Path, first: int, count: int) -> None:
    """Files ``first..first+count-1``: 40 payments each, 20 s of event time apart."""
    directory.mkdir(exist_ok=True)
    for i in range(first, first + count):
        frame = pl.DataFrame({
            "event_id": list(range(i * 40, i * 40 + 40)),
            "card_id": [j % 4 for j in range(40)],
            "amount": [float(j % 7) for j in range(40)],
            "event_time": [T0 + timedelta(seconds=i * 20 + j / 2) for j in range(40)],
        }).with_columns(pl.col("event_time").dt.cast_time_unit("ms"))
        path = directory / f"{i:04d}.parquet"
        frame.write_parquet(path)
        os.utime(path, ns=(10**18 + i * 10**6, 10**18 + i * 10**6))


def job(work: Path, change: str = "") -> mb.DataStreamWriter:
    """The windowed job, or a changed version of it."""
    stream = mb.read_files(work / "in", format="parquet", max_files_per_batch=1)
    marked = stream.with_watermark("event_time", "5s")
    if change == "dedupe added":
        marked = marked.drop_duplicates("event_id", within="1m")
    window: Any = mb.window("event_time", "2m" if change == "window" else "1m")
    if change == "session":
        window = mb.session_window("event_time", gap="30s")
    keys = ["card_id", "event_id"] if change == "keys" else ["card_id"]
    aggs = [pl.len().alias("n"),
            pl.col("amount").mean() if change == "aggregation" else pl.col("amount").sum()]
    if change == "aggregation removed":
        return marked.write_parquet(work / "out-plain")
    return marked.group_by(window, *keys).agg(*aggs).write_parquet(work / "out")


def run(work: Path, change: str = "") -> None:
    """Start the job with ``available-now`` and wait; raise what start or the query raises."""
    job(work, change).start(work / "chk", trigger="available-now").await_termination(60)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A checkpoint after FILES batches; then two more files land."""
    land(tmp_path / "in", 0, FILES)
    run(tmp_path)
    land(tmp_path / "in", FILES, 2)
    return tmp_path


def failure(work: Path, change: str = "") -> BaseException:
    """The error of a restart (at start, or the cause of the failed batch)."""
    with pytest.raises(Exception) as info:  # noqa: PT011 (engine, statestore and sink errors)
        run(work, change)
    error = info.value
    if isinstance(error, mb.QueryTerminatedError) and error.__cause__ is not None:
        return error.__cause__
    return error


def reference(tmp_path: Path) -> pl.DataFrame:
    """The job's output from one clean run over every file."""
    clean = tmp_path / "reference"
    shutil.copytree(tmp_path / "in", clean / "in")
    run(clean)
    return mb.parquet_table(clean / "out").sort("window_start", "card_id")


# ------------------------------------------------------------------ damage


def newest(directory: Path, suffix: str = "") -> Path:
    """The file of the highest version/batch id in ``directory``."""
    found = [p for p in directory.iterdir() if p.name.removesuffix(suffix).isdigit()]
    return max(found, key=lambda p: int(p.name.removesuffix(suffix)))


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def swap(a: Path, b: Path) -> None:
    tmp = a.with_name("swap.tmp")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)


def edit_body(path: Path) -> None:
    doc = json.loads(path.read_text())
    doc["body"]["timestamp_ms"] = 0
    path.write_text(json.dumps(doc))


def state(work: Path) -> Path:
    return work / "chk" / "state" / "agg-0"


def needed_changelog(work: Path) -> Path:
    """A changelog that loading the newest state version reads."""
    snapshots = [int(p.stem) for p in (state(work) / "snapshot").glob("*.arrow")]
    logs = sorted(int(p.stem) for p in (state(work) / "changelog").glob("*.arrow"))
    after = [v for v in logs if v > max(snapshots, default=0)]
    return state(work) / "changelog" / f"{after[0]}.arrow"


def _do(action: Callable[[Path], Any], path: Path) -> Path:
    action(path)
    return path


def _swap_newest(directory: Path) -> Path:
    last = newest(directory)
    swap(last, directory / str(int(last.name) - 1))
    return last


def _swap_changelogs(work: Path) -> Path:
    logs = sorted((state(work) / "changelog").glob("*.arrow"), key=lambda p: int(p.stem))
    swap(logs[-1], logs[-2])
    return logs[-1]


def _rmtree(path: Path) -> Path:
    shutil.rmtree(path)
    return path


Damage = Callable[[Path], Path]
"""Damages the checkpoint under ``work``; returns the file the error must name."""

DAMAGES: dict[str, tuple[Damage, str]] = {
    "offsets: edited": (lambda w: _do(edit_body, newest(w / "chk" / "offsets")), "checksum"),
    "offsets: renamed": (
        lambda w: _swap_newest(w / "chk" / "offsets"), "does not describe batch"),
    "offsets: empty file": (
        lambda w: _do(lambda p: p.write_bytes(b""), newest(w / "chk" / "offsets")),
        "not valid JSON"),
    "commits: truncated": (lambda w: _do(truncate, newest(w / "chk" / "commits")),
                           "not valid JSON"),
    "commits: renamed": (lambda w: _swap_newest(w / "chk" / "commits"), "does not describe batch"),
    "commits: middle one missing": (
        lambda w: _do(Path.unlink, w / "chk" / "commits" / "2"), "missing entries for batches [2]"),
    "state: changelog damaged": (lambda w: _do(flip_byte, needed_changelog(w)), "state file"),
    "state: changelog truncated": (lambda w: _do(truncate, needed_changelog(w)), "truncated"),
    "state: changelog missing": (lambda w: _do(Path.unlink, needed_changelog(w)), "missing"),
    "state: changelogs renamed": (_swap_changelogs, "renamed or copied"),
    "state: snapshot damaged": (
        lambda w: _do(flip_byte, newest(state(w) / "snapshot", ".arrow")), "checksum"),
    "state: operator record damaged": (
        lambda w: _do(truncate, state(w) / "operator.json"), "not valid JSON"),
    "state: directory deleted": (
        lambda w: _rmtree(state(w)), "no state for stateful operator(s) {'agg-0'"),
    "file ledger: entry damaged": (
        lambda w: _do(flip_byte, newest(w / "chk" / "sources" / "0" / "ledger")),
        "checkpoint file"),
    "file ledger: deleted": (
        lambda w: _rmtree(w / "chk" / "sources" / "0" / "ledger"), "ledger"),
    "metadata: missing": (
        lambda w: _do(Path.unlink, w / "chk" / "metadata"), "the query id it held is lost"),
    "sink manifest: damaged": (
        lambda w: _do(flip_byte, newest(w / "out" / "_manifest", ".json")), "manifest entry"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_checkpoint_stops_the_query_naming_the_file(work: Path, damage: str) -> None:
    act, fragment = DAMAGES[damage]
    path = act(work)

    error = failure(work)

    assert fragment in str(error), error
    assert str(path) in str(error) or str(path.parent) in str(error), error
    assert isinstance(error, mb.MicrobatchError | OSError) or type(error).__name__ in {
        "StateCorruptError", "StateStoreError", "SinkError"}, type(error)


def test_a_missing_last_commit_reruns_that_batch_exactly_once(work: Path) -> None:
    # a crash between the state commit and commits/N looks like this: not an error
    newest(work / "chk" / "commits").unlink()

    run(work)

    got = mb.parquet_table(work / "out").sort("window_start", "card_id")
    assert got.equals(reference(work))


def test_a_stale_temp_file_left_by_a_crash_is_ignored(work: Path) -> None:
    for log in ("offsets", "commits"):
        (work / "chk" / log / f".{FILES + 5}.123.tmp").write_bytes(b'{"trunc')
    (state(work) / "changelog" / f".{FILES + 5}.arrow.123.tmp").write_bytes(b"ARROW1")

    run(work)

    got = mb.parquet_table(work / "out").sort("window_start", "card_id")
    assert got.equals(reference(work))


# ------------------------------------------------------------------ job changes


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ("window", "['window'] changed"),
        ("session", "['kind', 'window'] changed"),
        ("keys", "['keys'] changed"),
        ("aggregation", "['state'] changed"),
        ("dedupe added", "the job gained a stateful operator"),
        ("aggregation removed", "the job lost or reordered a stateful operator"),
    ],
)
def test_an_incompatible_job_change_is_refused_saying_what_changed(
    work: Path, change: str, says: str
) -> None:
    error = failure(work, change)

    assert isinstance(error, mb.IncompatibleCheckpointError), error
    assert says in str(error)
    assert "new checkpoint" in str(error)


def test_a_compatible_change_resumes(work: Path) -> None:
    # a stateless step after the aggregation is not part of the state: allowed
    writer = job(work)
    changed = mb.read_files(work / "in", format="parquet", max_files_per_batch=1)
    assert writer is not None
    query = (
        changed.with_watermark("event_time", "5s")
        .group_by(mb.window("event_time", "1m"), "card_id")
        .agg(pl.len().alias("n"), pl.col("amount").sum())
        .filter(pl.col("n") >= 0)
        .write_parquet(work / "out")
        .start(work / "chk", trigger="available-now")
    )
    query.await_termination(60)
    got = mb.parquet_table(work / "out").sort("window_start", "card_id")
    assert got.equals(reference(work))
