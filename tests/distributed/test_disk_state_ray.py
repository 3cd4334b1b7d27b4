"""The on-disk state backend on the Ray executor: each shard's stores keep their
database in the shard's own state directory, and the result equals the oracle
(and the local executor's), also after a restart on the same checkpoint."""

from __future__ import annotations

from pathlib import Path

import polars as pl

import microbatch as mb
from microbatch.checkpoint.files import read_json

ROWS, BATCH, KEYS = 6_000, 2_000, 500


def rows() -> pl.DataFrame:
    i = pl.int_range(0, ROWS, dtype=pl.Int64, eager=True)
    return pl.DataFrame({"k": i % KEYS, "v": i})


def test_each_shard_keeps_its_state_on_disk(ray_cluster: str, tmp_path: Path) -> None:
    source = mb.read_memory(schema={"k": pl.Int64, "v": pl.Int64}, max_records_per_batch=BATCH)
    source.add(rows().slice(0, 4_000))
    writer = source.group_by("k").agg(pl.col("v").sum()).write_memory(
        "ray_disk_state", output_mode="update")
    executor = mb.RayExecutor(workers=2, address=ray_cluster, shards=2)
    chk = tmp_path / "chk"
    assert writer.start(chk, trigger="available-now", executor=executor,
                        state_backend="disk").await_termination(120)
    source.add(rows().slice(4_000, 2_000))
    assert writer.start(chk, trigger="available-now", executor=executor,
                        state_backend="disk").await_termination(120)
    databases = sorted(p.parents[2].name for p in (chk / "state").rglob("lmdb/data.mdb"))
    assert databases == ["0000", "0001"], databases  # one per shard
    for shard in ("0000", "0001"):
        recorded = read_json(chk / "state" / "shards" / shard / "agg-0" / "backend.json",
                             "state-backend")
        assert recorded == {"backend": "lmdb"}
    got = mb.table("ray_disk_state").unique("k", keep="last", maintain_order=True).sort("k")
    oracle = rows().group_by("k").agg(pl.col("v").sum()).sort("k")
    assert got.select(oracle.columns).equals(oracle)
