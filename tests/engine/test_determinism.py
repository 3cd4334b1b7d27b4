"""Replays are bit-identical: the same log and code give the same bits, floats included.

The engine's output must be a function of (offsets, state, code) alone: not of
timing, of the memory layout of a batch, of read-ahead, of the size of Polars'
thread pool, or of which process runs it. Every query kind that folds floats
(tumbling, hopping, session aggregation; a join whose row order feeds a sum;
dedupe) is run several times in this process, without read-ahead, and in fresh
processes with one and two Polars threads, and the outputs are compared bit for
bit (see ``determinism_queries.bits``).

Root cause of the differences this guards against: Polars' streaming engine,
the default of ``LazyFrame.collect()``, combines per-morsel partial sums in an
order that changes from call to call; the engine collects with the in-memory
engine only (:mod:`microbatch.frames`), which the structure test below enforces.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import determinism_queries as queries
import numpy as np
import polars as pl
import pytest

from microbatch.engine.execution import MicroBatchExecution
from microbatch.frames import collect

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference() -> dict[str, pl.DataFrame]:
    """Each query's output from a first run in this process."""
    return {name: queries.run(name) for name in queries.QUERIES}


def _assert_bit_identical(a: pl.DataFrame, b: pl.DataFrame, what: str) -> None:
    assert a.schema == b.schema, what
    assert a.height == b.height, f"{what}: {a.height} rows vs {b.height}"
    same = queries.bits(a).equals(queries.bits(b))
    if not same:
        diff = sum(
            int((queries.bits(a)[c] != queries.bits(b)[c]).sum()) for c in a.columns
        )
        pytest.fail(f"{what}: {diff} values differ bitwise")


@pytest.mark.parametrize("name", list(queries.QUERIES))
def test_repeated_runs_in_one_process_are_bit_identical(
    name: str, reference: dict[str, pl.DataFrame]
) -> None:
    assert reference[name].height > 1_000  # enough float folds to show a reordering
    for run in range(2):
        _assert_bit_identical(reference[name], queries.run(name), f"{name}, run {run + 2}")


@pytest.mark.parametrize("name", list(queries.QUERIES))
def test_without_read_ahead_is_bit_identical(
    name: str, reference: dict[str, pl.DataFrame], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read-ahead reads batch N+1 on another thread; the rows it gives (and their
    chunk layout) must not change a bit of the result."""
    monkeypatch.setattr(MicroBatchExecution, "start_read_ahead", lambda *a, **k: None)
    _assert_bit_identical(reference[name], queries.run(name), f"{name} without read-ahead")


@pytest.mark.parametrize("threads", [1, 2])
def test_fresh_processes_with_other_thread_counts_are_bit_identical(
    threads: int, reference: dict[str, pl.DataFrame], tmp_path: Path
) -> None:
    env = {**os.environ, "POLARS_MAX_THREADS": str(threads)}
    done = subprocess.run(
        [sys.executable, str(Path(queries.__file__)), str(tmp_path)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == str(threads)  # the pool size the child really had
    for name in queries.QUERIES:
        got = pl.read_ipc(tmp_path / f"{name}.arrow")
        _assert_bit_identical(reference[name], got, f"{name} in a process with {threads} threads")


def test_the_engine_collect_gives_the_same_bits_every_call() -> None:
    """The cause, directly: one aggregation collected many times over the same rows.

    With ``LazyFrame.collect()`` (Polars' streaming engine) a few thousand of
    these sums differ in the last bits between two calls; ``frames.collect``
    folds each group in row order, so every call agrees with the eager result.
    """
    rng = np.random.default_rng(1)
    n = 200_000
    df = pl.DataFrame({"k": rng.integers(0, 13_000, n),
                       "x": np.round(rng.lognormal(3, 1, n), 2)})
    chunked = pl.concat([df.slice(i, 7_919) for i in range(0, n, 7_919)], rechunk=False)
    eager = df.group_by("k", maintain_order=True).agg(pl.col("x").sum())
    for frame in [df, chunked] * 5:
        got = collect(frame.lazy().group_by("k", maintain_order=True).agg(pl.col("x").sum()))
        _assert_bit_identical(eager, got, f"collect over {frame.n_chunks()} chunk(s)")


def _bare_collects(path: Path) -> list[str]:
    """``x.collect(...)`` calls that do not go through :func:`microbatch.frames.collect`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "collect"
            and not any(k.arg == "engine" for k in node.keywords)
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_collect_on_the_batch_path_uses_the_in_memory_engine() -> None:
    offenders = [
        hit
        for package in ("microbatch", "statestore", "sinks")
        for path in sorted((ROOT / package).rglob("*.py"))
        for hit in _bare_collects(path)
    ]
    assert offenders == [], (
        "LazyFrame.collect() without engine= runs Polars' streaming engine, whose "
        "float aggregates change from call to call; use microbatch.frames.collect: "
        f"{offenders}"
    )


def test_two_queries_over_one_stream_write_identical_rows(tmp_path: Path) -> None:
    """The quickstart notebook's check, directly: one stream, a memory table and a
    Delta table, each query on its own checkpoint, hold the same bits."""
    import microbatch as mb

    stream = (
        mb.generate(rows_per_second=None, total_rows=60_000, cards=2_000, partitions=4,
                    seed=7, start=queries.START, max_records_per_batch=10_000,
                    late_fraction=0.002)
        .with_watermark("event_time", "5s")
        .group_by(mb.window("event_time", "10s"), "card_id")
        .agg(pl.len().alias("payments"), pl.col("amount").sum().alias("total"))
    )
    memory = stream.write_memory("determinism-two-sinks").start(
        tmp_path / "chk-memory", trigger="available-now")
    assert memory.await_termination(120)
    delta = stream.write_delta(str(tmp_path / "delta")).start(
        tmp_path / "chk-delta", trigger="available-now")
    assert delta.await_termination(120)
    in_memory = mb.table("determinism-two-sinks").sort("window_start", "card_id")
    in_delta = pl.read_delta(str(tmp_path / "delta")).sort("window_start", "card_id")
    assert in_delta.height > 5_000
    _assert_bit_identical(
        in_delta.select("card_id", "payments", "total"),
        in_memory.select("card_id", "payments", "total"),
        "memory table vs Delta table",
    )


def test_a_group_by_with_few_groups_sums_floats_the_same_way_every_time() -> None:
    """Root cause of a keyless window's sums differing between runs: Polars'
    partitioned group_by (few groups) combines per-thread partial sums in the
    order the threads finish; microbatch.frames turns it off."""
    rng = np.random.default_rng(1)
    n = 1_000_000
    df = pl.DataFrame({"w": rng.integers(0, 3, n), "x": rng.random(n) * 1000})
    assert os.environ.get("POLARS_NO_PARTITION") is not None
    sums = {
        collect(df.lazy().group_by("w").agg(pl.col("x").sum()).sort("w"))["x"]
        .to_numpy().tobytes()
        for _ in range(20)
    }
    assert len(sums) == 1
