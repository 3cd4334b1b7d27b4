"""``python -m benchmarks.nexmark [--events N] [--queries q1,q2] [--engines ...]``
(``make bench-nexmark``).

Generates the Nexmark events once (:mod:`benchmarks.nexmark.generator`, cached
under ``benchmarks/.data``), then runs each query on each engine in a fresh
process, cold then warm in that process (:mod:`benchmarks.nexmark.worker`),
interleaved per query: this engine's Python API (``microbatch``) and SQL
(``microbatch-sql``), Spark Structured Streaming (``spark``, from the peers venv
``benchmarks/.venv-peers`` that ``make bench-peers`` builds; skipped with the
reason when it is missing), and the one-shot Polars computation (``polars``: the
limit and the oracle). Every output is checked against the oracle. Prints a
table, writes ``benchmarks/results/nexmark/nexmark.md``, ``.json`` and
``nexmark.png``.

Rates count every event of the run (persons, auctions and bids), as Nexmark's
do, whichever streams a query reads. Per core: events / CPU seconds of the
engine's process tree (user + system), Nexmark's "Throughput/Cores".
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import polars as pl

from benchmarks.harness import fmt_num, markdown_table, run_process
from benchmarks.measure import machine_info
from benchmarks.nexmark import published, spark
from benchmarks.nexmark.data import NexmarkDataset
from benchmarks.nexmark.generator import NexmarkConfig
from benchmarks.nexmark.queries import QUERIES
from benchmarks.nexmark.run import run_oracle, verdict

ENGINES = ("microbatch", "microbatch-sql", "spark", "polars")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DEFAULT_OUT = HERE.parent / "results" / "nexmark"
DEFAULT_PEERS = HERE.parent / ".venv-peers" / "bin" / "python"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.nexmark", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--events-per-file", type=int, default=200_000,
                        help="events per file and per batch (default 200,000: 5 batches)")
    parser.add_argument("--rate", type=int, default=NexmarkConfig.rate,
                        help="events per second of event time (reference suite: 10M)")
    parser.add_argument("--queries", default=",".join(QUERIES),
                        help=f"comma-separated, of {','.join(QUERIES)}")
    parser.add_argument("--engines", default=",".join(ENGINES),
                        help=f"comma-separated, of {','.join(ENGINES)}")
    parser.add_argument("--peers-python", type=Path, default=DEFAULT_PEERS,
                        help="the Python with PySpark (default: benchmarks/.venv-peers)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per process")
    args = parser.parse_args(argv)
    args.queries = [q.strip() for q in args.queries.split(",") if q.strip()]
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    for name, known, got in (("query", QUERIES, args.queries), ("engine", ENGINES, args.engines)):
        if unknown := [x for x in got if x not in known]:
            parser.error(f"unknown {name}(s) {unknown}; choose from {list(known)}")
    return args


def spark_missing(python: Path) -> str | None:
    """Why Spark cannot run here, or None."""
    if not python.exists():
        return f"no peers venv at {python} (make bench-peers builds it)"
    probe = subprocess.run([str(python), "-c", "import pyspark, psutil"], check=False,
                           capture_output=True, text=True, timeout=120)
    if probe.returncode:
        return f"{python} cannot import pyspark/psutil: {probe.stderr.strip()[-200:]}"
    return None


def run_one(engine: str, query: str, ds: NexmarkDataset, args: argparse.Namespace,
            files_per_batch: int) -> dict[str, Any]:
    workdir = args.out / "work" / f"{query}-{engine}"
    python = str(args.peers_python) if engine == "spark" else sys.executable
    cmd = [python, "-m", "benchmarks.nexmark.worker", engine, query, str(ds.path),
           str(workdir), str(workdir / "result.json"), "--files-per-batch", str(files_per_batch)]
    shutil.rmtree(workdir, ignore_errors=True)  # a checkpoint of an earlier run
    workdir.mkdir(parents=True)
    run = run_process(cmd, result_file=workdir / "result.json", log=workdir / "log.txt",
                      timeout_s=args.timeout, cwd=ROOT, sample_tree_rss=True)
    result: dict[str, Any] = run.result or {}
    if run.failure:
        result["failure"] = run.failure
    result["peak_tree_mb"] = run.peak_tree_rss_mb
    if engine == "spark" and not run.failure:
        out = workdir / "spark-out"
        q = QUERIES[query]
        _, oracle = run_oracle(q, ds)
        got = pl.read_parquet(out / "*.parquet") if out.exists() else pl.DataFrame()
        result["check"] = verdict(q, got, oracle) or "OK"
    return result


def _rate(events: int, r: dict[str, Any] | None, key: str = "seconds") -> float:
    if not r or not r.get(key):
        return math.nan
    return events / float(r[key])


def render(results: dict[str, dict[str, dict[str, Any]]], ds: NexmarkDataset,
           skipped: dict[str, str], machine: dict[str, Any]) -> str:
    """The Markdown report: one row per query."""
    n = ds.events
    rows = []
    for name, engines in results.items():
        ours = engines.get("microbatch", {})
        sql = engines.get("microbatch-sql", {})
        spk = engines.get("spark", {})
        pol = engines.get("polars", {})
        warm = _rate(n, ours.get("warm"))
        one = _rate(n, pol.get("warm"))
        flink = published.FLINK_PER_CORE.get(name)

        def cell(r: dict[str, Any], *, per_core: bool = True) -> str:
            if "failure" in r:
                return f"failed ({r['failure'][:80]})"
            if not r.get("warm"):
                return "n/a"
            text = f"{fmt_num(_rate(n, r['cold']))} · {fmt_num(_rate(n, r['warm']))}"
            if per_core:
                text += f" ({fmt_num(_rate(n, r['warm'], 'cpu_s'))}/core)"
            return text

        def check(r: dict[str, Any]) -> str:
            c = r.get("check")
            return "" if c is None else ("✅" if c == "OK" else f"❌ {c}")

        q = QUERIES[name]
        rows.append([
            f"{name} {q.title}",
            cell(ours) if ours else "not run",
            f"{ours['warm']['cpu_s'] / ours['warm']['seconds']:.2f}" if ours.get("warm") else "",
            (cell(sql) if sql else "not run") if q.sql else "no SQL form",
            (cell(spk) if spk else skipped.get("spark", "not run"))
            if name in spark.QUERIES else "not written",
            cell(pol, per_core=False) if pol else "not run",
            f"{warm / one:.2f}" if not math.isnan(warm / one) else "n/a",
            " ".join(x for x in (check(ours), ("SQL " + check(sql)) if sql.get("check") else "",
                                 ("Spark " + check(spk)) if spk.get("check") else "") if x),
            f"{fmt_num(flink)}" if flink else "",
        ])
    header = ["query", "microbatch events/s cold · warm (per core)", "cores used",
              "SQL cold · warm", "Spark SS cold · warm", "one-shot Polars cold · warm",
              "ratio (warm)", "output = oracle", "Flink per core (published)"]
    lines = [
        f"Nexmark, {n:,} events ({ds.events_per_file:,} per batch, event rate "
        f"{ds.config.rate:,}/s, seed {ds.config.seed}); {machine.get('cpu', '')}, "
        f"{machine.get('nproc', os.cpu_count())} cores; load before the run "
        f"{machine.get('load', '')}.",
        "",
        *markdown_table(header, rows, "lrrrrrrll"),
        "",
        "Rates count every event of the run (person + auction + bid); per core = events "
        "/ CPU seconds of the engine's process tree (Nexmark's Throughput/Cores). "
        f"Flink: {published.FLINK_SOURCE} (8-core workers, parallelism 8, in-process "
        "generator, RocksDB, checkpoints every 3 min).",
    ]
    for name in results:
        if QUERIES[name].note:
            lines.append(f"- {name}: {QUERIES[name].note}")
    if results.get("q11", {}).get("spark", {}).get("warm"):
        lines.append("- Spark q11: Spark emits no window still open at the end of an "
                     "available-now run; an empty output there means every session was open.")
    for engine, why in skipped.items():
        lines.append(f"- {engine} skipped: {why}")
    return "\n".join(lines)


def write_plot(path: Path, results: dict[str, dict[str, dict[str, Any]]],
               ds: NexmarkDataset) -> str:
    """A bar chart of events/s per core (warm) per query and engine, beside Flink's."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no chart: matplotlib is not installed in this venv"
    names = list(results)
    series: dict[str, list[float]] = {
        "microbatch": [], "microbatch-sql": [], "spark": [], "Flink (published)": []}
    for name in names:
        for engine in ("microbatch", "microbatch-sql", "spark"):
            r = results[name].get(engine, {})
            series[engine].append(_rate(ds.events, r.get("warm"), "cpu_s") if r.get("warm")
                                  else 0.0)
        series["Flink (published)"].append(published.FLINK_PER_CORE.get(name, 0.0))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.2
    for i, (label, values) in enumerate(series.items()):
        ax.bar([x + (i - 1.5) * width for x in range(len(names))],
               [0 if math.isnan(v) else v for v in values], width, label=label)
    ax.set_xticks(range(len(names)), names)
    ax.set_yscale("log")
    ax.set_ylabel("events/s per core (warm)")
    ax.set_title(f"Nexmark, {ds.events:,} events, 2-core VM (Flink: published, 8-core workers)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return f"chart written to {path}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # the workers (the peers venv's too) import benchmarks.nexmark from this checkout
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    machine = machine_info()
    machine["load"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    ds = NexmarkDataset(args.events, args.events_per_file, NexmarkConfig(rate=args.rate))
    t0 = time.perf_counter()
    ds.ensure()
    print(f"data: {ds.path} ({time.perf_counter() - t0:.1f} s)", flush=True)
    skipped: dict[str, str] = {}
    if "spark" in args.engines and (why := spark_missing(args.peers_python)):
        skipped["spark"] = why
        print(f"spark skipped: {why}", flush=True)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for query in args.queries:
        results[query] = {}
        for engine in args.engines:
            if engine in skipped or (engine == "spark" and query not in spark.QUERIES):
                continue
            if engine == "microbatch-sql" and QUERIES[query].sql is None:
                continue
            r = run_one(engine, query, ds, args, 1)
            results[query][engine] = r
            warm = r.get("warm") or {}
            print(f"{query} {engine}: {r.get('failure') or ''}"
                  f"warm {fmt_num(_rate(ds.events, warm))} events/s, "
                  f"check {r.get('check', '-')}", flush=True)
    text = render(results, ds, skipped, machine)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nexmark.md").write_text(text + "\n")
    (args.out / "nexmark.json").write_text(json.dumps(
        {"machine": machine, "dataset": ds.spec(), "results": results}, indent=1, default=str))
    print()
    print(text)
    print(write_plot(args.out / "nexmark.png", results, ds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
