"""Worker-written sink files: the driver's time per batch with and without them.

A windowed count and sum per key where every row is its own key, so a batch
emits about as many output rows as it reads (100k, 1M), into a local Delta
table, on ``RayExecutor(workers=2)``. ``driver-writes``: the workers return
their output rows and the driver writes the table (the sink's
``distributed_writer`` switched off); ``worker-writes``: the workers write the
data files and return their descriptions, the driver commits one version.

Reported per batch (medians of the measured batches): the batch's wall time
(plan to commit) of the batches that emit rows (the no-data batch after each
input batch, when the watermark moved), the driver's sink step (its Delta write or commit), the
execute step (the workers' map and reduce as the driver waits for them, the
write now inside reduce), the output bytes sent back to the driver, and the
driver's own time = total - the workers' phases (map, reduce, state commit
wall time): what the driver spends itself per batch.

Run: ``.venv/bin/python -m benchmarks.bench_worker_writes [--sizes 100000,1000000]``
(needs ``microbatch[ray]``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

import microbatch as mb
from benchmarks.harness import markdown_table, median

SCHEMA = {"key": pl.Int64, "event_time": pl.Datetime("ms", "UTC"), "amount": pl.Float64}
SIZES = (100_000, 1_000_000)


def batches(rows: int, count: int, seed: int = 3) -> list[pl.DataFrame]:
    """``count`` batches of ``rows`` rows, each row its own key, 1 ms apart."""
    rng = np.random.default_rng(seed)
    t0 = 1_767_225_600_000
    return [
        pl.DataFrame({
            "key": np.arange(b * rows, (b + 1) * rows, dtype=np.int64),
            "event_time": t0 + b * rows + np.arange(rows, dtype=np.int64),
            "amount": np.round(rng.random(rows) * 100, 2),
        }).with_columns(pl.col("event_time").cast(pl.Datetime("ms", "UTC")))
        for b in range(count)
    ]


def run(frames: list[pl.DataFrame], *, workers_write: bool, warm: int) -> list[dict[str, Any]]:
    src = mb.read_memory(schema=SCHEMA, max_records_per_batch=frames[0].height)
    root = Path(tempfile.mkdtemp(prefix="mb-wwrites-"))
    writer = (src.with_watermark("event_time", "1s")
              .group_by(mb.window("event_time", "1s"), "key")
              .agg(pl.len().alias("n"), pl.col("amount").sum().alias("total"))
              .write_delta(root / "table"))
    if not workers_write:
        writer.sink.distributed_writer = lambda batch_id: None  # type: ignore[method-assign]
    q = writer.start(root / "chk", trigger="0s", executor=mb.RayExecutor(workers=2, shards=4))
    try:
        for frame in frames:
            src.add(frame)
            q.process_all_available(900)
        records = [r for r in q.recent_progress if r["output_rows"] > 0]
    finally:
        q.stop()
    return records[warm:]


def summarize(records: list[dict[str, Any]]) -> dict[str, float]:
    d = [r["duration_ms"] for r in records]
    ex = [r.get("executor") or {} for r in records]
    phases = [e.get("exchange_ms", 0) for e in ex]
    return {
        "out_rows": median([r["output_rows"] for r in records]),
        "total": median([x["total"] for x in d]),
        "sink": median([x.get("sink", 0.0) for x in d]),
        "execute": median([x.get("execute", 0.0) for x in d]),
        "driver": median([x["total"] - p for x, p in zip(d, phases, strict=True)]),
        "bytes": median([e.get("output_bytes", 0) / 1e6 for e in ex]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--warm", type=int, default=1)
    args = parser.parse_args(argv)
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    rows_out = []
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            frames = batches(size, args.warm + args.reps + 1)
            for workers_write in (False, True):
                t0 = time.perf_counter()
                s = summarize(run(frames, workers_write=workers_write, warm=args.warm))
                label = "worker-writes" if workers_write else "driver-writes"
                rows_out.append([f"{size:,}", label, f"{s['out_rows']:,.0f}",
                                 f"{s['total']:.0f}", f"{s['driver']:.0f}", f"{s['sink']:.0f}",
                                 f"{s['execute']:.0f}", f"{s['bytes']:.1f} MB"])
                print(f"# {size} {label}: {time.perf_counter() - t0:.0f} s", flush=True)
    finally:
        ray.shutdown()
    print("\n".join(markdown_table(
        ["rows/batch", "sink data", "output rows", "ms/batch", "driver's own ms",
         "sink step ms", "execute ms", "output to driver"], rows_out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
