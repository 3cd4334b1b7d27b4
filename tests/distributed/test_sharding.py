"""How rows and state are split into shards, and the checkpoints each executor refuses."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import microbatch as mb
from microbatch.distributed.sharding import ShardLayout


@settings(max_examples=60, deadline=None)
@given(
    keys=st.lists(st.integers(-5, 40), min_size=0, max_size=300),
    shards=st.integers(1, 9),
    first=st.integers(0, 1000),
)
def test_a_split_keeps_every_row_once_each_key_in_one_shard_in_order(
    keys: list[int], shards: int, first: int
) -> None:
    df = pl.DataFrame({"k": keys, "i": list(range(len(keys)))}, schema={"k": pl.Int64,
                                                                        "i": pl.Int64})
    for layout in (ShardLayout(shards, "hash", ("k",)), ShardLayout(shards, "spread", ()),
                   ShardLayout(shards, "single", ())):
        parts = layout.split(df, first)
        assert len(parts) == shards
        assert all(p.schema == df.schema for p in parts)
        assert sorted(pl.concat(parts)["i"].to_list()) == df["i"].to_list()
        for part in parts:
            assert part["i"].to_list() == sorted(part["i"].to_list())  # batch order kept
        if layout.mode == "hash":
            owners = {k: s for s, p in enumerate(parts) for k in p["k"].to_list()}
            assert all(owners[k] == s for s, p in enumerate(parts) for k in p["k"].to_list())
        if layout.mode == "single":
            assert parts[0].height == df.height


def _payments() -> mb.Stream:
    return mb.generate(rows_per_second=None, total_rows=100, seed=1,
                       start="2026-01-01T00:00:00+00:00").with_watermark("event_time", "5s")


def test_the_shard_key_is_what_every_keyed_operator_groups_by() -> None:
    window = _payments().group_by(mb.window("event_time", "10s"), "card_id", "merchant")
    assert ShardLayout.for_plan(window.agg(pl.len()).plan, 4).columns == (
        "card_id", "merchant")
    deduped = (_payments().drop_duplicates(["card_id", "amount"], within="1m")
               .group_by(mb.window("event_time", "10s"), "card_id").agg(pl.len()))
    assert ShardLayout.for_plan(deduped.plan, 4) == ShardLayout(4, "hash", ("card_id",))
    assert ShardLayout.for_plan(_payments().filter(pl.col("amount") > 1).plan, 4).mode == "spread"


def test_each_executor_refuses_the_other_ones_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("ray")

    def query() -> mb.DataStreamWriter:
        return (_payments().group_by(mb.window("event_time", "10s"), "card_id")
                .agg(pl.len().alias("n")).write_memory(f"refuse-{tempfile.mktemp()[-6:]}"))

    local_chk = tmp_path / "local"
    first = query().start(local_chk, trigger="available-now")
    assert first.await_termination(60)
    with pytest.raises(mb.IncompatibleCheckpointError, match="ran in one process"):
        query().start(local_chk, trigger="available-now",
                      executor=mb.RayExecutor(workers=1, address="127.0.0.1:1"))

    sharded = tmp_path / "sharded"
    (sharded / "state").mkdir(parents=True)
    (sharded / "state" / "shards.json").write_text("{}")
    with pytest.raises(mb.IncompatibleCheckpointError, match="scaled out on Ray"):
        query().start(sharded, trigger="available-now")


def test_without_ray_installed_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` does when it is absent
    with pytest.raises(mb.ExecutorError, match=r"pip install 'microbatch\[ray\]'"):
        _payments().write_memory("no-ray").start(trigger="available-now",
                                                 executor=mb.RayExecutor(workers=2))
