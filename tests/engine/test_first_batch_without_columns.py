"""A stateful query over a source without a declared schema whose first batch has
no columns (its only file was a dead letter) defines its state in a later batch.

Batch N loads state version N (``statestore/contract.py``), so an operator
defined in batch B starts its store at version B (``StateStoreProvider.begin_at``);
the steps before it pass the column-less batch on. The result must equal a
one-shot Polars computation over the good files, whether the batches run in one
process or one per restart.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest

import microbatch as mb

SECOND = 1_000


def _files(root: Path, *, upto: int = 3) -> pl.DataFrame:
    """A corrupt Parquet file first, then good ones (the first ``upto`` of three,
    added to what is there); the good rows."""
    root.mkdir(exist_ok=True)
    (root / "0-corrupt.parquet").write_bytes(b"PAR1 not really parquet")
    os.utime(root / "0-corrupt.parquet", (1, 1))
    frames = []
    for i in range(3):
        frame = pl.DataFrame({
            "ts": [datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC)
                   for s in range(20 * i, 20 * i + 20, 3)],
            "k": ["a", "b"] * 3 + ["a"],
        })
        frames.append(frame)
        path = root / f"{i + 1}.parquet"
        if i >= upto or path.exists():
            continue
        frame.write_parquet(root / f".{path.name}")
        os.utime(root / f".{path.name}", (10 + i, 10 + i))
        (root / f".{path.name}").rename(path)
    return pl.concat(frames)


def _counts(rows: pl.DataFrame, size_s: int, keys: list[str]) -> pl.DataFrame:
    return (rows.with_columns(window_start=pl.col("ts").dt.truncate(f"{size_s}s"))
            .group_by("window_start", *keys).agg(n=pl.len().cast(pl.Int64)))


def _window(s: mb.Stream) -> mb.Stream:
    return s.group_by(mb.window("ts", "10s"), "k").agg(n=pl.len())


def _window_oracle(rows: pl.DataFrame) -> pl.DataFrame:
    # watermark: the newest time (00:00:57) minus 1 s; windows ending by it are emitted
    return _counts(rows, 10, ["k"]).filter(pl.col("window_start") < datetime(2026, 1, 1, 0, 0, 50,
                                                                            tzinfo=UTC))


Oracle = Callable[[pl.DataFrame], pl.DataFrame]
CASES: dict[str, tuple[Callable[[mb.Stream], mb.Stream], str, Oracle]] = {
    "window": (_window, "append", _window_oracle),
    "window, update mode": (_window, "update", lambda rows: _counts(rows, 10, ["k"])),
    "steps before the window": (
        lambda s: s.with_columns(key=pl.col("k") + "!").group_by(mb.window("ts", "10s"), "key")
        .agg(n=pl.len()),
        "append",
        lambda rows: _window_oracle(rows).with_columns(pl.col("k") + "!").rename({"k": "key"})),
    "dedupe": (lambda s: s.drop_duplicates("k", within="5m"), "append",
               lambda rows: rows.unique("k", keep="first", maintain_order=True)),
    "fire_once": (lambda s: _window(s).fire_once(pl.col("n") >= 2), "append",
                  lambda rows: _counts(rows, 10, ["k"]).filter(pl.col("n") >= 2).select(
                      "window_start", "k")),
}


def _run(case: str, root: Path, chk: Path, trigger: str) -> None:
    build, mode, _ = CASES[case]
    stream = build(mb.read_files(root, format="parquet", max_files_per_batch=1)
                   .with_watermark("ts", "1s"))
    query = stream.write_memory(_table(chk), output_mode=mode).start(  # type: ignore[arg-type]
        chk, trigger=trigger)
    assert query.await_termination(60)
    assert query.exception is None, query.exception


def _table(chk: Path) -> str:
    return f"first-batch-without-columns-{chk.parent.name}"


def _compare(case: str, out: pl.DataFrame, rows: pl.DataFrame) -> None:
    _, mode, oracle = CASES[case]
    expected = oracle(rows)
    if mode == "update":  # the newest row per window and key
        out = out.group_by("window_start", "k").agg(pl.col("n").max())
    if case == "fire_once":
        out = out.select("window_start", "k")
    if "window_end" in out.columns:
        assert (out["window_end"] - out["window_start"]).dt.total_seconds().eq(10).all()
        out = out.drop("window_end")
    out = out.select(expected.columns)
    assert out.sort(out.columns).equals(expected.sort(expected.columns)), case


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("trigger", ["available-now", "a run per file"])
def test_state_defined_after_a_batch_without_columns_equals_the_oracle(
    case: str, trigger: str, tmp_path: Path
) -> None:
    rows = _files(tmp_path / "in")
    chk = tmp_path / "chk"
    if trigger == "available-now":
        _run(case, tmp_path / "in", chk, "available-now")
    else:  # a run per new file: the state defined in batch 1 is reopened from disk
        for upto in range(4):
            _files(tmp_path / "in", upto=upto)
            _run(case, tmp_path / "in", chk, "available-now")
    assert {"0", "1", "2", "3"} <= {p.name for p in (chk / "commits").iterdir()}
    dead = mb.parquet_table(chk / "dead_letter")
    assert dead.height == 1
    assert "0-corrupt.parquet" in str(dead.row(0))
    _compare(case, mb.table(_table(chk)), rows)
