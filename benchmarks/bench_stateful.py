"""transform_with_state benchmark: does a batch cost follow the batch, not the state?

A running count per key, ``fn`` written with Polars over the whole batch (one
call per batch), against the same result from ``group_by(k).agg(pl.len())`` in
update mode, on the same 100k-row batches, and the one-shot Polars limit
(``group_by`` over all the measured rows at once, no state).

For each state size (live keys loaded first through the engine, 100k new keys
per batch), ``--reps`` measured batches of 100k rows each update the same
number of keys (``TOUCHED``, 10k, drawn uniformly from the live ones, 10 rows
each), so that the batches do the same work and only the state's size differs.
Reported: median and max engine time per batch (``duration_ms`` total: read,
execute, state commit, sink), rows/s, the ratio to the smallest state, the
ratio to ``group_by``, and state bytes per key (memory of the store's arrays:
columns, hash index, time index).

Run: ``.venv/bin/python -m benchmarks.bench_stateful [--sizes 10000,10000000]``
(``make bench-stateful``). The 10M-key load takes a few minutes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import polars as pl

import microbatch as mb
from benchmarks.harness import dict_table, median, rate, repeat
from microbatch.frames import collect

BATCH = 100_000
TOUCHED = 10_000
SCHEMA = {"k": pl.Int64, "v": pl.Int64}


def running_count(inp: mb.StateInput) -> mb.StateOutput:
    """The count of each key so far, for the keys of the batch: one join, vectorized."""
    counts = (inp.rows.group_by("k").agg(pl.len().cast(pl.Int64).alias("new"))
              .join(inp.state, on="k", how="left")
              .select("k", (pl.col("new") + pl.col("n").fill_null(0)).alias("n")))
    return mb.StateOutput(rows=counts, upserts=counts)


def build(kind: str, src: mb.Stream) -> mb.Stream:
    if kind == "transform_with_state":
        return src.group_by("k").transform_with_state(
            running_count, state_schema={"n": pl.Int64}, output_schema={"k": pl.Int64,
                                                                        "n": pl.Int64})
    return src.group_by("k").agg(pl.len().alias("n"))


def batches(size: int, reps: int, rng: np.random.Generator) -> tuple[list[pl.DataFrame],
                                                                     list[pl.DataFrame]]:
    """The load batches (every key once) and the measured batches (live keys)."""
    load = [pl.DataFrame({"k": np.arange(a, min(a + BATCH, size), dtype=np.int64),
                          "v": np.ones(min(BATCH, size - a), dtype=np.int64)})
            for a in range(0, size, BATCH)]
    measured = []
    for _ in range(reps):
        keys = rng.choice(size, TOUCHED, replace=False).astype(np.int64)
        measured.append(pl.DataFrame({"k": rng.permutation(np.repeat(keys, BATCH // TOUCHED)),
                                      "v": np.ones(BATCH, dtype=np.int64)}))
    return load, measured


def run(kind: str, size: int, reps: int, directory: Path) -> dict[str, object]:
    load, measured = batches(size, reps, np.random.default_rng(size))
    src = mb.read_memory(schema=SCHEMA, max_records_per_batch=BATCH)
    name = f"bench_{kind}_{size}"
    query = build(kind, src).write_memory(name, output_mode="update").start(
        directory, trigger="0s")
    try:
        for frame in load:
            src.add(frame)
        query.process_all_available(3600)
        loaded = len(query.recent_progress)
        totals, states = [], []
        for frame in measured:
            src.add(frame)
            query.process_all_available(600)
            last = query.last_progress
            assert last is not None
            totals.append(last["duration_ms"]["total"])
            states.append(last)
        mb.table(name)  # the sink kept every batch: drop it with the query
    finally:
        query.stop()
    last = states[-1]
    op = next(iter(last["state"].values()))
    median_ms = median(totals)
    return {
        "operator": kind,
        "live keys": last["state_rows"],
        "keys/batch": TOUCHED,
        "load batches": loaded,
        "median ms/batch": median_ms,
        "max ms/batch": max(totals),
        "rows/s": rate(BATCH, median_ms / 1000),
        "bytes/key": op["bytes"] / max(last["state_rows"], 1),
    }


def one_shot(reps: int) -> float:
    """Rows/s of one ``group_by(k).agg(len)`` over every measured row at once."""
    rng = np.random.default_rng(0)
    df = pl.DataFrame({"k": rng.integers(0, 10_000_000, BATCH * reps, dtype=np.int64),
                       "v": np.ones(BATCH * reps, dtype=np.int64)})
    best = min(repeat(lambda: collect(df.lazy().group_by("k").agg(pl.len())), 3))
    return rate(df.height, best)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,10000000")
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        for kind in ("transform_with_state", "group_by.agg"):
            with tempfile.TemporaryDirectory() as tmp:
                rows.append(run(kind, size, args.reps, Path(tmp)))
            print(f"done {kind} at {size:,} keys", file=sys.stderr, flush=True)
    limit = one_shot(args.reps)
    table = pl.DataFrame(rows)
    smallest = table.group_by("operator").agg(pl.col("median ms/batch").first().alias("base"))
    agg = table.filter(pl.col("operator") == "group_by.agg").select(
        "live keys", pl.col("median ms/batch").alias("agg ms"))
    table = (table.join(smallest, on="operator").join(agg, on="live keys")
             .with_columns((pl.col("median ms/batch") / pl.col("base")).alias("x smallest state"),
                           (pl.col("median ms/batch") / pl.col("agg ms")).alias("x group_by"),
                           (pl.col("rows/s") / limit).alias("x one-shot polars"))
             .drop("base", "agg ms"))
    print("\n".join(dict_table([{k: f"{v:,.2f}" if isinstance(v, float) else v
                                  for k, v in row.items()} for row in table.to_dicts()])))
    print(f"one-shot polars group_by: {limit:,.0f} rows/s ({args.reps} x {BATCH:,} rows)")


if __name__ == "__main__":
    main()
