"""``stateless``: filter + select from Parquet files to Parquet, 10M events.

Engine: ``read_files(max_files_per_batch=10)`` → ``filter(amount > 20)`` →
``select(event_id, card_id, amount, event_time)`` → ``write_parquet``.
Limit: the same in one shot with Polars, both as a streaming
``sink_parquet`` and as ``collect().write_parquet``; the faster counts.
"""

from __future__ import annotations

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
    median,
    rate,
    ratio,
    spread,
    timed,
)
from benchmarks.measure import run_available_now
from benchmarks.profile import step_profile

TARGET_RATIO = 0.7
FILES_PER_BATCH = 10
PREDICATE = pl.col("amount") > 20
COLUMNS = ("event_id", "card_id", "amount", "event_time")


def prepare(cfg: Config) -> None:
    data.ensure(data.events(cfg.quick))


def run_phase(phase: str, cfg: Config, workdir: Path) -> dict[str, Any]:
    ds = data.events(cfg.quick)
    if phase == "engine":
        stream = (
            mb.read_files(ds.path, max_files_per_batch=FILES_PER_BATCH)
            .filter(PREDICATE)
            .select(*COLUMNS)
        )
        batches = -(-ds.files // FILES_PER_BATCH)
        return run_available_now(stream, workdir / "out", workdir / "chk",
                                 batches_hint=batches).to_json()
    if phase == "oneshot":
        lazy = pl.scan_parquet(ds.path / "*.parquet").filter(PREDICATE).select(*COLUMNS)
        sink_s = timed(lambda: lazy.sink_parquet(workdir / "sink.parquet"))
        write_s = timed(lambda: lazy.collect().write_parquet(workdir / "write.parquet"))
        return {"rows": ds.rows, "sink_parquet_s": sink_s, "collect_write_s": write_s,
                "seconds": min(sink_s, write_s)}
    raise ValueError(f"unknown phase {phase!r}")


def summarize(cfg: Config, results: PhaseResults) -> Section:
    engine_rates = [r["input_rows"] / r["wall_s"] for r in results["engine"]]
    oneshot_rates = [rate(r["rows"], r["seconds"]) for r in results["oneshot"]]
    engine_rate, oneshot_rate = median(engine_rates), median(oneshot_rates)
    of_limit = ratio(engine_rate, oneshot_rate)
    sink_med = median([r["sink_parquet_s"] for r in results["oneshot"]])
    write_med = median([r["collect_write_s"] for r in results["oneshot"]])
    rows_per_batch = data.events(cfg.quick).rows_per_file * FILES_PER_BATCH
    row = Row(
        "stateless", f"events/s, {fmt_num(rows_per_batch)} rows/batch",
        f"{fmt_num(engine_rate)} ({spread(engine_rates)})",
        f"{fmt_num(oneshot_rate)} ({spread(oneshot_rates)})",
        of_limit, f">= {TARGET_RATIO}", of_limit >= TARGET_RATIO,
        f"{max(r['peak_rss_mb'] for r in results['engine']):.0f} / "
        f"{max(r['peak_rss_mb'] for r in results['oneshot']):.0f} MiB",
        f"one-shot sink_parquet {sink_med:.2f} s, collect+write {write_med:.2f} s",
    )
    median_run = sorted(results["engine"], key=lambda r: r["wall_s"])[len(results["engine"]) // 2]
    return Section(rows=[row], details=step_profile("stateless", median_run))


WORKLOAD = Workload(
    name="stateless",
    description="files → filter → select → parquet, vs one-shot Polars",
    phases=("oneshot", "engine"),
    default_reps=3,
    prepare=prepare,
    run_phase=run_phase,
    summarize=summarize,
)
