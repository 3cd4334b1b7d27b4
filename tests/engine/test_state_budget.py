"""``state_memory_budget``: a query whose state outgrows it stops with a clear error.

A plain ``group_by`` (no watermark, no TTL: its keys only accumulate) over a
memory source fails in the batch that takes its state over the budget, with
:class:`mb.StateBudgetExceededError` naming the operator and the fixes; that
batch reaches no sink and has no ``commits/`` entry; a restart on the same
checkpoint with a larger budget runs it and the rest, and the batches the sink
received, each exactly once, equal the one-shot Polars computation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import microbatch as mb
from microbatch.engine.state_budget import StateBudget, parse_size_bytes
from microbatch.operators.window_agg import WindowAggregate
from microbatch.plan.aggregates import AggSpec
from microbatch.sources.generator import GeneratorSource

ROWS = 100_000
BATCH = 20_000
KEYS = 60_000
"""Keys repeat across batches (row i has key i % KEYS), so state holds 60k rows
at the end: about 1.8 MB after batch 1, 2.9 MB after batch 2."""
SMALL, LARGE = "2MB", "64MB"

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "microbatch.cli"]


def rows() -> pl.DataFrame:
    """The input: key ``k`` and value ``v``, in arrival order."""
    i = pl.int_range(0, ROWS, dtype=pl.Int64, eager=True)
    return pl.DataFrame({"k": i % KEYS, "v": i})


def expected_updates() -> pl.DataFrame:
    """The one-shot oracle of the update stream: per batch, each key it touched
    with the sum of its values up to that batch (``batch`` column)."""
    df = rows().with_columns((pl.int_range(pl.len()) // BATCH).alias("batch"))
    per_batch = df.group_by("batch", "k").agg(pl.col("v").sum())
    return (
        per_batch.sort("batch", "k")
        .with_columns(pl.col("v").cum_sum().over("k"))
        .select("batch", "k", "v")
    )


class Recorder:
    """A ``foreach_batch`` function that keeps every call (to see each batch once)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, pl.DataFrame]] = []

    def __call__(self, df: pl.DataFrame, batch_id: int) -> None:
        self.calls.append((batch_id, df))

    def frame(self) -> pl.DataFrame:
        return pl.concat(
            [df.select(pl.lit(b, pl.Int32).alias("batch"), "k", "v") for b, df in self.calls]
        ).sort("batch", "k")


def start(
    source: mb.MemoryStream, sink: Recorder, chk: Path, budget: str | None
) -> mb.StreamingQuery:
    """The aggregation over ``source`` into ``sink``, on checkpoint ``chk``."""
    return (
        source.group_by("k").agg(pl.col("v").sum())
        .foreach_batch(sink, output_mode="update")
        .start(chk, trigger="available-now", state_memory_budget=budget)
    )


def memory_source() -> mb.MemoryStream:
    source = mb.read_memory(schema={"k": pl.Int64, "v": pl.Int64}, max_records_per_batch=BATCH)
    source.add(rows())
    return source


def test_over_budget_stops_uncommitted_and_a_larger_budget_resumes_exactly(
    tmp_path: Path,
) -> None:
    source, sink, chk = memory_source(), Recorder(), tmp_path / "chk"

    query = start(source, sink, chk, SMALL)
    with pytest.raises(mb.QueryTerminatedError) as info:
        query.await_termination(60)

    error = info.value.__cause__
    assert isinstance(error, mb.StateBudgetExceededError)
    assert isinstance(error, mb.MicrobatchError)
    message = str(error)
    assert "after batch 2" in message
    assert "state_memory_budget of 2MB" in message
    assert "agg-0 (group_by aggregation by 'k')" in message
    assert "60,000 rows" in message
    assert "ttl=" in message
    assert "mb.window" in message
    assert "state_memory_budget=" in message
    assert "--state-memory-budget" in message
    assert error.batch_id == 2
    assert error.budget_bytes == 2 << 20 < error.state_bytes
    assert [(o["operator"], o["keys"], o["rows"]) for o in error.operators] == [
        ("agg-0", ["k"], KEYS)]
    assert error.operators[0]["bytes"] == error.state_bytes
    # batch 2 reached no sink and is not committed: it waits in the write-ahead log
    assert [b for b, _ in sink.calls] == [0, 1]
    assert sorted(os.listdir(chk / "commits")) == ["0", "1"]
    assert sorted(os.listdir(chk / "offsets")) == ["0", "1", "2"]
    last_error = json.loads((chk / "last_error").read_text())
    assert "StateBudgetExceededError" in json.dumps(last_error)

    again = start(source, sink, chk, LARGE)
    assert again.await_termination(60)

    assert [b for b, _ in sink.calls] == [0, 1, 2, 3, 4]  # every batch exactly once
    assert_frame_equal(sink.frame(), expected_updates(), check_dtypes=False)
    assert sorted(os.listdir(chk / "commits")) == ["0", "1", "2", "3", "4"]
    rerun = [r for r in again.recent_progress if r["batch_id"] == 2]
    assert rerun[-1]["recovered"]


def test_under_the_budget_nothing_changes(tmp_path: Path) -> None:
    budgeted, free = Recorder(), Recorder()
    assert start(memory_source(), budgeted, tmp_path / "a", LARGE).await_termination(60)
    assert start(memory_source(), free, tmp_path / "b", None).await_termination(60)

    assert_frame_equal(budgeted.frame(), free.frame())
    assert_frame_equal(budgeted.frame(), expected_updates(), check_dtypes=False)


def test_stateless_queries_ignore_the_budget(tmp_path: Path) -> None:
    query = memory_source().filter(pl.col("v") < 10).write_memory("budget_stateless").start(
        tmp_path / "chk", trigger="available-now", state_memory_budget=1)
    assert query.await_termination(60)
    assert mb.table("budget_stateless").height == 10


@pytest.mark.parametrize(
    ("text", "size"),
    [("512MB", 512 << 20), ("512mb", 512 << 20), ("1.5g", 3 << 29), ("64KiB", 64 << 10),
     ("2 GB", 2 << 30), ("1000", 1000), (4096, 4096), ("1t", 1 << 40)],
)
def test_sizes_parse_like_spark_and_flink(text: str | int, size: int) -> None:
    assert parse_size_bytes(text) == size


@pytest.mark.parametrize("bad", ["lots", "12 parsecs", "-1MB", "0", 0, True, "MB"])
def test_a_bad_budget_is_refused_when_started(tmp_path: Path, bad: object) -> None:
    writer = memory_source().write_memory("budget_bad")
    with pytest.raises(mb.PlanError, match="state_memory_budget"):
        writer.start(tmp_path / "chk", state_memory_budget=bad)  # type: ignore[arg-type]
    assert not (tmp_path / "chk").exists()


def test_the_check_costs_microseconds_per_batch() -> None:
    ops = [WindowAggregate(operator_id=f"agg-{i}", window=None, keys=["k"],
                           aggs=[AggSpec(kind="len", column=None, output="n")],
                           output_mode="update") for i in range(8)]
    metrics = {op.operator_id: {"bytes": 1 << 20, "rows": 10_000} for op in ops}
    budget = StateBudget.of("1GB")
    assert budget is not None
    runs = 2_000
    t0 = time.perf_counter()
    for batch_id in range(runs):
        budget.check(batch_id, metrics, ops, has_watermark=False)
    per_batch_us = (time.perf_counter() - t0) / runs * 1e6
    assert per_batch_us < 200, per_batch_us  # measured ~5 us with 8 operators


JOB = '''
import polars as pl
import microbatch as mb


def build(params):
    """Every generated payment's id as a key: state grows with each row."""
    out = params["output"]

    def write(df, batch_id):
        df.write_parquet(f"{out}/batch-{batch_id:04d}.parquet")  # a re-run overwrites

    return (
        mb.generate(rows_per_second=None, total_rows=50_000, seed=7, cards=1_000,
                    start="2026-01-01T00:00:00+00:00", max_records_per_batch=10_000)
        .group_by("event_id").agg(pl.len().alias("n"), pl.col("amount").sum())
        .foreach_batch(write, output_mode="update")
    )
'''


def cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROBATCH_FAULT")}
    return subprocess.run([*CLI, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=env, check=False)


def test_cli_exits_1_with_one_paragraph_and_status_shows_it(tmp_path: Path) -> None:
    job, out, chk = tmp_path / "job.py", tmp_path / "out", tmp_path / "chk"
    job.write_text(JOB)
    out.mkdir()
    run: list[str | Path] = ["run", job, "--checkpoint", chk, "--trigger", "available-now",
           "--param", f"output={out}"]

    failed = cli(*run, "--state-memory-budget", "1MB", cwd=tmp_path)

    assert failed.returncode == 1, failed.stderr
    assert "Traceback" not in failed.stderr + failed.stdout
    message = " ".join(failed.stderr.split())
    assert "StateBudgetExceededError" in message
    assert "state_memory_budget of 1MB" in message
    assert "agg-0 (group_by aggregation by 'event_id')" in message
    assert "ttl=" in message
    assert "--state-memory-budget" in message
    failed_batch = int(message.split("failed in batch ")[1].split(":")[0])
    assert not (chk / "commits" / str(failed_batch)).exists()
    assert not (out / f"batch-{failed_batch:04d}.parquet").exists()

    status = cli("status", chk, "--json", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert doc["last_error"]["type"] == "StateBudgetExceededError"
    assert any(a["code"] == "failed" and "state_memory_budget" in a["message"]
               for a in doc["alarms"])

    done = cli(*run, "--state-memory-budget", "256MB", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    got = pl.read_parquet(out / "*.parquet").sort("event_id")
    source = GeneratorSource(rows_per_second=None, total_rows=50_000, seed=7, cards=1_000,
                             start="2026-01-01T00:00:00+00:00")
    origin = source.initial_offset()
    oracle = (source.read(origin, source.latest_offset(origin, capped=False)).data
              .group_by("event_id").agg(pl.len().alias("n"), pl.col("amount").sum())
              .sort("event_id"))
    assert_frame_equal(got, oracle, check_dtypes=False)
    assert got.height == 50_000
    assert got["event_id"].n_unique() == 50_000
    assert got["n"].unique().to_list() == [1]
