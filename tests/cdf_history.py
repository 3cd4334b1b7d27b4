"""A Delta source table with the Change Data Feed on and a seeded random history
of commits to it (appends, UPDATEs of values and of the group column, DELETEs,
MERGEs with delete/update/insert clauses), and the one-shot aggregate a
``group_by("g")`` over its feed must equal. Shared by the end-to-end and the
crash tests of aggregates over a Change Data Feed."""

from __future__ import annotations

import random
from pathlib import Path

import polars as pl
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

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
