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

import random
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import microbatch as mb

pytestmark = pytest.mark.delta

CDF = {"delta.enableChangeDataFeed": "true"}
SCHEMA = {"id": pl.Int64, "g": pl.String, "amount": pl.Int64}
GROUPS = ["a", "b", "c", "d"]


def rows(rng: random.Random, ids: list[int]) -> pa.Table:
    return pl.DataFrame(
        {"id": ids, "g": [rng.choice(GROUPS) for _ in ids],
         "amount": [rng.randint(-50, 100) for _ in ids]},
        schema=SCHEMA,
    ).to_arrow()


class Source:
    """The source table and a seeded random stream of commits to it."""

    def __init__(self, path: Path, seed: int) -> None:
        self.path, self.rng, self.next_id = str(path), random.Random(seed), 0
        write_deltalake(self.path, self._new(5), configuration=CDF)

    def _new(self, n: int) -> pa.Table:
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return rows(self.rng, ids)

    def _some_ids(self) -> list[int]:
        return self.rng.sample(range(self.next_id), k=min(self.next_id, self.rng.randint(1, 4)))

    def commit(self) -> str:
        """One random commit; its operation."""
        rng, table = self.rng, DeltaTable(self.path)
        op = rng.choice(["append", "update_amount", "update_group", "delete", "merge"])
        ids = ", ".join(map(str, self._some_ids()))
        if op == "append":
            write_deltalake(self.path, self._new(rng.randint(1, 4)), mode="append")
        elif op == "update_amount":
            table.update(updates={"amount": f"amount + {rng.randint(-20, 20)}"},
                         predicate=f"id IN ({ids})")
        elif op == "update_group":
            table.update(updates={"g": f"'{rng.choice(GROUPS)}'"}, predicate=f"id IN ({ids})")
        elif op == "delete":
            table.delete(f"id IN ({ids})")
        else:
            updates = rows(rng, self._some_ids())
            deletes = pl.DataFrame({"id": self._some_ids()}, schema={"id": pl.Int64})
            source = pl.concat(
                [pl.from_arrow(updates).with_columns(pl.lit(False).alias("del")),  # type: ignore[union-attr]
                 deletes.with_columns(g=pl.lit("a"), amount=pl.lit(0, pl.Int64),
                                      **{"del": pl.lit(True)})],
                how="vertical_relaxed",
            ).unique("id", keep="first", maintain_order=True)
            source = pl.concat([source, pl.from_arrow(self._new(1))  # type: ignore[arg-type]
                                .with_columns(pl.lit(False).alias("del"))])
            (
                table.merge(source.to_arrow(), "t.id = s.id", source_alias="s", target_alias="t")
                .when_matched_delete(predicate="s.del")
                .when_matched_update(updates={"g": "s.g", "amount": "s.amount"})
                .when_not_matched_insert(
                    updates={"id": "s.id", "g": "s.g", "amount": "s.amount"},
                    predicate="NOT s.del",
                )
                .execute()
            )
        return op

    def final(self) -> pl.DataFrame:
        frame = pl.from_arrow(DeltaTable(self.path).to_pyarrow_table())
        assert isinstance(frame, pl.DataFrame)
        return frame.select(pl.col("id"), pl.col("g").cast(pl.String), pl.col("amount"))


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


def one_shot(table: pl.DataFrame) -> pl.DataFrame:
    return (
        table.group_by("g")
        .agg(
            pl.len().cast(pl.Int64).alias("n"),
            pl.col("amount").count().cast(pl.Int64).alias("counted"),
            pl.col("amount").sum().alias("total"),
            pl.col("amount").mean().alias("avg"),
        )
        .sort("g")
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
