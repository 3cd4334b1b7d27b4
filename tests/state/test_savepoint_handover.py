"""A job upgraded from a savepoint keeps writing the old job's Delta table: the
table's writer registry hands it over (the old query retired), the result is
each window once, and an old query that ran on past its savepoint is refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from deltalake import DeltaTable

import microbatch as mb
from microbatch.state.restore import restore_savepoint
from microbatch.state.savepoint import write_savepoint
from sinks.exceptions import OtherWriterError, RetiredWriterError

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SCHEMA = {"k": pl.Int64, "ts": pl.Datetime("ms", "UTC"), "v": pl.Int64}


def _file(base: Path, i: int) -> pl.DataFrame:
    """File i: 8 rows from minute i + 10 s, every 10 s, keys 0/1 (two windows each)."""
    frame = pl.DataFrame({
        "k": [j % 2 for j in range(8)],
        "ts": [T0 + timedelta(seconds=i * 60 + 10 + j * 10) for j in range(8)],
        "v": [i * 10 + j for j in range(8)],
    }, schema=SCHEMA)
    frame.write_parquet(base / "in" / f"f{i}.parquet")
    return frame


def _writer(base: Path) -> mb.DataStreamWriter:
    source = mb.read_files(base / "in", format="parquet", schema=SCHEMA,
                           max_files_per_batch=1).with_watermark("ts", delay="0s")
    windows = source.group_by(mb.window("ts", "1m"), "k").agg(
        pl.len().alias("n"), pl.col("v").sum().alias("total"))
    return windows.write_delta(str(base / "out"))


def _run(writer: mb.DataStreamWriter, chk: Path, *, flush: bool = False) -> None:
    query = writer.start(chk, trigger="available-now", flush_at_end=flush)
    query.await_termination(120)
    assert query.exception is None, query.exception


def _oracle(frames: list[pl.DataFrame]) -> pl.DataFrame:
    rows = pl.concat(frames)
    return (rows.group_by(pl.col("ts").dt.truncate("1m").alias("window_start"), "k")
            .agg(pl.len().cast(pl.UInt32).alias("n"), pl.col("v").sum().alias("total"))
            .sort("window_start", "k"))


def test_an_upgraded_job_takes_over_the_old_jobs_table(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    frames = [_file(tmp_path, i) for i in range(3)]
    _run(_writer(tmp_path), tmp_path / "old")
    write_savepoint(tmp_path / "old", tmp_path / "save")
    frames += [_file(tmp_path, i) for i in range(3, 5)]

    new = _writer(tmp_path)
    restore_savepoint(tmp_path / "save", tmp_path / "new", new)
    _run(new, tmp_path / "new", flush=True)

    got = (pl.from_arrow(DeltaTable(str(tmp_path / "out")).to_pyarrow_table())
           .select("window_start", "k", pl.col("n").cast(pl.UInt32), "total")
           .sort("window_start", "k"))
    assert got.equals(_oracle(frames))  # every window once: the old rows, then the new
    # the old query was retired by the new one: it may not write the table again
    _file(tmp_path, 5)
    with pytest.raises(RetiredWriterError, match="from its savepoint at batch"):
        _run(_writer(tmp_path), tmp_path / "old")


def test_an_old_job_that_ran_past_its_savepoint_is_not_taken_over(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    for i in range(2):
        _file(tmp_path, i)
    _run(_writer(tmp_path), tmp_path / "old")
    write_savepoint(tmp_path / "old", tmp_path / "save")
    _file(tmp_path, 2)
    _run(_writer(tmp_path), tmp_path / "old")  # the old job went on: batch 2 is in the table

    new = _writer(tmp_path)
    restore_savepoint(tmp_path / "save", tmp_path / "new", new)
    version = DeltaTable(str(tmp_path / "out")).version()
    ran_past = r"committed batches up to \d+ to it after its savepoint at batch \d+"
    with pytest.raises(OtherWriterError, match=ran_past):
        _run(new, tmp_path / "new")
    assert DeltaTable(str(tmp_path / "out")).version() == version  # nothing written
