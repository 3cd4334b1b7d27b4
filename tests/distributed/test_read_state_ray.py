"""``mb.read_state`` on a Ray-sharded checkpoint: the shards' rows, with a
``shard`` column, are the one-shot per-key sums, each key in one shard."""

from __future__ import annotations

from pathlib import Path

import polars as pl

import microbatch as mb


def test_a_sharded_state_is_every_shard_concatenated(ray_cluster: str, tmp_path: Path) -> None:
    rows = pl.DataFrame({"k": [i % 23 for i in range(200)], "v": list(range(200))},
                        schema={"k": pl.Int64, "v": pl.Int64})
    source = mb.read_memory(schema={"k": pl.Int64, "v": pl.Int64}, max_records_per_batch=80)
    source.add(rows)
    writer = source.group_by("k").agg(pl.col("v").sum().alias("total")).write_memory(
        "ray_read_state", output_mode="update")
    query = writer.start(tmp_path / "chk", trigger="available-now",
                         executor=mb.RayExecutor(workers=2, address=ray_cluster, shards=3))
    assert query.await_termination(120)
    state = mb.read_state(tmp_path / "chk")
    assert state.columns[0] == "shard"
    assert state["shard"].n_unique() > 1  # the keys are spread over the shards
    assert state.group_by("k").agg(pl.col("shard").n_unique())["shard"].max() == 1
    want = rows.group_by("k").agg(pl.col("v").sum().alias("total")).sort("k")
    assert state.select("k", "total").sort("k").equals(want)
    first = mb.read_state(tmp_path / "chk", batch=0)  # after the first 80 rows
    assert first.select("k", "total").sort("k").equals(
        rows.head(80).group_by("k").agg(pl.col("v").sum().alias("total")).sort("k"))
