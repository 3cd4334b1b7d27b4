"""Scale-out benchmark: what the Ray executor costs per batch, and a scaling model.

The workload is Q1 (a 10 s tumbling window per card: count and sum, 10k cards)
in batches of 1k, 100k and 1M rows. By default (``--source lake``) each batch
is ``FILES_PER_BATCH`` Parquet files and the output a Delta table (append):
on Ray the workers read their splits of the files and write the table's data
files, the driver plans, commits one Delta version per batch and keeps the
checkpoint (scale-out as it is meant to run: no row crosses the driver).
``--source memory`` is the in-memory source and sink (the driver reads and
receives every row). Each executor (local, Ray with 1, 2 and 4 workers, 2
shards per worker; ``ray-2-rows``: 2 workers without the map-side combiner)
runs ``--warm`` batches, then ``--reps`` measured ones; a batch's time is the
progress record's ``duration_ms`` (plan to commit). The one-shot Polars limit
is the same ``group_by`` over all the measured rows at once, in memory.
``--nodes N`` runs the Ray executors on an N-node cluster on this machine
(``ray start --head`` + ``ray start --address``, the cores split between
nodes: pieces between workers on different nodes travel over TCP).

Per-batch overhead of Ray = Ray's median minus local's, and where it goes:
``exchange`` is the driver's wall time of the batch's one exchange (map,
reduce and the shards' state commit, launched at once), ``busy`` the busiest
worker's own compute time in it, ``barrier`` the difference (dispatch,
transfer, serialization, waiting for the slowest slice). ``exchanged`` is
what crossed between workers with the map-side combiner, and without it
(``ray-2-rows``: ``RayExecutor(combine=False)``).

The scaling model (printed last) extrapolates from the 1-worker records
(the only run that is not contended on 2 cores): a batch costs ``driver``
(plan, write-ahead, read, sink, commit log; serial) + ``barrier(1)`` (the
phases' wall time beyond the worker's compute: dispatch, Arrow transfer,
slicing and gathering on the driver) + ``c * (W - 1)`` (the one
round trip pays ``c`` more per worker, ``c`` measured here on trivial calls)
+ ``work / W`` (the worker's compute of map, reduce and state commit, assumed
to split evenly: no key skew, shards >= W, one worker per core, a network as
fast as loopback for the rows exchanged).

With ``--source files`` the batches are Parquet files instead (``FILES_PER_BATCH``
per batch, read with a declared schema), and the table compares who reads
them on 2 workers: the driver (``RayExecutor(worker_reads=False)``: it reads,
slices and ships every row) or the workers (each reads its own split of the
batch's files; the driver only plans the splits). ``driver CPU/batch`` is the
driver process's CPU time per batch (its read-ahead thread included: with a
backlog the driver reads the next batch in the background, so its step 3
"driver read" is near 0 either way); ``driver`` is the batch's wall time
outside the workers' phases (plan, write-ahead, read, sink, commit log).

Run: ``.venv/bin/python -m benchmarks.bench_scale_out [--reps 5] [--source files]``
(``make bench-scale-out``; needs ``microbatch[ray]``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import tempfile
import time
from typing import Any

import numpy as np
import polars as pl

import microbatch as mb
from benchmarks.harness import markdown_row, markdown_table, median, rate, ratio, repeat
from microbatch.frames import collect

CARDS = 10_000
SIZES = (1_000, 100_000, 1_000_000)
EXECUTORS = ("local", "ray-1", "ray-2", "ray-2-rows", "ray-4")
SCHEMA = {"card_id": pl.Int64, "event_time": pl.Datetime("ms", "UTC"), "amount": pl.Float64}


def batches(rows: int, count: int, seed: int) -> list[pl.DataFrame]:
    """``count`` batches of ``rows`` payments, event time moving 1 s per 1k rows."""
    rng = np.random.default_rng(seed)
    out = []
    t0 = 1_767_225_600_000
    for b in range(count):
        base = t0 + b * rows  # 1 ms per row: windows close as batches go by
        out.append(pl.DataFrame({
            "card_id": rng.integers(0, CARDS, rows, dtype=np.int64),
            "event_time": (base + np.arange(rows, dtype=np.int64)),
            "amount": np.round(rng.random(rows) * 100, 2),
        }).with_columns(pl.col("event_time").cast(pl.Datetime("ms", "UTC"))))
    return out


def query(src: mb.Stream) -> mb.Stream:
    return (src.with_watermark("event_time", "1s")
            .group_by(mb.window("event_time", "10s"), "card_id")
            .agg(pl.len().alias("n"), pl.col("amount").sum().alias("total")))


def run(executor: str, frames: list[pl.DataFrame], warm: int) -> list[dict[str, Any]]:
    """The progress records of the measured batches."""
    rows = frames[0].height
    src = mb.read_memory(schema=SCHEMA, max_records_per_batch=rows)
    workers = 0 if executor == "local" else int(executor.split("-")[1])
    ex = None if executor == "local" else mb.RayExecutor(
        workers=workers, shards=2 * workers, combine=not executor.endswith("-rows"))
    name = f"scale_{executor}_{rows}_{time.monotonic_ns()}"
    q = query(src).write_memory(name).start(tempfile.mkdtemp(prefix="mb-scale-"),
                                            trigger="0s", executor=ex)
    try:
        for frame in frames:
            src.add(frame)
            q.process_all_available(600)
        records = [r for r in q.recent_progress if r["input_rows"] > 0]
    finally:
        q.stop()
    return records[warm:]


FILES_PER_BATCH = 4
FILE_EXECUTORS = ("local", "ray-2 driver reads", "ray-2 workers read")


def run_files(
    executor: str, frames: list[pl.DataFrame], warm: int
) -> tuple[list[dict[str, Any]], float]:
    """The progress records of the measured batches, each batch read from
    ``FILES_PER_BATCH`` Parquet files written beforehand, and the driver
    process's CPU time per batch (all its threads, the read-ahead's included;
    start and stop of the query spread over the batches)."""
    landing = write_landing(frames)
    src = mb.read_files(landing, format="parquet", schema=SCHEMA,
                        max_files_per_batch=FILES_PER_BATCH)
    ex = None if executor == "local" else mb.RayExecutor(
        workers=2, shards=4, worker_reads=executor.endswith("workers read"))
    name = f"scale_files_{time.monotonic_ns()}"
    cpu0 = time.process_time()
    q = query(src).write_memory(name).start(tempfile.mkdtemp(prefix="mb-scale-"),
                                            trigger="available-now", executor=ex)
    records = run_to_end(q)
    cpu_ms = (time.process_time() - cpu0) * 1000 / max(len(records), 1)
    return records[warm:], cpu_ms


def run_to_end(q: Any) -> list[dict[str, Any]]:
    """The progress records with input of an ``available-now`` query, once it
    ended (its failure raised)."""
    try:
        assert q.await_termination(3600)
        if q.exception is not None:
            raise q.exception
        return [r for r in q.recent_progress if r["input_rows"] > 0]
    finally:
        q.stop()


FILE_HEADER = ("rows/batch", "executor", "ms/batch", "driver CPU/batch", "driver read",
               "driver", "exchange (wall)",
               "workers read (busy)", "shipped by driver", "exchanged")


def files_main(args: argparse.Namespace) -> None:
    """Who reads a file source's batches on 2 workers: the driver or the workers."""
    print(f"## file source, {FILES_PER_BATCH} Parquet files per batch, 2 workers")
    print()
    print("\n".join(markdown_table(FILE_HEADER, [], align="rlrrrrrrrr")))
    for size in map(int, args.sizes.split(",")):
        frames = batches(size, args.warm + args.reps, seed=size)
        for executor in FILE_EXECUTORS:
            records, cpu_ms = run_files(executor, frames, args.warm)
            d = [r["duration_ms"] for r in records]
            ex = [r.get("executor") or {} for r in records]
            total = median([x["total"] for x in d])
            phases = [e.get("exchange_ms", 0) for e in ex]
            driver = median([x["total"] - p for x, p in zip(d, phases, strict=True)])
            read_busy = [sum(e.get("read_busy_ms", [])) for e in ex]
            print(markdown_row((
                f"{size:,}", executor, f"{total:.1f}", f"{cpu_ms:.1f}",
                f"{median([x.get('read', 0.0) for x in d]):.1f}", f"{driver:.1f}",
                f"{median([e.get('exchange_ms', 0.0) for e in ex]):.1f}" if any(ex) else "",
                f"{median(read_busy):.1f}" if any(read_busy) else "",
                f"{median([e.get('shipped_bytes', 0) / 1e6 for e in ex]):.1f} MB"
                if any(ex) else "",
                f"{median([e.get('exchanged_bytes', 0) / 1e6 for e in ex]):.1f} MB"
                if any(ex) else "")), flush=True)


LAKE_EXECUTORS = ("local", "ray-1", "ray-2", "ray-2-rows", "ray-4")


def write_landing(frames: list[pl.DataFrame]) -> str:
    """The batches as ``FILES_PER_BATCH`` Parquet files each, in batch order
    (modification times one ms apart: the file source admits them in order)."""
    landing = tempfile.mkdtemp(prefix="mb-scale-lake-")
    for b, frame in enumerate(frames):
        size = -(-frame.height // FILES_PER_BATCH)
        for f in range(FILES_PER_BATCH):
            path = os.path.join(landing, f"b{b:04d}-{f}.parquet")
            frame.slice(f * size, size).write_parquet(path)
            stamp = 1_700_000_000_000_000_000 + (b * FILES_PER_BATCH + f) * 10**6
            os.utime(path, ns=(stamp, stamp))
    return landing


def run_lake(executor: str, landing: str, warm: int, address: str | None
             ) -> list[dict[str, Any]]:
    """Q1 over the landing files into a new Delta table (append): the progress
    records of the measured batches. On Ray the workers read their splits of
    the files and write the table's data files; the driver plans, commits one
    Delta version per batch and writes the checkpoint."""
    src = mb.read_files(landing, format="parquet", schema=SCHEMA,
                        max_files_per_batch=FILES_PER_BATCH)
    ex = None
    if executor != "local":
        workers = int(executor.split("-")[1])
        ex = mb.RayExecutor(workers=workers, shards=2 * workers, address=address,
                            combine=not executor.endswith("-rows"))
    root = tempfile.mkdtemp(prefix="mb-scale-out-")
    q = query(src).write_delta(os.path.join(root, "q1")).start(
        os.path.join(root, "chk"), trigger="available-now", executor=ex)
    return run_to_end(q)[warm:]


def lake_main(args: argparse.Namespace, address: str | None, where: str) -> None:
    """The main table: per batch size and executor, the batch's cost and where
    it goes; then the scaling model."""
    import ray

    print(f"# scale-out: Q1 (10 s windows, {CARDS:,} cards) from {FILES_PER_BATCH} Parquet "
          f"files per batch into a Delta table (append); {platform.processor() or ''} "
          f"{os.cpu_count()} cores, Python {sys.version.split()[0]}, Polars {pl.__version__}, "
          f"Ray {ray.__version__}; Ray on {where}; medians of {args.reps} batches after "
          f"{args.warm} warm")
    print()
    print("\n".join(markdown_table(LAKE_HEADER, [], align="rlrrrrrrrrrrl")))
    model: dict[str, dict[str, float]] = {}
    for size in map(int, args.sizes.split(",")):
        frames = batches(size, args.warm + args.reps, seed=size)
        limit = one_shot_rows_per_s(frames[args.warm:])
        landing = write_landing(frames)
        local_ms = None
        for executor in args.executors.split(","):
            s = summarize(run_lake(executor, landing, args.warm, address))
            if executor == "local":
                local_ms = s["ms"]
            rows_per_s = rate(size, s["ms"] / 1000)
            ray_cells = (
                [f"{s['driver']:.1f}", f"{s['exchange']:.1f}", f"{s['barrier']:.1f}",
                 " / ".join(f"{b:.0f}" for b in s["per_worker"]),
                 f"{s['exchanged_mb'] * 1000:,.0f} kB", f"{s['skew']:.2f}"]
                if "exchange" in s else [f"{s['ms'] - s['execute']:.1f}", "", "", "", "", ""])
            print(markdown_row((
                f"{size:,}", executor, f"{s['ms']:.1f}", f"{rows_per_s:,.0f}",
                f"{(local_ms or s['ms']) / s['ms']:.2f}", f"{ratio(rows_per_s, limit):.3f}",
                f"{s['execute']:.1f}", *ray_cells, f"{s['sink']:.1f}")), flush=True)
            model[f"{size}:{executor}"] = s
    print()
    print_model(model, [int(x) for x in args.sizes.split(",")])


LAKE_HEADER = ("rows/batch", "executor", "ms/batch", "rows/s", "vs local", "vs one-shot",
               "execute", "driver", "exchange (wall)", "barrier", "workers busy (each)",
               "exchanged", "skew", "sink (commit)")


def one_shot_rows_per_s(frames: list[pl.DataFrame]) -> float:
    data = pl.concat(frames)
    lf = data.lazy().group_by(pl.col("event_time").dt.truncate("10s"), "card_id").agg(
        pl.len().alias("n"), pl.col("amount").sum().alias("total"))
    times = repeat(lambda: collect(lf), 3, warmup=1)
    return rate(data.height, min(times))


def summarize(records: list[dict[str, Any]]) -> dict[str, float]:
    d = [r["duration_ms"] for r in records]
    ex = [r.get("executor") or {} for r in records]
    out = {
        "ms": median([x["total"] for x in d]),
        "execute": median([x.get("execute", 0.0) for x in d]),
        "commit": median([x.get("commit", 0.0) for x in d]),
        "read": median([x.get("read", 0.0) for x in d]),
        "sink": median([x.get("sink", 0.0) for x in d]),
    }
    if any(ex):
        # the busiest worker (they run side by side) and all of them (the work that splits)
        per_worker = [[m + r + c for m, r, c in zip(e["map_busy_ms"], e["reduce_busy_ms"],
                                                     e["commit_busy_ms"], strict=True)]
                      for e in ex]
        out.update(
            exchange=median([e["exchange_ms"] for e in ex]),
            driver=median([x["total"] - e["exchange_ms"] for x, e in zip(d, ex, strict=True)]),
            per_worker=[median([w[i] for w in per_worker]) for i in range(len(per_worker[0]))],
            barrier=median([e["barrier_ms"] for e in ex]),
            busy=median([max(w) for w in per_worker]),
            work=median([sum(w) for w in per_worker]),
            wcommit=median([max(e["commit_busy_ms"]) for e in ex]),
            exchanged_mb=median([e.get("exchanged_bytes", 0) / 1e6 for e in ex]),
            skew=median([e.get("skew") or 0.0 for e in ex]),
        )
    return out


HEADER = ("rows/batch", "executor", "ms/batch", "rows/s", "vs local", "vs one-shot", "execute",
          "Ray overhead", "exchange (wall)", "busiest worker", "barrier", "exchanged", "skew")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warm", type=int, default=2)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--source", choices=("lake", "memory", "files"), default="lake",
                        help="lake (default): Parquet files into Delta, read and written by "
                        "the workers; memory: in-memory source and sink (the driver reads "
                        "and writes); files: who reads a file source, the driver or the "
                        "workers")
    parser.add_argument("--executors", default=None,
                        help=f"comma-separated (default {','.join(LAKE_EXECUTORS)})")
    parser.add_argument("--nodes", type=int, default=1,
                        help="Ray nodes (raylets) on this machine, the cores split between "
                        "them (ray start --head + ray start --address)")
    args = parser.parse_args(argv)
    args.executors = args.executors or ",".join(
        LAKE_EXECUTORS if args.source == "lake" else EXECUTORS)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cores = os.cpu_count() or 1
    with contextlib.ExitStack() as stack:
        address = None
        where = "a local one-node cluster"
        if args.nodes > 1:
            from benchmarks.local_ray_cluster import local_cluster

            per_node = max(cores // args.nodes, 1)
            # NOTE: before ray is imported: it reads the cluster's auth token at import
            address = stack.enter_context(local_cluster(args.nodes, per_node))
            where = f"{args.nodes} nodes of {per_node} CPU on this machine ({address})"
        import ray

        if address is not None:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        else:
            ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        stack.callback(ray.shutdown)
        if args.source == "files":
            files_main(args)
        elif args.source == "lake":
            lake_main(args, address, where)
        else:
            memory_main(args)
    return 0


def memory_main(args: argparse.Namespace) -> None:
    """The in-memory pipeline: the driver reads every row and receives every
    output row (what the executor costs on its own)."""
    import ray

    print(f"# scale-out: Q1 (10 s windows, {CARDS:,} cards), in-memory source and sink; "
          f"{platform.processor() or ''} {os.cpu_count()} cores, Python "
          f"{sys.version.split()[0]}, Polars {pl.__version__}, Ray {ray.__version__}; "
          f"medians of {args.reps} batches after {args.warm} warm")
    print()
    print("\n".join(markdown_table(HEADER, [], align="rlrrrrrrrrrr")))
    model: dict[str, dict[str, float]] = {}
    for size in map(int, args.sizes.split(",")):
        count = args.warm + args.reps
        frames = batches(size, count, seed=size)
        limit = one_shot_rows_per_s(frames[args.warm:])
        local_ms = None
        for executor in args.executors.split(","):
            s = summarize(run(executor, frames, args.warm))
            if executor == "local":
                local_ms = s["ms"]
            rows_per_s = rate(size, s["ms"] / 1000)
            over = "" if local_ms is None or executor == "local" else f"{s['ms'] - local_ms:+.1f}"
            cell = {k: f"{s[k]:.1f}" if k in s else "" for k in ("exchange", "busy", "barrier")}
            moved = f"{s['exchanged_mb'] * 1000:,.0f} kB" if "exchanged_mb" in s else ""
            print(markdown_row((
                f"{size:,}", executor, f"{s['ms']:.1f}", f"{rows_per_s:,.0f}",
                f"{(local_ms or s['ms']) / s['ms']:.2f}", f"{ratio(rows_per_s, limit):.3f}",
                f"{s['execute']:.1f}", over, cell["exchange"], cell["busy"], cell["barrier"],
                moved, f"{s['skew']:.2f}" if "skew" in s else "")),
                flush=True)
            model[f"{size}:{executor}"] = s
    print()
    print_model(model, [int(x) for x in args.sizes.split(",")])


def fan_out_ms_per_worker() -> float:
    """The driver's cost of one more worker in one round trip (a trivial call on
    1 vs 4 actors, median of 200): what each phase pays per worker."""
    import ray

    @ray.remote(num_cpus=0)
    class Echo:
        def ping(self) -> int:
            return 0

    actors = [Echo.remote() for _ in range(4)]
    ray.get([a.ping.remote() for a in actors])

    def round_trip_ms(n: int) -> float:
        return median(repeat(lambda: ray.get([a.ping.remote() for a in actors[:n]]), 200)) * 1000

    one, four = round_trip_ms(1), round_trip_ms(4)
    for actor in actors:
        ray.kill(actor)
    return max((four - one) / 3, 0.0)


PHASES = 1
"""Round trips per batch: one exchange (map, reduce and state commit at once)."""


def print_model(model: dict[str, dict[str, float]], sizes: list[int]) -> None:
    """Extrapolate a batch's time to W workers on W cores (see module docstring)."""
    c = fan_out_ms_per_worker()
    print("## scaling model (from the 1-worker progress records above)")
    print()
    print(f"T(W) = driver + barrier(1) + {PHASES}·c·(W-1) + work / W, with c = {c:.2f} ms "
          "(one more worker in one round trip, measured here); efficiency "
          "E(W) = T(1) / (W·T(W))")
    print()
    rows = []
    for size in sizes:
        one = model.get(f"{size}:ray-1")
        if one is None:
            continue
        # NOTE: one worker runs uncontended: its busy time is the work that splits; the
        # exchange's wall time beyond it is the barrier (dispatch, Arrow transfer, waiting);
        # the rest of the batch is the driver's own steps (plan, write-ahead, split
        # planning, the sink's commit, the commit log)
        driver, work, barrier1 = one["driver"], one["work"], one["barrier"]
        t1 = driver + barrier1 + work
        cells = []
        for cores in (4, 16, 64):
            t = driver + barrier1 + PHASES * c * (cores - 1) + work / cores
            cells.append(f"{size / (t / 1000):,.0f} rows/s, E = {t1 / (cores * t):.2f}")
        at64 = {"driver": driver, "barrier": barrier1 + PHASES * c * 63, "work": work / 64}
        limit = max(at64, key=lambda k: at64[k])
        rows.append((f"{size:,}", f"{driver:.1f} ms", f"{barrier1:.1f} ms", f"{work:.1f} ms",
                     *cells, limit))
    print("\n".join(markdown_table(
        ("rows/batch", "driver (serial)", "barrier(1)", "work (1 worker)", "4 cores",
         "16 cores", "64 cores", "limit at 64"), rows, align="rrrrrrrl")))


if __name__ == "__main__":
    raise SystemExit(main())
