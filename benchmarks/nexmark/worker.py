"""One engine's cold and warm runs of one Nexmark query, in a fresh process:
``python -m benchmarks.nexmark.worker ENGINE QUERY DATA WORKDIR RESULT``.

Engines: ``microbatch`` (the Python API), ``microbatch-sql`` (``mb.sql``),
``polars`` (the one-shot oracle: the limit), ``spark`` (peers venv). The
microbatch engines check their warm and cold output against the oracle; Spark
writes its warm output to ``WORKDIR/spark-out`` for the runner to check. CPU time
is the process tree's (user + system), so ``events / cpu_s`` is events per core
second, Nexmark's "Throughput/Cores".
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import peak_rss_mb


def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_ours(engine: str, query_name: str, data: Path, workdir: Path,
             files_per_batch: int) -> dict[str, Any]:
    from benchmarks.nexmark.data import NexmarkDataset
    from benchmarks.nexmark.queries import QUERIES
    from benchmarks.nexmark.run import Form, run_engine, run_oracle, verdict

    ds = NexmarkDataset.load(data)
    query = QUERIES[query_name]
    result: dict[str, Any] = {}
    if engine == "polars":
        for phase in ("cold", "warm"):
            c0 = _cpu_self()
            seconds, out = run_oracle(query, ds)
            result[phase] = {"seconds": seconds, "cpu_s": _cpu_self() - c0, "rows": out.height}
        return result
    form: Form = "sql" if engine == "microbatch-sql" else "python"
    outputs = {}
    for phase in ("cold", "warm"):
        chk = workdir / f"chk-{phase}"
        shutil.rmtree(chk, ignore_errors=True)
        c0 = _cpu_self()
        run = run_engine(query, ds, chk, files_per_batch=files_per_batch, form=form)
        result[phase] = {"seconds": run.seconds, "cpu_s": _cpu_self() - c0,
                         "batches": run.batches, "rows": run.output.height}
        outputs[phase] = run.output
    _, oracle = run_oracle(query, ds)
    problems = [f"{phase}: {why}" for phase, out in outputs.items()
                if (why := verdict(query, out, oracle)) is not None]
    result["check"] = "; ".join(problems) or "OK"
    result["oracle_rows"] = oracle.height
    return result


def run_spark(query: str, data: Path, workdir: Path, files_per_batch: int) -> dict[str, Any]:
    from benchmarks.nexmark import spark

    spec = json.loads((data / "_nexmark.json").read_text())
    result: dict[str, Any] = {}
    for phase in ("cold", "warm"):
        out = workdir / "spark-out" if phase == "warm" else None
        result[phase] = spark.run(query, data, spec, workdir, phase=phase,
                                   files_per_batch=files_per_batch, output=out)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.nexmark.worker")
    parser.add_argument("engine")
    parser.add_argument("query")
    parser.add_argument("data", type=Path)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("result", type=Path)
    parser.add_argument("--files-per-batch", type=int, default=1)
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if args.engine == "spark":
        result = run_spark(args.query, args.data, args.workdir, args.files_per_batch)
    else:
        result = run_ours(args.engine, args.query, args.data, args.workdir,
                          args.files_per_batch)
    result["process_s"] = time.perf_counter() - t0
    result["peak_rss_mb"] = peak_rss_mb()
    args.result.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
