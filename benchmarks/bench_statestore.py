"""State store benchmark: does a batch cost follow the batch's size, not the state's?

For each state size (live keys preloaded, keys ``window_start, card_id``):

- **lookup+upsert**: a 100k-row batch, half of its keys updated (they were in
  the previous batch), half new, like a window aggregate's batch: ``lookup``
  the keys, compute the new aggregates, ``upsert`` them. Median ms.
- **delete 50k**: the previous batch's keys that the new batch did not touch
  (keeps the live size steady).
- **commit**: writing the version's changelog (median; snapshots are
  amortized and show in the max).
- **polars rewrite**: the naive alternative, the one-shot Polars update of
  the whole state table with the batch (anti-join + concat): O(state).
- **pop_expired**: removing one closed window (100k rows, or the whole state
  when smaller). Median ms.
- **bytes/row**: ``metrics["bytes_per_row"]`` (all arrays incl. spare capacity).

Run: ``.venv/bin/python benchmarks/bench_statestore.py [--sizes 10000,1000000,10000000]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from benchmarks.harness import dict_table, median
from statestore import StateStoreProvider

KEYS = {"window_start": pl.Datetime("ms", "UTC"), "card_id": pl.Int64}
VALUES = {"n": pl.Int64, "amount_sum": pl.Float64}
BATCH = 100_000
WINDOW_MS = 60_000
PER_WINDOW = 100_000  # preloaded keys per window


def frame(window: np.ndarray | int, cards: np.ndarray, rng: np.random.Generator) -> pl.DataFrame:
    w = np.broadcast_to(np.asarray(window, dtype=np.int64) * WINDOW_MS, cards.shape)
    return pl.DataFrame(
        {
            "window_start": pl.Series(w).cast(pl.Datetime("ms", "UTC")),
            "card_id": cards,
            "n": np.ones(len(cards), dtype=np.int64),
            "amount_sum": rng.random(len(cards)) * 100,
        }
    )


def ms(seconds: float) -> float:
    return seconds * 1000


def bench(size: int, reps: int, directory: Path) -> dict[str, object]:
    rng = np.random.default_rng(size)
    provider = StateStoreProvider(directory, KEYS, VALUES, time_column="window_start")
    store = provider.load(0)
    cards = np.arange(size, dtype=np.int64)
    store.upsert(frame(cards // PER_WINDOW, cards, rng))
    store.commit()
    windows = int(cards[-1] // PER_WINDOW) + 1
    current = windows + 10  # the open window the batches aggregate into
    state = store.to_frame()  # the naive alternative's table
    upsert_ms, delete_ms, commit_ms, naive_ms, live_before = [], [], [], [], []
    base = 10**12  # card ids of the open window, disjoint from the preloaded ones
    previous: np.ndarray | None = None
    for i in range(reps + 2):  # two warm-up batches
        store = provider.load(store.version)
        batch_cards = base + np.arange(i * BATCH // 2, i * BATCH // 2 + BATCH, dtype=np.int64)
        batch = frame(current, batch_cards, rng)
        live_before.append(store.num_rows)
        t0 = time.perf_counter()
        old = store.lookup(batch.select(list(KEYS)))
        merged = batch.with_columns(
            n=pl.col("n") + old["n"].fill_null(0),
            amount_sum=pl.col("amount_sum") + old["amount_sum"].fill_null(0.0),
        )
        store.upsert(merged)
        t1 = time.perf_counter()
        if previous is not None:
            gone = previous[: BATCH // 2]
            store.delete(frame(current, gone, rng).select(list(KEYS)))
        t2 = time.perf_counter()
        store.commit()
        t3 = time.perf_counter()
        previous = batch_cards
        if i >= 2:
            upsert_ms.append(ms(t1 - t0))
            delete_ms.append(ms(t2 - t1))
            commit_ms.append(ms(t3 - t2))
        if i >= 2 and i < 5:
            t4 = time.perf_counter()
            keys = list(KEYS)
            state = pl.concat([state.join(merged, on=keys, how="anti"), merged])
            naive_ms.append(ms(time.perf_counter() - t4))
    metrics = store.metrics
    pop_ms, popped = [], []
    for w in range(min(windows, 5)):
        store = provider.load(store.version)
        t0 = time.perf_counter()
        out = store.pop_expired(w * WINDOW_MS)
        pop_ms.append(ms(time.perf_counter() - t0))
        popped.append(out.height)
        store.commit()
    return {
        "live keys": size,
        "live at batch": int(median(live_before)),
        "lookup+upsert ms": median(upsert_ms),
        "max ms": max(upsert_ms),
        "delete 50k ms": median(delete_ms),
        "commit ms": median(commit_ms),
        "commit max": max(commit_ms),
        "polars rewrite ms": median(naive_ms),
        "pop_expired ms": median(pop_ms),
        "popped rows": int(median(popped)),
        "bytes/row": metrics["bytes_per_row"],
        "probes/key": metrics["index_probes"] / (2 * BATCH),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,1000000,10000000")
    parser.add_argument("--reps", type=int, default=11)
    args = parser.parse_args()
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(bench(size, args.reps, Path(tmp)))
        print(f"done {size:,} keys", file=sys.stderr, flush=True)
    print("\n".join(dict_table([{k: f"{v:,.1f}" if isinstance(v, float) else v
                                  for k, v in row.items()} for row in rows])))
    base = rows[0]["lookup+upsert ms"]
    for row in rows:
        ratio = row["lookup+upsert ms"] / base
        print(f"{row['live keys']:>12,} keys: lookup+upsert {ratio:.2f}x the smallest state")


if __name__ == "__main__":
    main()
