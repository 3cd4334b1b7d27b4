"""The on-disk (LMDB) state backend against the in-memory store.

Two measurements (``make bench-disk-state``; ``ARGS=...`` passes options):

1. **Per-batch cost at N live keys** (``--keys``, default 10M) on both backends:
   a window-aggregate batch of ``--batch`` rows (default 100k; half of its keys
   already in the state, half new): ``lookup`` + ``upsert(keys_from_lookup)`` +
   ``commit`` (the changelog file; the LMDB transaction on disk). Median and max
   ms over ``--reps`` batches, the process's RSS, the state's bytes in memory
   (``metrics["bytes"]``) and on disk.
2. **Growth toward ``--grow-to`` keys** (default 100M) on the disk backend in a
   child process whose RSS is sampled: batches of ``--grow-batch`` new keys
   (default 1M) committed one after another until the key count or
   ``--time-limit`` seconds; the table reports keys, per-batch ms and RSS (anon:
   the process's own memory, file: LMDB pages mapped, reclaimable by the
   kernel) every tenth of the way, and the projected time to the target.

Keys are ``window_start`` (Datetime) + ``card_id`` (Int64), values ``n`` (Int64)
and ``amount_sum`` (Float64), as in ``bench_statestore.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from benchmarks.harness import dict_table, median
from statestore.backends import make_provider

KEYS = {"window_start": pl.Datetime("ms", "UTC"), "card_id": pl.Int64}
VALUES = {"n": pl.Int64, "amount_sum": pl.Float64}
WINDOW_MS = 60_000
LOAD_CHUNK = 1_000_000


def rss() -> dict[str, int]:
    """The process's resident memory in bytes: total, anonymous, file-backed."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        for name, key in (("VmRSS", "rss"), ("RssAnon", "anon"), ("RssFile", "file")):
            if line.startswith(name + ":"):
                out[key] = int(line.split()[1]) * 1024
    return out


def rows(cards: np.ndarray, rng: np.random.Generator, windows: Any = 0) -> pl.DataFrame:
    w = np.broadcast_to(np.asarray(windows, dtype=np.int64) * WINDOW_MS, cards.shape)
    return pl.DataFrame({
        "window_start": pl.Series(np.ascontiguousarray(w)).cast(pl.Datetime("ms", "UTC")),
        "card_id": cards,
        "n": np.ones(len(cards), dtype=np.int64),
        "amount_sum": rng.random(len(cards)) * 100,
    })


def provider(backend: str, directory: Path) -> Any:
    # the snapshot policy of the engine's default: amortized, so no batch pays O(state)
    return make_provider(directory, KEYS, VALUES, backend=backend, time_column="window_start")


PER_WINDOW = 100_000
"""Preloaded keys per window (as ``bench_statestore.py``)."""


def preload(prov: Any, keys: int, rng: np.random.Generator) -> int:
    """``keys`` live keys: windows 0, 1, ... of PER_WINDOW cards each."""
    version = 0
    for lo in range(0, keys, LOAD_CHUNK):
        ids = np.arange(lo, min(keys, lo + LOAD_CHUNK), dtype=np.int64)
        store = prov.load(version)
        store.upsert(rows(ids % PER_WINDOW, rng, ids // PER_WINDOW))
        version = store.commit()
    return version


def per_batch(
    backend: str, keys: int, batch: int, reps: int, root: Path, *, pattern: str = "windowed"
) -> dict[str, Any]:
    """``pattern="windowed"``: half the batch updates keys of the newest window, half
    are new keys of the next (a window aggregate's batch); ``"random"``: half updates
    keys drawn from the whole state (no locality: the worst case of a B-tree)."""
    directory = root / backend
    rng = np.random.default_rng(7)
    prov = provider(backend, directory)
    t0 = time.perf_counter()
    version = preload(prov, keys, rng)
    load_s = time.perf_counter() - t0
    if backend != "memory":  # a fresh process: the database is cold, nothing in memory
        prov.close()
        prov = provider(backend, directory)
    times, lookups, upserts, commits = [], [], [], []
    window = (keys - 1) // PER_WINDOW  # the newest window
    fresh = keys
    for _ in range(reps):
        half = batch // 2
        if pattern == "random":
            ids = np.unique(np.concatenate([rng.integers(0, fresh, half),
                                            np.arange(fresh, fresh + half)]))
            fresh += half
            cards, wins = ids % PER_WINDOW, ids // PER_WINDOW
        else:
            cards = np.concatenate([rng.choice(PER_WINDOW, half, replace=False),
                                    np.arange(half, dtype=np.int64)])
            wins = np.repeat([window, window + 1], [half, half])
            window += 1
        t = time.perf_counter()
        store = prov.load(version)
        found = store.lookup(rows(cards, rng, wins).select(list(KEYS)))
        t1 = time.perf_counter()
        merged = found.with_columns(
            (pl.col("n").fill_null(0) + 1).alias("n"),
            (pl.col("amount_sum").fill_null(0.0) + 1.5).alias("amount_sum"),
        ).drop("__found")
        store.upsert(merged, keys_from_lookup=True)
        t2 = time.perf_counter()
        version = store.commit()
        t3 = time.perf_counter()
        times.append(t3 - t)
        lookups.append(t1 - t)
        upserts.append(t2 - t1)
        commits.append(t3 - t2)
    metrics = store.metrics
    disk = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    if backend != "memory":
        prov.close()
    mem = rss()
    return {
        "backend": backend, "keys": f"{keys:,}", "batch": f"{batch:,}", "pattern": pattern,
        "preload s": round(load_s, 1),
        "batch ms (median)": round(median(times) * 1000, 1),
        "batch ms (max)": round(max(times) * 1000, 1),
        "lookup ms": round(median(lookups) * 1000, 1),
        "upsert ms": round(median(upserts) * 1000, 1),
        "commit ms": round(median(commits) * 1000, 1),
        "state bytes in memory": f"{int(metrics.get('bytes', 0)):,}",
        "state on disk MiB": round(disk / 2**20),
        "process RSS MiB": round(mem["rss"] / 2**20),
    }


def grow(target: int, chunk: int, limit_s: float, directory: Path) -> list[dict[str, Any]]:
    """Run in a child process: insert ``chunk`` new keys per batch until ``target``."""
    rng = np.random.default_rng(11)
    prov = provider("lmdb", directory)
    version, keys, out = 0, 0, []
    started = time.perf_counter()
    step = max(target // 10, chunk)
    next_report = chunk
    while keys < target and time.perf_counter() - started < limit_s:
        t = time.perf_counter()
        store = prov.load(version)
        cards = np.arange(chunk, dtype=np.int64)
        rng.shuffle(cards)  # a new window's keys, in random order as real traffic
        found = store.lookup(rows(cards, rng, keys // chunk).select(list(KEYS)))
        store.upsert(found.with_columns(pl.lit(1, pl.Int64).alias("n"),
                                        pl.lit(1.0).alias("amount_sum")).drop("__found"),
                     keys_from_lookup=True)
        version = store.commit()
        keys += chunk
        batch_ms = (time.perf_counter() - t) * 1000
        if keys >= next_report or keys >= target:
            mem = rss()
            out.append({"keys": keys, "batch ms": round(batch_ms), "elapsed s":
                        round(time.perf_counter() - started), "rss MiB": mem["rss"] >> 20,
                        "anon MiB": mem["anon"] >> 20, "file MiB": mem["file"] >> 20,
                        "db GiB": round(store.metrics["disk_bytes"] / 2**30, 2)})
            next_report = keys + step
    prov.close()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--grow-to", type=int, default=100_000_000)
    parser.add_argument("--grow-batch", type=int, default=1_000_000)
    parser.add_argument("--time-limit", type=float, default=900)
    parser.add_argument("--pattern", choices=["windowed", "random"], default="windowed")
    parser.add_argument("--skip-compare", action="store_true")
    parser.add_argument("--skip-grow", action="store_true")
    parser.add_argument("--dir", type=Path, default=None, help="where the state goes (a disk)")
    parser.add_argument("--child-grow", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_grow is not None:
        print(json.dumps(grow(args.grow_to, args.grow_batch, args.time_limit, args.child_grow)))
        return
    root = Path(tempfile.mkdtemp(prefix="bench-disk-state-", dir=args.dir))
    try:
        if not args.skip_compare:
            table = []
            for backend in ("memory", "lmdb"):
                # each backend in its own process: RSS is the backend's alone
                table.append(_child_compare(backend, args, root))
                shutil.rmtree(root / backend, ignore_errors=True)
            print("\n".join(dict_table(table)))
        if not args.skip_grow:
            cmd = [sys.executable, "-m", "benchmarks.bench_disk_state", "--child-grow",
                   str(root / "grow"), "--grow-to", str(args.grow_to), "--grow-batch",
                   str(args.grow_batch), "--time-limit", str(args.time_limit)]
            done = subprocess.run(cmd, check=True, capture_output=True, text=True)
            points = json.loads(done.stdout.strip().splitlines()[-1])
            print("\n".join(dict_table(points)))
            last = points[-1]
            if last["keys"] < args.grow_to:
                rate = last["keys"] / max(last["elapsed s"], 1)
                print(f"stopped at {last['keys']:,} keys after {last['elapsed s']} s "
                      f"(--time-limit); at {rate:,.0f} keys/s the {args.grow_to:,} keys take "
                      f"~{args.grow_to / rate / 60:.0f} min (a lower bound: batches slow "
                      "down as the database outgrows the page cache)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _child_compare(backend: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    code = (
        "import json, sys; from pathlib import Path; "
        "from benchmarks.bench_disk_state import per_batch; "
        f"print(json.dumps(per_batch({backend!r}, {args.keys}, {args.batch}, {args.reps}, "
        f"Path({str(root)!r}), pattern={args.pattern!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True, env={**os.environ})
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    main()
