"""Where this engine's time goes on one compared workload.

``python -m benchmarks.compare_profile WORKLOAD [--quick] [--step STEP] [--top N]``

Runs the engine's query of ``WORKLOAD`` (see :mod:`benchmarks.compare_engines`)
into a Parquet sink once, prints each lifecycle step's total and median from
``query.recent_progress``, then a cProfile of one step (``execute`` by
default; ``all`` profiles the whole batch) accumulated over every batch,
sorted by own time and by cumulative time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import polars as pl

from benchmarks.compare_engines import DELAY_S, Q4_THRESHOLD, WORKLOADS, _oneshot_case
from benchmarks.measure import STEPS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare_profile")
    parser.add_argument("workload", choices=list(WORKLOADS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--step", default="execute",
                        choices=["all", "read", "execute", "write_sink", "commit"])
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)

    import microbatch as mb
    from benchmarks import data
    from microbatch.engine.execution import MicroBatchExecution
    from microbatch.sources.generator import GENERATOR_SCHEMA

    spec = WORKLOADS[args.workload]
    ds = spec.dataset(args.quick)
    data.ensure(ds)
    profiler = cProfile.Profile()
    method = {"all": "run_batch", "read": "read_inputs"}.get(args.step, args.step)
    original = getattr(MicroBatchExecution, method)

    def profiled(self: Any, *a: Any, **kw: Any) -> Any:
        profiler.enable()
        try:
            return original(self, *a, **kw)
        finally:
            profiler.disable()

    setattr(MicroBatchExecution, method, profiled)
    src = mb.read_files(ds.path, max_files_per_batch=spec.files_per_batch,
                        schema=GENERATOR_SCHEMA)
    if spec.query == "q4":
        stream = src.filter(pl.col("amount") > Q4_THRESHOLD)
    else:
        stream = (src.with_watermark("event_time", f"{DELAY_S}s")
                  .group_by(_oneshot_case(spec).window(), "card_id")
                  .agg(pl.len().alias("n"), pl.col("amount").sum().alias("amount")))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        query = stream.write_parquet(Path(tmp) / "out").start(
            str(Path(tmp) / "chk"), trigger="available-now", retention=ds.files + 100)
        query.await_termination()
        wall = time.perf_counter() - t0
        progress = query.recent_progress
    rows = sum(int(p["input_rows"]) for p in progress)
    print(f"{spec.name} ({'quick' if args.quick else 'full'}): {rows:,} rows, "
          f"{len(progress)} batches, wall {wall:.2f} s ({rows / wall:,.0f} events/s; "
          f"profiler on: slower than unprofiled)\n")
    print(f"{'step':12} {'total ms':>10} {'median ms':>10} {'share':>6}")
    for step in (*STEPS, "total"):
        values = [float(p["duration_ms"].get(step, 0.0)) for p in progress]
        print(f"{step:12} {sum(values):10.0f} {statistics.median(values):10.2f} "
              f"{sum(values) / (wall * 1000):6.0%}")
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).strip_dirs().sort_stats(key).print_stats(args.top)
        print(f"\n--- cProfile of {method}, sorted by {key} ---")
        print("\n".join(out.getvalue().splitlines()[4:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
