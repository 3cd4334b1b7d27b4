"""``jobs/fraud_alerts.sql`` and ``jobs/fraud_alerts_files.sql``: the fraud rule in
SQL (``HAVING`` under ``EMIT ON UPDATE``: fired once, early, then corrected; 1 h
of allowed lateness by ``SET``), run by ``microbatch sql``.

- On the generator, with late uploads, its alert table equals the rule of
  ``jobs/fraud_alerts.py`` (its ``alerts`` function) over the same generated
  batches, revision for revision, and the one-shot Polars count of every row
  (no upload is later than the allowance, so every late row counts).
- On replayed Parquet files (some uploads later than the allowance), its alert
  table equals ``jobs/fraud_alerts.py``'s, run by ``microbatch run`` on the same
  files and batches, row for row, revisions included, and the one-shot Polars
  count of the rows that were not too late.
"""

from __future__ import annotations

import importlib.util
import re
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
SQL_FILES_JOB = ROOT / "jobs" / "fraud_alerts_files.sql"
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


def alerts(frame: pl.DataFrame, *, revision: bool = True) -> pl.DataFrame:
    """Alert rows in one comparable shape (epoch-ms times, exact decimals)."""
    ms = [pl.col(c).dt.epoch("ms") for c in
          ("window_start", "window_end", "first_event_time", "last_event_time")]
    return frame.select(
        "alert_id", "card_id", *ms, pl.col("transactions").cast(pl.Int64),
        pl.col("total_amount").cast(pl.Decimal(38, 2)),
        pl.col("max_amount").cast(pl.Decimal(18, 2)),
        *(["revision"] if revision else []),
    ).sort("alert_id")


def one_shot(rows: pl.DataFrame) -> pl.DataFrame:
    """The oracle: every card's minutes with 3 or more of ``rows``, in one Polars query."""
    return alerts(
        rows.with_columns(window_start=pl.col("event_time").dt.truncate("1m"))
        .group_by("card_id", "window_start")
        .agg(pl.len().alias("transactions"), pl.col("amount").sum().alias("total_amount"),
             pl.col("amount").max().alias("max_amount"),
             pl.col("event_time").min().alias("first_event_time"),
             pl.col("event_time").max().alias("last_event_time"))
        .filter(pl.col("transactions") >= 3)
        .with_columns(window_end=pl.col("window_start") + pl.duration(minutes=1),
                      alert_id=pl.format("{}-{}", "card_id",
                                         pl.col("window_start").dt.epoch("ms"))),
        revision=False,
    )


def arrived_after_close(rows: pl.DataFrame) -> pl.Series:
    """Rows (in arrival order) whose minute had closed when they arrived: its end
    at or before the newest earlier event time minus the delay."""
    seen = pl.col("event_time").dt.epoch("ms").cum_max().shift(1)
    end = pl.col("event_time").dt.truncate("1m").dt.epoch("ms") + 60_000
    return rows.select((end <= seen - DELAY_MS).fill_null(False)).to_series()


def test_sql_alerts_equal_the_python_rule_on_the_generator_with_late_uploads(
    tmp_path: Path,
) -> None:
    fraud = fraud_job()
    out = tmp_path / "sql"
    cli("sql", SQL_JOB, "--checkpoint", tmp_path / "chk-sql", "--trigger", "available-now",
        "--param", f"rows={ROWS}", "--param", f"cards={CARDS}", "--param", f"seed={SEED}",
        "--param", "late_fraction=0.03", "--param", f"output={out}")
    got = alerts(pl.read_delta(str(out)))

    # The Python job's rule over the same generator batches, upserted by window.
    tx = mb.generate(rows_per_second=None, event_rate=50, start=fraud.START, total_rows=ROWS,
                     cards=CARDS, seed=SEED, late_fraction=0.03, max_records_per_batch=5000
                     ).with_columns(pl.col("amount").cast(fraud.MONEY))
    query = fraud.alerts(tx).write_memory("fraud_sql_twin", output_mode="update").start(
        tmp_path / "chk-twin", "available-now")
    assert query.await_termination(timeout=300)
    assert_frame_equal(got, alerts(mb.table("fraud_sql_twin")))
    assert got["revision"].max() >= 1  # fired early, then corrected

    rows = fraud.generated_transactions(rows=ROWS, cards=CARDS, seed=SEED, late_fraction=0.03)
    assert_frame_equal(got.drop("revision"), one_shot(rows))
    late = arrived_after_close(rows)
    assert late.sum() > 50  # uploads after their minute closed: counted, by the allowance
    assert one_shot(rows.filter(~late)).height < got.height


def test_sql_alerts_equal_fraud_alerts_py_on_replayed_parquet_files(tmp_path: Path) -> None:
    fraud = fraud_job()
    rows = fraud.generated_transactions(rows=ROWS, cards=CARDS, seed=SEED, late_fraction=0.03,
                                        late_by=("1m", "2h"))
    fraud.write_files(tmp_path / "in", rows, files=12)
    cli("run", PY_JOB, "--checkpoint", tmp_path / "chk-py", "--trigger", "available-now",
        "--param", f"input={tmp_path / 'in'}", "--param", "max_files_per_batch=2",
        "--param", f"output={tmp_path / 'py'}")
    cli("sql", SQL_FILES_JOB, "--checkpoint", tmp_path / "chk-sql", "--trigger",
        "available-now", "--param", f"input={tmp_path / 'in'}", "--param",
        "max_files_per_batch=2", "--param", f"output={tmp_path / 'sql'}")
    python = pl.read_delta(str(tmp_path / "py"))
    sql = pl.read_delta(str(tmp_path / "sql"))
    assert sql.columns == python.columns
    assert_frame_equal(sql.sort("alert_id"), python.sort("alert_id"))
    assert python.height > 100
    assert python["revision"].max() >= 1
    # some uploads were later than the hour allowed: dropped by both
    too_late = pl.read_delta(str(tmp_path / "py-late"))
    assert too_late.height > 0
    kept = rows.join(too_late.select("event_id"), on="event_id", how="anti")
    assert kept.height == rows.height - too_late.height
    assert_frame_equal(alerts(sql, revision=False), one_shot(kept))


def test_the_generator_and_files_scripts_share_the_rule() -> None:
    def rule(path: Path) -> str:
        text = path.read_text(encoding="utf-8")
        found = re.search(r"^SET .*?;$", text, re.M | re.S)
        insert = text[text.index("INSERT INTO"):]
        sink = re.search(r"CREATE TABLE fraud_alerts.*?;", text, re.S)
        assert found is not None
        assert sink is not None
        return "\n".join((found.group(0), sink.group(0), insert))

    assert rule(SQL_JOB) == rule(SQL_FILES_JOB)
    assert "EMIT ON UPDATE" in rule(SQL_JOB)
