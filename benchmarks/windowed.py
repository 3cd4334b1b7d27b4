"""Shared machinery of the windowed-aggregation workloads (q1, q2, q3).

Each runs ``read_files`` → ``with_watermark("event_time", "10s")`` →
``group_by(<window>, "card_id").agg(n=len, amount=sum)`` in append mode →
``write_parquet``, at ~100k and ~1M rows per batch, against the one-shot
Polars computation of the same windows. Then a correctness check: the
engine's output must equal a reference computed in one shot over the rows
that were not late, restricted to the windows the final watermark closed.
The reference simulates the engine's watermark: batch ``b`` runs with
``max(event_time of batches < b) - 10s``.

The file source is given the schema explicitly: without one, the final
no-data batch of an available-now run gets a frame without columns and the
windowed operators fail ("event-time column 'event_time' is not in the
stream; columns are []"), an engine bug found by this benchmark.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from benchmarks import data
from benchmarks.harness import (
    Config,
    PhaseResults,
    Row,
    Section,
    SkipWorkload,
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

DELAY_MS = 10_000
FILES_PER_BATCH = (1, 10)
AGGS = (pl.len().alias("n"), pl.col("amount").sum().alias("amount"))
RESULT_COLUMNS = ("ws", "we", "card_id", "n", "amount")
"""Columns compared by the check; ``ws``/``we`` are window bounds in epoch ms."""
SPAN = pl.col("batch").n_unique().alias("batches")
"""Reference-only column: how many batches fed a window (explains differences)."""


@dataclass(frozen=True)
class WindowCase:
    """One windowed query: its engine window, its one-shot limit, its reference.

    ``oneshot(lf)`` is the timed limit over all rows. ``reference(rows)``
    takes rows with ``t`` (event time, epoch ms) and ``wm`` (watermark in
    force for the row's batch, null in batch 0) and returns the expected
    result (``RESULT_COLUMNS``) and the expected number of late rows.
    """

    name: str
    description: str
    window: Callable[[], Any]
    oneshot: Callable[[pl.LazyFrame], pl.LazyFrame]
    reference: Callable[[pl.LazyFrame], tuple[pl.LazyFrame, pl.LazyFrame]]
    sql: str | None = None
    """The same query in SQL over the table ``tx`` (``mb.sql``): when set, phases
    ``sql-f1``/``sql-f10`` run it and the table compares it with the Python API."""
    pipelined: bool = False
    """Also run phases ``pipe-f1``/``pipe-f10``: the Python API's query with
    ``pipelined=True``, compared with the sequential run in the table."""


def make_workload(case: WindowCase) -> Workload:
    """A :class:`Workload` running ``case`` at both batch sizes."""

    def prepare(cfg: Config) -> None:
        try:
            import microbatch.operators.window_agg  # noqa: F401
            from statestore import StateStore, StateStoreProvider  # noqa: F401
        except Exception as exc:
            raise SkipWorkload(f"state store not usable: {type(exc).__name__}: {exc}") from exc
        data.ensure(data.events(cfg.quick))

    def run_phase(phase: str, cfg: Config, workdir: Path) -> dict[str, Any]:
        ds = data.events(cfg.quick)
        if phase == "oneshot":
            lazy = case.oneshot(pl.scan_parquet(ds.path / "*.parquet"))
            holder: dict[str, int] = {}

            def once() -> None:
                result = lazy.collect()
                result.write_parquet(workdir / "out.parquet")
                holder["rows"] = result.height

            seconds = timed(once)
            return {"rows": ds.rows, "seconds": seconds, "output_rows": holder["rows"]}
        if phase.startswith("sql-f"):
            return run_engine(case, ds, int(phase.removeprefix("sql-f")), workdir, sql=True)
        if phase.startswith("pipe-f"):
            return run_engine(case, ds, int(phase.removeprefix("pipe-f")), workdir,
                              pipelined=True)
        files = int(phase.removeprefix("engine-f"))
        return run_engine(case, ds, files, workdir)

    def summarize(cfg: Config, results: PhaseResults) -> Section:
        return summarize_case(case, cfg, results)

    return Workload(
        name=case.name,
        description=case.description,
        phases=("oneshot", *(f"engine-f{k}" for k in FILES_PER_BATCH),
                *((f"sql-f{k}" for k in FILES_PER_BATCH) if case.sql else ()),
                *((f"pipe-f{k}" for k in FILES_PER_BATCH) if case.pipelined else ())),
        default_reps=1,
        prepare=prepare,
        run_phase=run_phase,
        summarize=summarize,
    )


def run_engine(case: WindowCase, ds: data.Dataset, files: int, workdir: Path, *,
               sql: bool = False, pipelined: bool = False) -> dict[str, Any]:
    """The engine query at ``files`` files per batch (the Python API's, or ``case.sql``
    through ``mb.sql``: the same plan); raw numbers plus output path."""
    import microbatch as mb
    from microbatch.sources.generator import GENERATOR_SCHEMA

    tx = mb.read_files(ds.path, max_files_per_batch=files, schema=GENERATOR_SCHEMA).with_watermark(
        "event_time", f"{DELAY_MS // 1000}s")
    if sql:
        assert case.sql is not None
        stream = mb.sql(case.sql, tx=tx)
    else:
        stream = tx.group_by(case.window(), "card_id").agg(*AGGS)
    run = run_available_now(stream, workdir / "out", workdir / "chk",
                            batches_hint=ds.files // files + 5, pipelined=pipelined)
    return {**run.to_json(), "output": str(workdir / "out"), "files_per_batch": files}


def summarize_case(case: WindowCase, cfg: Config, results: PhaseResults) -> Section:
    """Rate rows per batch size, a correctness note each, and a step profile."""
    ds = data.events(cfg.quick)
    oneshot_rates = [rate(r["rows"], r["seconds"]) for r in results["oneshot"]]
    oneshot_rate = median(oneshot_rates)
    oneshot_rss = max(r["peak_rss_mb"] for r in results["oneshot"])
    section = Section()
    for files in FILES_PER_BATCH:
        runs = results.get(f"engine-f{files}", [])
        if not runs:
            continue
        rates = [rate(r["input_rows"], r["wall_s"]) for r in runs]
        engine_rate = median(rates)
        try:
            verdict, detail = check(case, ds, runs[0])
        except Exception as exc:
            verdict, detail = f"check failed: {type(exc).__name__}: {exc}", []
        section.rows.append(Row(
            case.name, f"events/s, {fmt_num(ds.rows_per_file * files)} rows/batch",
            f"{fmt_num(engine_rate)} ({spread(rates)})",
            f"{fmt_num(oneshot_rate)} ({spread(oneshot_rates)})",
            ratio(engine_rate, oneshot_rate), "", None,
            f"{max(r['peak_rss_mb'] for r in runs):.0f} / {oneshot_rss:.0f} MiB", verdict,
        ))
        section.details += step_profile(f"{case.name}, {files} file(s)/batch", runs[0])
        section.details += detail
        sql_runs = results.get(f"sql-f{files}", [])
        if sql_runs:
            section.rows.append(sql_row(case, ds, files, sql_runs, python_rate=engine_rate,
                                        oneshot_rates=oneshot_rates))
        pipe_runs = results.get(f"pipe-f{files}", [])
        if pipe_runs:
            section.rows.append(pipelined_row(case, ds, files, pipe_runs,
                                              sequential_rate=engine_rate,
                                              oneshot_rates=oneshot_rates))
            section.details += step_profile(f"{case.name} pipelined, {files} file(s)/batch",
                                            pipe_runs[0])
    return section


def pipelined_row(case: WindowCase, ds: data.EventFiles, files: int,
                  runs: list[dict[str, Any]], *, sequential_rate: float,
                  oneshot_rates: list[float]) -> Row:
    """The pipelined run's row: its rate against the one-shot limit, and in the note
    against the sequential run measured in the same session, with its output check."""
    return variant_row(case, ds, files, runs, variant="pipelined", versus="sequential",
                       baseline_rate=sequential_rate, oneshot_rates=oneshot_rates)


def sql_row(case: WindowCase, ds: data.EventFiles, files: int, runs: list[dict[str, Any]], *,
            python_rate: float, oneshot_rates: list[float]) -> Row:
    """The SQL version's row: its rate against the one-shot limit, and in the note
    against the Python API's rate measured in the same run (the issue's target: within
    5 %), with the correctness check of its output."""
    return variant_row(case, ds, files, runs, variant="SQL", versus="Python API",
                       baseline_rate=python_rate, oneshot_rates=oneshot_rates, target=0.95)


def variant_row(case: WindowCase, ds: data.EventFiles, files: int,
                runs: list[dict[str, Any]], *, variant: str, versus: str,
                baseline_rate: float, oneshot_rates: list[float],
                target: float | None = None) -> Row:
    """A variant of the case's query (SQL, pipelined): its rate against the one-shot
    limit and, in the note, against ``baseline_rate`` measured in the same run
    (``target``: the least ratio that meets it), with its output check."""
    rates = [rate(r["input_rows"], r["wall_s"]) for r in runs]
    variant_rate, oneshot_rate = median(rates), median(oneshot_rates)
    try:
        verdict, _ = check(case, ds, runs[0])
    except Exception as exc:
        verdict = f"check failed: {type(exc).__name__}: {exc}"
    versus_ratio = ratio(variant_rate, baseline_rate)
    note = f"{variant} / {versus} {versus_ratio:.2f}"
    if target is not None:
        note += f" (>= {target})"
    return Row(
        f"{case.name} ({variant})", f"events/s, {fmt_num(ds.rows_per_file * files)} rows/batch",
        f"{fmt_num(variant_rate)} ({spread(rates)})",
        f"{fmt_num(oneshot_rate)} ({spread(oneshot_rates)})",
        ratio(variant_rate, oneshot_rate), note,
        None if target is None else versus_ratio >= target,
        f"{max(r['peak_rss_mb'] for r in runs):.0f} MiB", verdict,
    )


def check(case: WindowCase, ds: data.EventFiles,
          run: dict[str, Any]) -> tuple[str, list[str]]:
    """Compare the engine's output with the reference; a verdict and details."""
    import microbatch as mb

    lf = data.batch_frames(ds, run["files_per_batch"]).with_columns(
        pl.col("event_time").dt.epoch("ms").alias("t"))
    marks = (
        lf.group_by("batch").agg(pl.col("t").max().alias("bmax")).sort("batch")
        .with_columns((pl.col("bmax").cum_max() - DELAY_MS).shift(1).alias("wm"))
        .select("batch", "wm")
    )
    expected_lf, late_lf = case.reference(lf.join(marks, on="batch"))
    simulated_final = lf.select(pl.col("t").max()).collect().item() - DELAY_MS
    progress = run["progress"]
    final_wm = max((p["watermark_ms"] for p in progress if p["watermark_ms"] is not None),
                   default=None)
    if final_wm is None:
        return "no watermark reported", []
    expected = expected_lf.filter(pl.col("we") <= final_wm).collect()
    engine = mb.parquet_table(run["output"]).select(
        pl.col("window_start").dt.epoch("ms").alias("ws"),
        pl.col("window_end").dt.epoch("ms").alias("we"),
        "card_id", "n", "amount",
    )
    keys = ["ws", "card_id"]
    joined = engine.join(expected, on=keys, how="full", suffix="_ref", coalesce=True)
    only_engine = joined.filter(pl.col("n_ref").is_null())
    only_ref = joined.filter(pl.col("n").is_null())
    tolerance = 1e-9 * pl.col("amount_ref").abs().clip(lower_bound=1.0)
    mismatch = joined.filter(
        pl.col("n").is_not_null() & pl.col("n_ref").is_not_null()
        & ((pl.col("n") != pl.col("n_ref")) | (pl.col("we") != pl.col("we_ref"))
           | ((pl.col("amount") - pl.col("amount_ref")).abs() > tolerance))
    )
    duplicates = engine.height - engine.unique(keys).height
    late_engine = sum(int(p.get("late_rows") or 0) for p in progress)
    late_ref = late_lf.collect().item()
    differing = only_engine.height + only_ref.height + mismatch.height + duplicates
    late_note = f"late rows engine {late_engine:,} / simulated {late_ref:,}"
    wm_note = "" if final_wm == simulated_final else (
        f"; final watermark {final_wm} != simulated {simulated_final}")
    spanning = only_ref.filter(pl.col("batches") > 1).height
    if only_ref.height:
        late_note += (f"; {spanning:,} of the {only_ref.height:,} reference-only windows "
                      "got rows from more than one batch")
    if differing == 0:
        return f"output OK: {engine.height:,} windows identical; {late_note}{wm_note}", []
    verdict = (f"DIFF {differing:,} of {expected.height:,} windows (engine-only "
               f"{only_engine.height:,}, reference-only {only_ref.height:,}, values "
               f"{mismatch.height:,}, duplicates {duplicates:,}); {late_note}{wm_note}")
    detail = [f"#### {case.name}, {run['files_per_batch']} file(s)/batch: differing windows",
              "", "```"]
    for title, frame in (("engine only", only_engine), ("reference only", only_ref),
                         ("values differ", mismatch)):
        if frame.height:
            detail += [f"{title}:", str(frame.head(5))]
    detail += ["```", ""]
    return verdict, detail


def window_reference(size_ms: int, slide_ms: int) -> Callable[
        [pl.LazyFrame], tuple[pl.LazyFrame, pl.LazyFrame]]:
    """Reference for tumbling/hopping windows: a row's late when all its windows closed;
    a (row, window) pair is dropped when that window closed."""

    def reference(rows: pl.LazyFrame) -> tuple[pl.LazyFrame, pl.LazyFrame]:
        last = (pl.col("t") // slide_ms) * slide_ms
        closed_all = pl.col("wm").is_not_null() & (last + size_ms <= pl.col("wm"))
        late = rows.filter(closed_all).select(pl.len())
        k = size_ms // slide_ms
        pairs = rows.with_columns(
            (last - pl.int_ranges(0, k, dtype=pl.Int64) * slide_ms).alias("ws")
        ).explode("ws")
        live = pairs.filter(pl.col("wm").is_null() | (pl.col("ws") + size_ms > pl.col("wm")))
        result = live.group_by("ws", "card_id").agg(*AGGS, SPAN).select(
            "ws", (pl.col("ws") + size_ms).alias("we"), "card_id", "n", "amount", "batches")
        return result, late

    return reference


def session_reference(gap_ms: int) -> Callable[[pl.LazyFrame], tuple[pl.LazyFrame, pl.LazyFrame]]:
    """Reference for session windows: rows at or before the watermark are late; the
    rest are sessionized per card (a gap larger than ``gap_ms`` starts a session)."""

    def reference(rows: pl.LazyFrame) -> tuple[pl.LazyFrame, pl.LazyFrame]:
        is_late = pl.col("wm").is_not_null() & (pl.col("t") <= pl.col("wm"))
        late = rows.filter(is_late).select(pl.len())
        live = rows.filter(~is_late).select("card_id", "t", "amount", "batch").sort("card_id", "t")
        starts = (
            (pl.col("card_id") != pl.col("card_id").shift(1))
            | (pl.col("t") - pl.col("t").shift(1) > gap_ms)
        ).fill_null(True)
        result = (
            live.with_columns(starts.cum_sum().alias("session"))
            .group_by("session")
            .agg(pl.col("card_id").first(), pl.col("t").min().alias("ws"),
                 (pl.col("t").max() + gap_ms).alias("we"), *AGGS, SPAN)
            .select(*RESULT_COLUMNS, "batches")
        )
        return result, late

    return reference
