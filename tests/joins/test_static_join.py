"""Stream-static joins: a DataFrame, Parquet files and a Delta table, re-read
when (and only when) they change, checked once per batch."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import polars as pl
import pytest
from deltalake import write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from join_helpers import assert_same_rows

import microbatch as mb
from microbatch.engine.faults import InjectedFault
from microbatch.testing import StreamTest

SCHEMA = {"id": pl.Int64, "k": pl.Int64, "x": pl.Int64}
DIM = pl.DataFrame({"k": [1, 2, 2, 3], "name": ["a", "b", "b2", "c"], "x": [10, 20, 21, 30]})


def build_static(other, how="inner"):
    return lambda src: src.join_static(other, on="k", how=how)


@pytest.mark.parametrize("how", ["inner", "left"])
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    keys=st.lists(st.sampled_from([0, 1, 2, 3, None]), max_size=30),
    cuts=st.lists(st.integers(1, 29), max_size=4),
)
def test_static_join_matches_polars(tmp_path_factory, how, keys, cuts) -> None:
    rows = pl.DataFrame({"id": range(len(keys)), "k": keys, "x": range(len(keys))}, schema=SCHEMA)
    test = StreamTest(
        build_static(DIM, how), schema=SCHEMA, checkpoint=tmp_path_factory.mktemp("s")
    )
    bounds = [0, *sorted({c for c in cuts if c < rows.height}), rows.height]
    for lo, hi in itertools.pairwise(bounds):
        if hi > lo:
            test.add(rows.slice(lo, hi - lo)).process()
    want = rows.join(DIM, on="k", how=how, coalesce=True)
    assert test.output.width == 0 or test.output.columns == want.columns
    assert_same_rows(test.output, want)
    test.close()


def touch_later(path: Path) -> None:
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def test_parquet_is_reread_when_its_files_change(tmp_path: Path) -> None:
    dim_dir = tmp_path / "dim"
    dim_dir.mkdir()
    DIM.write_parquet(dim_dir / "part-0.parquet")
    test = StreamTest(
        build_static(str(dim_dir), "left"), schema=SCHEMA, checkpoint=tmp_path / "chk"
    )
    out = test.add({"id": [1], "k": [1], "x": [0]}).process()
    assert out["name"].to_list() == ["a"]
    test.add({"id": [2], "k": [1], "x": [0]}).process()
    assert test.progress[-1]["state"]["join-0"]["static_reloaded"] is False
    # rewrite the file: the next batch sees the new contents
    pl.DataFrame({"k": [1], "name": ["A"], "x": [11]}).write_parquet(dim_dir / "part-0.parquet")
    touch_later(dim_dir / "part-0.parquet")
    out = test.add({"id": [3], "k": [1], "x": [0]}).process()
    assert out["name"].to_list() == ["A"]
    assert test.progress[-1]["state"]["join-0"]["static_reloaded"] is True
    # a new file in the directory is picked up too
    pl.DataFrame({"k": [4], "name": ["d"], "x": [40]}).write_parquet(dim_dir / "part-1.parquet")
    out = test.add({"id": [4], "k": [4], "x": [0]}).process()
    assert out["name"].to_list() == ["d"]
    test.close()


@pytest.mark.delta
def test_delta_new_version_is_picked_up_and_a_rerun_uses_the_recorded_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = str(tmp_path / "dim")
    write_deltalake(table, DIM.to_arrow())
    test = StreamTest(build_static(table, "left"), schema=SCHEMA, checkpoint=tmp_path / "chk")
    out = test.add({"id": [1], "k": [3], "x": [0]}).process()
    assert out["name"].to_list() == ["c"]
    assert test.progress[-1]["state"]["join-0"]["static_version"] == 0
    write_deltalake(
        table, pl.DataFrame({"k": [3], "name": ["C"], "x": [31]}).to_arrow(), mode="overwrite"
    )
    out = test.add({"id": [2], "k": [3], "x": [0]}).process()
    assert out["name"].to_list() == ["C"]
    assert test.progress[-1]["state"]["join-0"]["static_version"] == 1
    # batch N fails after its join ran; the table moves on; the re-run of N uses version 1
    batch = test.execution.next_batch_id
    monkeypatch.setenv("MICROBATCH_FAULT", f"after_execute@{batch}")
    monkeypatch.setenv("MICROBATCH_FAULT_ACTION", "raise")
    test.add({"id": [3], "k": [3], "x": [0]})
    with pytest.raises(InjectedFault):
        test.process()
    monkeypatch.delenv("MICROBATCH_FAULT")
    write_deltalake(
        table, pl.DataFrame({"k": [3], "name": ["new"], "x": [32]}).to_arrow(), mode="overwrite"
    )
    out = test.restart().process()
    assert out.filter(pl.col("id") == 3)["name"].to_list() == ["C"]
    out = test.add({"id": [4], "k": [3], "x": [0]}).process()
    assert out["name"].to_list() == ["new"]
    test.close()


def test_static_join_refuses_bad_inputs(tmp_path: Path) -> None:
    src = mb.read_memory(schema=SCHEMA)
    with pytest.raises(mb.PlanError, match="does not exist"):
        src.join_static(tmp_path / "missing", on="k")
    with pytest.raises(mb.PlanError, match="how='full'"):
        src.join_static(DIM, on="k", how="full")  # type: ignore[arg-type]
    with pytest.raises(mb.PlanError, match="not a LazyFrame"):
        src.join_static(DIM.lazy(), on="k")  # type: ignore[arg-type]
    # the static side needs no watermark and keeps no state: preview works
    assert "static" in src.join_static(DIM, on="k").explain().lower()
