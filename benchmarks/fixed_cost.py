"""``fixed-cost``: the engine's per-batch overhead on tiny (1,000-row) batches.

Engine: ``read_files(max_files_per_batch=1)`` over files of 1,000 rows →
``filter`` → ``write_parquet``, one batch per file. Limits, measured in the
same run: a plain Polars loop doing the same per file (read, filter, write;
the floor of a batch's own work) and the one-shot scan of all the files
(``scan_parquet(dir).filter().sink_parquet``), whose rate gives the ratio.
The engine runs twice: with full durability (every file fsync'ed) and with
``durability="process"`` (no fsyncs).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import polars as pl

import microbatch as mb
from benchmarks import data
from benchmarks.harness import (
    Config,
    PhaseResults,
    Row,
    Section,
    Workload,
    fmt_num,
    markdown_table,
    median,
    percentile,
    rate,
    ratio,
    timed,
)
from benchmarks.measure import STEPS, run_available_now

TARGET_MS = 3.0
PREDICATE = pl.col("amount") > 20


def prepare(cfg: Config) -> None:
    data.ensure(data.tiny(cfg.quick))


def run_phase(phase: str, cfg: Config, workdir: Path) -> dict[str, Any]:
    ds = data.tiny(cfg.quick)
    if phase in ("engine", "engine-process"):
        stream = mb.read_files(ds.path, max_files_per_batch=1).filter(PREDICATE)
        run = run_available_now(stream, workdir / "out", workdir / "chk", batches_hint=ds.files,
                                durability="process" if phase == "engine-process" else "fsync")
        return run.to_json()
    if phase == "polars-per-file":
        out = workdir / "out"
        out.mkdir()
        per_file = []
        for i, path in enumerate(ds.file_paths()):
            t0 = time.perf_counter()
            pl.read_parquet(path).filter(PREDICATE).write_parquet(out / f"{i}.parquet")
            per_file.append((time.perf_counter() - t0) * 1000)
        return {"per_file_ms": per_file}
    if phase == "oneshot":
        seconds = timed(
            lambda: pl.scan_parquet(ds.path / "*.parquet").filter(PREDICATE)
            .sink_parquet(workdir / "out.parquet")
        )
        return {"seconds": seconds, "rows": ds.rows}
    raise ValueError(f"unknown phase {phase!r}")


def summarize(cfg: Config, results: PhaseResults) -> Section:
    engine = results["engine"][0]
    floor_ms = results["polars-per-file"][0]["per_file_ms"]
    oneshot = results["oneshot"][0]
    progress = engine["progress"]
    # The first batch also pays for opening the query; the loop gap of batch 0
    # includes start(), so both are left out of the per-batch statistics.
    steady = progress[1:] or progress
    totals = [float(p["duration_ms"]["total"]) for p in steady]
    loop = engine["loop_ms"][1:] or engine["loop_ms"]
    med, p99 = median(totals), percentile(totals, 99)
    floor_med = median(floor_ms)
    rss = f"{engine['peak_rss_mb']:.0f} MiB"
    engine_rate = rate(engine["input_rows"], engine["wall_s"])
    oneshot_rate = rate(oneshot["rows"], oneshot["seconds"])
    rows = [
        Row("fixed-cost", "batch total ms, median (1k rows)", f"{med:.2f} ms",
            f"{floor_med:.2f} ms (Polars per file)", floor_med / med, f"< {TARGET_MS:.0f} ms",
            med < TARGET_MS, rss, f"{len(steady)} batches"),
        Row("fixed-cost", "batch total ms, p99", f"{p99:.2f} ms",
            f"{percentile(floor_ms, 99):.2f} ms (Polars per file)",
            percentile(floor_ms, 99) / p99, "", None, "", ""),
        Row("fixed-cost", "wall per batch incl. loop, median", f"{median(loop):.2f} ms",
            f"{floor_med:.2f} ms", floor_med / median(loop), "", None, "",
            f"p99 {percentile(loop, 99):.2f} ms"),
        Row("fixed-cost", "rows/s over the run", fmt_num(engine_rate),
            f"{fmt_num(oneshot_rate)} (one-shot scan)", ratio(engine_rate, oneshot_rate), "", None,
            f"{results['oneshot'][0]['peak_rss_mb']:.0f} MiB (one-shot)",
            f"{engine['wall_s']:.2f} s vs {oneshot['seconds']:.3f} s"),
    ]
    process = results.get("engine-process", [])
    if process:
        quick = [float(p["duration_ms"]["total"]) for p in process[0]["progress"][1:]]
        process_rate = rate(process[0]["input_rows"], process[0]["wall_s"])
        rows.append(Row("fixed-cost", 'batch total ms, median, durability="process"',
                        f"{median(quick):.2f} ms", f"{floor_med:.2f} ms (Polars per file)",
                        floor_med / median(quick), "", None,
                        f"{process[0]['peak_rss_mb']:.0f} MiB",
                        f"{fmt_num(process_rate)} rows/s; no fsyncs (survives a process crash)"))
    loop_total = sum(loop)
    steps = []
    for step in (*STEPS, "total"):
        values = [float(p["duration_ms"].get(step, 0.0)) for p in steady]
        share = sum(values) / loop_total if loop_total else float("nan")
        steps.append((step, f"{median(values):.2f}", f"{percentile(values, 99):.2f}",
                      f"{sum(values) / len(values):.2f}", f"{share:.0%}"))
    outside = [w - t for w, t in zip(loop, totals, strict=False)]
    steps.append(("loop wall - total (report, loop)", f"{median(outside):.2f}",
                  f"{percentile(outside, 99):.2f}", f"{sum(outside) / len(outside):.2f}",
                  f"{sum(outside) / loop_total:.0%}"))
    steps.append(("loop wall", f"{median(loop):.2f}", f"{percentile(loop, 99):.2f}",
                  f"{loop_total / len(loop):.2f}", "100%"))
    lines = [
        "### fixed-cost: per-batch lifecycle steps (ms, batches 1..N)",
        "",
        *markdown_table(("step", "median", "p99", "mean", "share of loop wall"), steps,
                        align="lrrrr"),
        "",
    ]
    return Section(rows=rows, details=lines)


WORKLOAD = Workload(
    name="fixed-cost",
    description="per-batch overhead on 1,000-row batches (files → filter → parquet)",
    phases=("polars-per-file", "oneshot", "engine", "engine-process"),
    default_reps=1,
    prepare=prepare,
    run_phase=run_phase,
    summarize=summarize,
)
