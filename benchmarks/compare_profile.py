"""Where this engine's time goes on one compared workload, in the warm run.

``python -m benchmarks.compare_profile WORKLOAD [--quick] [--data DIR] [--cold]
[--step STEP] [--top N]``

Runs the engine's query of ``WORKLOAD`` (see :mod:`benchmarks.compare_engines`)
into a Parquet sink twice in this process, as the comparison does: a cold run
(unprofiled, it pays the imports and first calls) and the same again, warm,
profiled. Prints each lifecycle step's total and median from the warm run's
``query.recent_progress``, then a cProfile of one step (``execute`` by
default; ``all`` profiles the whole batch) accumulated over its batches,
sorted by own time and by cumulative time. ``--cold`` profiles the first run
instead (and runs only that one); ``--data DIR`` reads the events from
``DIR`` as ``python -m benchmarks.compare --data DIR`` does.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import pstats
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.compare_engines import WORKLOADS, Spec, microbatch_stream
from benchmarks.harness import markdown_table, median
from benchmarks.measure import STEPS


def run_query(spec: Spec, quick: bool, workdir: Path) -> tuple[float, list[dict[str, Any]]]:
    """One available-now run of this engine's query of ``spec`` into Parquet under
    ``workdir``: its wall seconds and progress records."""
    ds = spec.dataset(quick)
    t0 = time.perf_counter()
    query = microbatch_stream(spec, ds).write_parquet(workdir / "out").start(
        str(workdir / "chk"), trigger="available-now", retention=ds.files + 100)
    query.await_termination()
    return time.perf_counter() - t0, query.recent_progress


@contextmanager
def profiling(step: str) -> Iterator[cProfile.Profile]:
    """Profile every call of the engine's ``step`` (``all``: the whole batch) while open."""
    from microbatch.engine.execution import MicroBatchExecution

    profiler = cProfile.Profile()
    method = {"all": "run_batch", "read": "read_inputs"}.get(step, step)
    original = getattr(MicroBatchExecution, method)

    def profiled(self: Any, *a: Any, **kw: Any) -> Any:
        profiler.enable()
        try:
            return original(self, *a, **kw)
        finally:
            profiler.disable()

    setattr(MicroBatchExecution, method, profiled)
    try:
        yield profiler
    finally:
        setattr(MicroBatchExecution, method, original)


def print_steps(progress: list[dict[str, Any]], wall: float) -> None:
    """Each lifecycle step's total, median per batch and share of the wall clock."""
    rows = []
    for step in (*STEPS, "total"):
        values = [float(p["duration_ms"].get(step, 0.0)) for p in progress]
        rows.append((step, f"{sum(values):.0f}", f"{median(values):.2f}",
                     f"{sum(values) / (wall * 1000):.0%}"))
    print("\n".join(markdown_table(("step", "total ms", "median ms", "share"), rows,
                                   align="lrrr")))


def print_profile(profiler: cProfile.Profile, step: str, top: int) -> None:
    """The ``top`` functions by own time, then by cumulative time."""
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).strip_dirs().sort_stats(key).print_stats(top)
        print(f"\n--- cProfile of {step}, sorted by {key} ---")
        print("\n".join(out.getvalue().splitlines()[4:]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare_profile")
    parser.add_argument("workload", choices=list(WORKLOADS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--data", type=Path, metavar="DIR",
                        help="read the events from DIR's Parquet files (name order)")
    parser.add_argument("--cold", action="store_true",
                        help="profile the first run in this process instead of the warm one")
    parser.add_argument("--step", default="execute",
                        choices=["all", "read", "execute", "write_sink", "commit"])
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)

    from benchmarks import data

    spec = WORKLOADS[args.workload]
    if args.data is not None:
        spec = dataclasses.replace(spec, data_dir=args.data)
    data.ensure(spec.dataset(args.quick))
    phase = "cold" if args.cold else "warm"
    with tempfile.TemporaryDirectory() as tmp:
        if not args.cold:
            cold_wall, _ = run_query(spec, args.quick, Path(tmp) / "cold")
            print(f"cold run (not profiled): {cold_wall:.2f} s")
        with profiling(args.step) as profiler:
            wall, progress = run_query(spec, args.quick, Path(tmp) / phase)
    rows = sum(int(p["input_rows"]) for p in progress)
    print(f"{spec.name} ({'quick' if args.quick else 'full'}), {phase} run: {rows:,} rows, "
          f"{len(progress)} batches, wall {wall:.2f} s ({rows / wall:,.0f} events/s; "
          f"profiler on: slower than unprofiled)\n")
    print_steps(progress, wall)
    print_profile(profiler, args.step, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
