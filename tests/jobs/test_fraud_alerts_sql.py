"""``jobs/fraud_alerts.sql``: the fraud rule in SQL, run by ``microbatch sql`` on the generator.

- Over rows with late uploads, its alerts equal the same query written with the
  Python API (``mb.generate`` -> ``with_watermark`` -> ``group_by(mb.window)``
  -> ``filter(transactions >= 3)``, append mode): the same late rows dropped.
- Over the same generated rows without late uploads, its alerts equal
  ``jobs/fraud_alerts.py``'s alert table (run by ``microbatch run`` on those
  rows as Parquet files) for every window the final watermark closed: the SQL
  job emits a window when it closes, the Python job fires it early and
  corrects it, and both end with the window's count and totals.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import microbatch as mb

ROOT = Path(__file__).resolve().parents[2]
SQL_JOB = ROOT / "jobs" / "fraud_alerts.sql"
PY_JOB = ROOT / "jobs" / "fraud_alerts.py"
ROWS, CARDS, SEED = 12_000, 300, 4
DELAY_MS = 10_000

pytestmark = [pytest.mark.slow, pytest.mark.delta]


def fraud_job() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fraud_alerts_sql_twin", PY_JOB)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass Params needs its module registered
    spec.loader.exec_module(module)
    return module


def cli(*args: str | Path) -> None:
    result = subprocess.run([sys.executable, "-m", "microbatch.cli", *map(str, args)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]


def run_sql(tmp: Path, late_fraction: float) -> pl.DataFrame:
    out = tmp / f"sql-{late_fraction}"
    cli("sql", SQL_JOB, "--checkpoint", tmp / f"chk-sql-{late_fraction}",
        "--trigger", "available-now", "--param", f"rows={ROWS}", "--param", f"cards={CARDS}",
        "--param", f"seed={SEED}", "--param", f"late_fraction={late_fraction}",
        "--param", f"output={out}")
    return alerts(pl.read_delta(str(out)))


def alerts(frame: pl.DataFrame) -> pl.DataFrame:
    """Alert rows in one comparable shape (epoch-ms times, exact decimals)."""
    ms = [pl.col(c).dt.epoch("ms") for c in
          ("window_start", "window_end", "first_event_time", "last_event_time")]
    return frame.select(
        "alert_id", "card_id", *ms, pl.col("transactions").cast(pl.Int64),
        pl.col("total_amount").cast(pl.Decimal(38, 2)),
        pl.col("max_amount").cast(pl.Decimal(18, 2)),
    ).sort("alert_id")


def test_sql_alerts_equal_the_python_api_query_with_late_uploads(tmp_path: Path) -> None:
    got = run_sql(tmp_path, late_fraction=0.03)
    twin = (
        mb.generate(rows_per_second=None, event_rate=50, start="2026-01-01T00:00:00+00:00",
                    total_rows=ROWS, cards=CARDS, seed=SEED, late_fraction=0.03,
                    max_records_per_batch=5000)
        .with_columns(pl.col("amount").cast(pl.Decimal(18, 2)))
        .with_watermark("event_time", "10s")
        .group_by(mb.window("event_time", "1m"), "card_id")
        .agg(pl.len().alias("transactions"), pl.col("amount").sum().alias("total_amount"),
             pl.col("amount").max().alias("max_amount"),
             pl.col("event_time").min().alias("first_event_time"),
             pl.col("event_time").max().alias("last_event_time"))
        .filter(pl.col("transactions") >= 3)
        .with_columns(pl.format("{}-{}", "card_id", pl.col("window_start").dt.epoch("ms"))
                      .alias("alert_id"))
    )
    query = twin.write_memory("fraud_sql_twin").start(tmp_path / "chk-twin", "available-now")
    assert query.await_termination(timeout=300)
    want = alerts(mb.table("fraud_sql_twin"))
    assert want.height > 100
    assert sum(p["late_rows"] for p in query.recent_progress) > 50  # lateness is exercised
    assert_frame_equal(got, want)


def test_sql_alerts_equal_fraud_alerts_py_on_the_windows_the_watermark_closed(
    tmp_path: Path,
) -> None:
    fraud = fraud_job()
    rows = fraud.generated_transactions(rows=ROWS, cards=CARDS, seed=SEED, late_fraction=0.0,
                                        events_per_second=50.0)
    fraud.write_files(tmp_path / "in", rows, files=12)
    cli("run", PY_JOB, "--checkpoint", tmp_path / "chk-py", "--trigger", "available-now",
        "--param", f"input={tmp_path / 'in'}", "--param", "max_files_per_batch=2",
        "--param", f"output={tmp_path / 'py'}")
    python = alerts(pl.read_delta(str(tmp_path / "py")))

    got = run_sql(tmp_path, late_fraction=0.0)
    watermark = rows.select(pl.col("event_time").max().dt.epoch("ms")).item() - DELAY_MS
    closed = python.filter(pl.col("window_end") <= watermark)
    assert closed.height > 100
    assert python.height > closed.height  # the Python job fired the open windows early
    assert_frame_equal(got, closed)
