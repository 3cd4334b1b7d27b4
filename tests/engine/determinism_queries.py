"""Queries whose output must be bit-identical on every run of the same log.

Used in-process by ``test_determinism.py`` and as a script in fresh
processes (``python determinism_queries.py OUT_DIR``), where the Polars
thread-pool size is set by ``POLARS_MAX_THREADS`` before Polars is imported.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl

import microbatch as mb

START = "2026-01-01T00:00:00+00:00"
ROWS = 120_000
BATCH = 20_000


def payments(seed: int = 7, *, zipf: float = 1.3) -> mb.Stream:
    """Generated card payments with float amounts (cents, summed in random orders
    they would differ in the last bits)."""
    return mb.generate(rows_per_second=None, total_rows=ROWS, cards=300, zipf=zipf,
                       partitions=4, seed=seed, start=START, max_records_per_batch=BATCH,
                       late_fraction=0.01, late_by=("5s", "1m"))


def tumbling() -> mb.Stream:
    return (
        payments().with_watermark("event_time", "5s")
        .group_by(mb.window("event_time", "10s"), "card_id")
        .agg(pl.len().alias("n"), pl.col("amount").sum().alias("total"),
             pl.col("amount").mean().alias("mean"), pl.col("amount").min().alias("lo"),
             pl.col("amount").max().alias("hi"), pl.col("amount").first().alias("first"),
             pl.col("amount").last().alias("last"))
    )


def hopping() -> mb.Stream:
    return (
        payments().with_watermark("event_time", "5s")
        .group_by(mb.window("event_time", "30s", slide="10s"), "card_id")
        .agg(pl.col("amount").sum().alias("total"), pl.col("amount").mean().alias("mean"))
    )


def session() -> mb.Stream:
    return (
        payments().with_watermark("event_time", "5s")
        .group_by(mb.session_window("event_time", gap="2s"), "card_id")
        .agg(pl.len().alias("n"), pl.col("amount").sum().alias("total"))
    )


def interval_join() -> mb.Stream:
    # NOTE: a flat key distribution: an equi-join on a card holding a quarter of the
    # rows (zipf 1.3) is quadratic in that card's rows per batch
    left = payments(7, zipf=0.5).with_watermark("event_time", "5s")
    right = payments(8, zipf=0.5).select("card_id", "amount", pl.col("event_time").alias("paid_at"))
    joined = left.join_interval(
        right.with_watermark("paid_at", "5s"), on="card_id", left_time="event_time",
        right_time="paid_at", lower="-1s", upper="1s", how="left",
    )
    # float products summed per window: the sums depend on the join's row order too
    return (
        joined.with_columns((pl.col("amount") * pl.col("amount_right")).alias("product"))
        .group_by(mb.window("event_time", "10s"), "card_id")
        .agg(pl.len().alias("n"), pl.col("product").sum().alias("products"))
    )


def dedupe() -> mb.Stream:
    return (
        payments().with_watermark("event_time", "5s")
        .with_columns((pl.col("amount") * 100).round(0).cast(pl.Int64).alias("cents"))
        .drop_duplicates(["card_id", "cents"], within="1m")
        .with_columns((pl.col("amount") / 3).alias("third"))
    )


QUERIES: dict[str, Callable[[], mb.Stream]] = {
    "tumbling": tumbling,
    "hopping": hopping,
    "session": session,
    "interval_join": interval_join,
    "dedupe": dedupe,
}


def run(name: str, executor: mb.LocalExecutor | mb.RayExecutor | None = None) -> pl.DataFrame:
    """Every row the query writes, in the order of its batches, on a fresh checkpoint."""
    table = f"determinism-{name}-{next(_runs)}"
    query = QUERIES[name]().write_memory(table).start(
        checkpoint=tempfile.mkdtemp(prefix="mb-determinism-"), trigger="available-now",
        executor=executor,
    )
    if not query.await_termination(300):
        raise RuntimeError(f"{name}: the query did not finish in 300 s")
    if query.exception is not None:
        raise query.exception
    return mb.table(table)


def bits(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with every float column replaced by its IEEE-754 bit pattern, so that
    ``equals`` compares floats bit for bit (``-0.0`` vs ``0.0``, NaN payloads)."""
    columns = []
    for name in df.columns:
        s = df[name]
        if s.dtype.is_float():
            pattern = s.cast(pl.Float64).fill_null(0.0).to_numpy().view(np.uint64)
            s = pl.Series(name, pattern).scatter(s.is_null().arg_true(), None)
        columns.append(s)
    return pl.DataFrame(columns)


class _Counter:
    def __init__(self) -> None:
        self.n = 0

    def __next__(self) -> int:
        self.n += 1
        return self.n


_runs = _Counter()


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for query_name in QUERIES:
        run(query_name).write_ipc(out / f"{query_name}.arrow")
    print(pl.thread_pool_size())
