"""A full disk (ENOSPC) while writing the sink, the checkpoint or the state.

The query must stop with a clear error (no traceback, the cause named), leave
no half-visible output, and after space is freed resume on the same
checkpoint to exactly the one-shot result. With root, a real 2 MB tmpfs runs
full; without it (or anywhere) the state store and the sink are made to
raise ``OSError(ENOSPC)`` by test-only hooks.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from harness import JobSpec, Kill, Soak

import microbatch as mb
from sinks.parquet import ParquetSink

NO_SPACE = os.strerror(errno.ENOSPC)


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs (needs root); skipped where it cannot be mounted."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(mount: Path, leave: int) -> Path:
    """Fill ``mount`` with a ballast file until ``leave`` bytes are free."""
    free = shutil.disk_usage(mount).free
    ballast = mount / "ballast"
    with ballast.open("wb") as fh:
        fh.write(b"\0" * max(0, free - leave))
    return ballast


def assert_clear_failure(outcome_stderr: str, returncode: int) -> None:
    """Exit 1 (failed batch) or 2 (cannot start), the cause named, no traceback."""
    assert returncode in (1, 2), outcome_stderr
    assert NO_SPACE in outcome_stderr, outcome_stderr
    assert "Traceback" not in outcome_stderr


@pytest.mark.crash
@pytest.mark.slow
def test_sink_on_a_full_disk_stops_and_resumes_exactly(tmp_path: Path, tiny_fs: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (tiny_fs / "out").mkdir()
    (work / "out").symlink_to(tiny_fs / "out")
    run = Soak(JobSpec(source="files", files=24, cap=1), work)
    run.prepare()
    ballast = fill(tiny_fs, leave=48 * 1024)

    failed = run.run(Kill("clean"))

    assert_clear_failure(failed.stderr, failed.returncode)
    assert "cannot write" in failed.stderr
    assert run.next_batch()[1], "the failed batch must wait in the write-ahead log"
    assert mb.parquet_table(work / "out").height > 0  # committed batches stay readable
    ballast.unlink()
    run.finish()
    assert run.verdict is not None
    assert run.verdict.exact, run.verdict


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.parametrize("leave_kb", [8, 96, 192])
def test_checkpoint_on_a_full_disk_stops_and_resumes_exactly(
    tmp_path: Path, tiny_fs: Path, leave_kb: int
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (tiny_fs / "chk").mkdir()
    (work / "chk").symlink_to(tiny_fs / "chk")
    run = Soak(JobSpec(source="files", files=24, cap=1), work)
    run.prepare()
    ballast = fill(tiny_fs, leave=leave_kb * 1024)

    failed = run.run(Kill("clean"))

    assert_clear_failure(failed.stderr, failed.returncode)
    assert f"{NO_SPACE}: '{tiny_fs.resolve()}" in failed.stderr or (
        "state version" in failed.stderr or "manifest entry" in failed.stderr
    ), failed.stderr  # the file that could not be written is named
    ballast.unlink()
    run.finish()
    assert run.verdict is not None
    assert run.verdict.exact, run.verdict


@pytest.mark.crash
@pytest.mark.slow
def test_state_commit_without_space_stops_and_resumes_exactly(tmp_path: Path) -> None:
    run = Soak(JobSpec(rows=120_000, cap=4_000, window="10s"), tmp_path)
    run.prepare()

    failed = run.run(Kill("clean"), env_extra={"RELIABILITY_ENOSPC": "changelog:6"})

    assert failed.returncode == 1, failed.stderr
    assert NO_SPACE in failed.stderr
    assert "state version 6" in failed.stderr
    assert "Traceback" not in failed.stderr
    assert run.next_batch() == (5, True)
    run.finish()
    assert run.verdict is not None
    assert run.verdict.exact, run.verdict


class _FullDiskSink(ParquetSink):
    """A Parquet sink whose disk is full while it writes batch ``full_at``."""

    full_at = 2

    def _write_data(
        self, batch_id: int, df: pl.DataFrame
    ) -> tuple[list[dict[str, Any]], pl.DataFrame | None]:
        if batch_id == self.full_at:
            raise OSError(errno.ENOSPC, NO_SPACE, str(self.path))
        return super()._write_data(batch_id, df)


def test_sink_without_space_in_process_stops_and_resumes(tmp_path: Path) -> None:
    data = tmp_path / "in"
    data.mkdir()
    for i in range(5):
        frame = pl.DataFrame({"x": list(range(i * 10, i * 10 + 10))})
        frame.write_parquet(data / f"{i}.parquet")
        os.utime(data / f"{i}.parquet", ns=(10**18 + i * 10**6, 10**18 + i * 10**6))
    stream = mb.read_files(data, format="parquet", max_files_per_batch=1)

    query = stream.write_to(_FullDiskSink(tmp_path / "out")).start(
        tmp_path / "chk", trigger="available-now")
    with pytest.raises(mb.QueryTerminatedError, match=NO_SPACE) as info:
        query.await_termination(60)
    assert "cannot write the data files of batch 2" in str(info.value)
    assert mb.parquet_table(tmp_path / "out")["x"].to_list() == list(range(20))

    stream.write_parquet(tmp_path / "out").start(
        tmp_path / "chk", trigger="available-now").await_termination(60)
    assert sorted(mb.parquet_table(tmp_path / "out")["x"].to_list()) == list(range(50))


def test_a_checkpoint_write_without_space_names_the_file_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # was: "[Errno 28] No space left on device" naming no file, and a stray temp file
    from microbatch.checkpoint import files
    from statestore import durable

    def full(fd: int, data: object) -> int:
        raise OSError(errno.ENOSPC, NO_SPACE)

    monkeypatch.setattr(durable.os, "write", full)  # the durable-write layer's writes
    target = tmp_path / "offsets" / "7"
    target.parent.mkdir()

    with pytest.raises(OSError, match=NO_SPACE) as info:
        files.write_json_atomic(target, "offsets", {"batch_id": 7})

    assert info.value.errno == errno.ENOSPC
    assert info.value.filename == str(target)
    assert list(target.parent.iterdir()) == []


def test_state_snapshot_on_a_full_disk_leaves_a_recoverable_checkpoint(
    tmp_path: Path, tiny_fs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint on a real 2 MB tmpfs that runs full exactly when the state
    store writes a snapshot (the changelog of that version is already on disk):
    the query stops with ENOSPC naming the state version, the batch stays
    uncommitted; with space freed, a restart re-runs it, and a third run loads the
    state from the files (snapshot + changelogs) written after the failure."""
    from statestore import provider

    init = provider.StateStoreProvider.__init__

    def snapshot_often(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **{**kwargs, "max_changelog_chain": 3})  # a snapshot every 3 versions

    write_arrow = provider.write_arrow  # type: ignore[attr-defined]
    ballasts: list[Path] = []

    def full_at_snapshot(path: Path, frame: pl.DataFrame, *, kind: Any, version: int,
                         **kw: Any) -> int:
        if kind == "snapshot" and not ballasts:  # the disk fills up now, for real
            ballasts.append(fill(tiny_fs, leave=0))
        return write_arrow(path, frame, kind=kind, version=version, **kw)

    monkeypatch.setattr(provider.StateStoreProvider, "__init__", snapshot_often)
    monkeypatch.setattr(provider, "write_arrow", full_at_snapshot)
    chk = tiny_fs / "chk"
    keys, per_batch = 5_000, 2_000
    source = mb.read_memory(schema={"k": pl.Int64, "v": pl.Int64}, max_records_per_batch=per_batch)
    i = pl.int_range(0, 5 * per_batch, dtype=pl.Int64, eager=True)
    source.add(pl.DataFrame({"k": i % keys, "v": i}))
    writer = source.group_by("k").agg(pl.col("v").sum(), pl.len().alias("n")).write_memory(
        "disk_full_snapshot", output_mode="update")

    query = writer.start(chk, trigger="available-now")
    with pytest.raises(mb.QueryTerminatedError, match=NO_SPACE) as info:
        query.await_termination(60)

    assert "state version 3" in str(info.value.__cause__)  # batch 2 commits version 3
    assert sorted(os.listdir(chk / "commits")) == ["0", "1"]
    assert (chk / "offsets" / "2").exists()
    state = chk / "state" / "agg-0"
    assert not (state / "snapshot" / "3.arrow").exists()
    assert not [p.name for p in state.rglob("*") if p.name.endswith(".tmp")]  # no temp files

    ballasts[0].unlink()
    assert writer.start(chk, trigger="available-now").await_termination(60)
    source.add(pl.DataFrame({"k": pl.int_range(0, 3_000, dtype=pl.Int64, eager=True),
                             "v": pl.int_range(0, 3_000, dtype=pl.Int64, eager=True)}))
    monkeypatch.setattr(provider, "write_arrow", write_arrow)
    # a new query object: its operators rebuild the state from the files on the tmpfs
    assert writer.start(chk, trigger="available-now").await_termination(60)

    everything = pl.concat([
        pl.DataFrame({"k": i % keys, "v": i}),
        pl.DataFrame({"k": pl.int_range(0, 3_000, dtype=pl.Int64, eager=True),
                      "v": pl.int_range(0, 3_000, dtype=pl.Int64, eager=True)}),
    ])
    oracle = everything.group_by("k").agg(pl.col("v").sum(), pl.len().alias("n")).sort("k")
    got = mb.table("disk_full_snapshot").sort("k")
    assert got.equals(oracle.select(got.columns)), (got, oracle)
    assert list((state / "snapshot").glob("*.arrow")), "snapshots were written after the failure"
    from microbatch.observability.status import status_document

    doc = status_document(chk)
    assert doc["last_error"] is None
    assert (doc["last_committed_batch"], doc["pending_recovery"]) == (6, False)
