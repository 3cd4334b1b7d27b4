"""End to end: a ``group_by`` over a Delta table's Change Data Feed into Delta.

A source table with ``delta.enableChangeDataFeed=true`` receives appends,
UPDATEs (of values and of the group column), DELETEs and MERGEs (update,
delete and insert clauses) across versions, drawn from a seeded random
generator. ``mb.read_delta(src, changes=True).group_by("g").agg(...)`` is
written with ``write_delta(out, output_mode="update")`` in several
``available-now`` runs on one checkpoint while the source receives more
commits. The oracle: the output table, read with deltalake, equals a
one-shot Polars ``group_by`` over the source's final state (read with
deltalake), groups whose rows were all deleted absent.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from cdf_history import CDF, SCHEMA, Source, one_shot
from deltalake import DeltaTable, write_deltalake

import microbatch as mb

pytestmark = pytest.mark.delta


def aggregate(src: str) -> mb.Stream:
    return (
        mb.read_delta(src, changes=True)
        .group_by("g")
        .agg(
            pl.len().alias("n"),
            pl.col("amount").count().alias("counted"),
            pl.col("amount").sum().alias("total"),
            pl.col("amount").mean().alias("avg"),
        )
    )


def output(path: Path) -> pl.DataFrame:
    frame = pl.from_arrow(DeltaTable(str(path)).to_pyarrow_table())
    assert isinstance(frame, pl.DataFrame)
    return frame.select(pl.col("g").cast(pl.String), "n", "counted", "total", "avg").sort("g")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cdf_group_by_into_delta_equals_one_shot_over_the_final_source(
    tmp_path: Path, seed: int
) -> None:
    source = Source(tmp_path / "src", seed)
    out, chk = tmp_path / "out", tmp_path / "chk"
    ops: list[str] = []
    for _run in range(4):
        for _ in range(source.rng.randint(1, 4)):
            ops.append(source.commit())
        query = aggregate(source.path).write_delta(out, output_mode="update").start(
            chk, trigger="available-now"
        )
        assert query.await_termination(120)
        # after every run, not only the last: the output is the result so far
        got, want = output(out), one_shot(source.final())
        assert got.drop("avg").equals(want.drop("avg")), (ops, got, want)
        assert got["avg"].to_list() == pytest.approx(want["avg"].to_list(), rel=1e-12)
    # the history exercised what the test is about (the seeds are chosen so)
    assert {"update_group", "delete", "merge"} <= set(ops), ops


def test_a_group_emptied_by_a_delete_leaves_the_output_table(tmp_path: Path) -> None:
    src, out = str(tmp_path / "src"), tmp_path / "out"
    write_deltalake(src, pl.DataFrame({"id": [1, 2, 3], "g": ["a", "a", "b"],
                                       "amount": [1, 2, 3]}, schema=SCHEMA).to_arrow(),
                    configuration=CDF)
    def run() -> pl.DataFrame:
        q = aggregate(src).write_delta(out, output_mode="update").start(
            tmp_path / "chk", trigger="available-now")
        assert q.await_termination(120)
        return output(out)
    assert run().select("g", "n", "total").rows() == [("a", 2, 3), ("b", 1, 3)]
    DeltaTable(src).delete("g = 'a'")
    assert run().select("g", "n", "total").rows() == [("b", 1, 3)]
    DeltaTable(src).update(updates={"g": "'c'"}, predicate="id = 3")
    assert run().select("g", "n", "total").rows() == [("c", 1, 3)]
