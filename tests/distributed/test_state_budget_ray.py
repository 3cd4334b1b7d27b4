"""``state_memory_budget`` on the Ray executor: the operators' bytes are summed
over every shard, so the budget bounds the whole query's state; the failed
batch is not committed and a larger budget resumes it exactly once."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest

import microbatch as mb

ROWS, BATCH, KEYS = 60_000, 20_000, 40_000


def rows() -> pl.DataFrame:
    """Key ``k`` = i % KEYS and value ``v`` = i, in arrival order."""
    i = pl.int_range(0, ROWS, dtype=pl.Int64, eager=True)
    return pl.DataFrame({"k": i % KEYS, "v": i})


def test_the_budget_counts_every_shard(ray_cluster: str, tmp_path: Path) -> None:
    source = mb.read_memory(schema={"k": pl.Int64, "v": pl.Int64}, max_records_per_batch=BATCH)
    source.add(rows())
    writer = source.group_by("k").agg(pl.col("v").sum()).write_memory(
        "ray_budget", output_mode="update")
    executor = mb.RayExecutor(workers=2, address=ray_cluster, shards=4)
    chk = tmp_path / "chk"

    # one batch's 20k keys take ~1 MB over all shards: about a quarter per shard
    query = writer.start(chk, trigger="available-now", executor=executor,
                         state_memory_budget="1200KB")
    with pytest.raises(mb.QueryTerminatedError) as info:
        query.await_termination(120)

    error = info.value.__cause__
    assert isinstance(error, mb.StateBudgetExceededError), info.value
    assert error.batch_id == 1
    assert error.operators[0]["operator"] == "agg-0"
    assert error.operators[0]["rows"] == KEYS  # summed over the 4 shards
    assert sorted(os.listdir(chk / "commits")) == ["0"]

    again = writer.start(chk, trigger="available-now", executor=executor,
                         state_memory_budget="64MB")
    assert again.await_termination(120)
    oracle = rows().group_by("k").agg(pl.col("v").sum()).sort("k")
    got = mb.table("ray_budget").sort("k")
    assert got.equals(oracle.select(got.columns))
