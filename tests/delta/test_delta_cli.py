"""``microbatch backfill`` of the example job and ``microbatch diff``, as real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest
from delta_helpers import append_versions, transactions
from deltalake import write_deltalake
from polars.testing import assert_frame_equal

pytestmark = pytest.mark.delta

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "jobs" / "daily_totals.py"
CLI = [sys.executable, "-m", "microbatch.cli"]
KEY = "window_start,card_id"


def cli(*args: str | Path, env: dict[str, str] | None = None,
        timeout: float = 90) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MICROBATCH_FAULT")}
    return subprocess.run([*CLI, *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**base, **(env or {})}, check=False)


def one_shot_daily_totals(table: Path, delay: timedelta = timedelta(hours=1)) -> pl.DataFrame:
    """What the job must write, computed in one Polars query over the whole table."""
    rows = pl.read_delta(str(table)).with_columns(pl.col("amount").cast(pl.Decimal(18, 2)))
    watermark = rows["event_time"].max() - delay  # type: ignore[operator]
    return (
        rows.group_by(pl.col("event_time").dt.truncate("1d").alias("window_start"), "card_id")
        .agg(pl.len().cast(pl.Int64).alias("transactions"),
             pl.col("amount").sum().alias("total_amount"),
             pl.col("amount").max().alias("max_amount"))
        .with_columns((pl.col("window_start") + pl.duration(days=1)).alias("window_end"))
        .filter(pl.col("window_end") <= watermark)
        .select("window_start", "window_end", "card_id", "transactions", "total_amount",
                "max_amount")
        .sort("window_start", "card_id")
    )


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    """A transactions table of 12 versions, about 19 days of events."""
    table = tmp_path / "lake" / "transactions"
    append_versions(str(table), [transactions(i * 350, 350) for i in range(12)])
    return table


def backfill(lake: Path, chk: Path, out: Path, *extra: str,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return cli("backfill", JOB, "--checkpoint", chk, "--param", f"input={lake}",
               "--param", f"output={out}", "--param", "max_files_per_batch=2", *extra, env=env)


def test_backfill_equals_the_one_shot_computation(lake: Path, tmp_path: Path) -> None:
    out = tmp_path / "daily"
    done = backfill(lake, tmp_path / "chk", out)
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("backfill batch")]
    assert lines[0].startswith("backfill batch 0: versions 2/12 │ files 2/12 │ rows 700/4,200")
    assert "rows 4,200/4,200 (100.0%)" in lines[-1]
    assert "ETA" in lines[-1]
    got = pl.read_delta(str(out)).sort("window_start", "card_id")
    assert_frame_equal(got, one_shot_daily_totals(lake))  # decimal money: exact


def test_backfill_killed_midway_resumes_exactly(lake: Path, tmp_path: Path) -> None:
    out, chk = tmp_path / "daily", tmp_path / "chk"
    killed = backfill(lake, chk, out, env={"MICROBATCH_FAULT": "sink.after_commit@3"})
    assert killed.returncode == -9
    done = backfill(lake, chk, out)
    assert done.returncode == 0, done.stderr
    first = next(ln for ln in done.stderr.splitlines() if ln.startswith("backfill batch"))
    assert first.startswith("backfill batch 3: versions 2/6 │")  # resumed at batch 3's range
    got = pl.read_delta(str(out)).sort("window_start", "card_id")
    assert_frame_equal(got, one_shot_daily_totals(lake))  # decimal money: exact


def test_diff_exit_codes_and_report(lake: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert backfill(lake, tmp_path / "chk-a", a).returncode == 0
    assert backfill(lake, tmp_path / "chk-b", b).returncode == 0
    same = cli("diff", a, b, "--key", KEY)
    assert same.returncode == 0, same.stderr
    assert "equal" in same.stdout

    # seed differences into B: one row changed, one removed, one added
    rows = pl.read_delta(str(b)).sort("window_start", "card_id")
    changed_key = rows.row(3, named=True)
    seeded = (
        rows.with_columns(
            pl.when((pl.col("window_start") == changed_key["window_start"])
                    & (pl.col("card_id") == changed_key["card_id"]))
            .then(pl.col("total_amount") + 1).otherwise(pl.col("total_amount"))
            .alias("total_amount"))
        .slice(1)
        .vstack(rows.head(1).with_columns(card_id=pl.lit(999, pl.Int64)))
    )
    write_deltalake(str(b), seeded.to_arrow(), mode="overwrite")
    differ = cli("diff", a, b, "--key", KEY, "--json")
    assert differ.returncode == 1, differ.stderr
    report = json.loads(differ.stdout)
    assert (report["only_in_a"], report["only_in_b"], report["changed"]) == (1, 1, 1)
    assert report["changed_columns"] == {"total_amount": 1}
    assert report["sample_changed"][0]["card_id"] == changed_key["card_id"]
    assert report["sample_only_in_b"][0]["card_id"] == 999
    text = cli("diff", a, b, "-k", "window_start", "-k", "card_id")
    assert text.returncode == 1
    assert "only in A" in text.stdout
    assert "different" in text.stdout
    assert cli("diff", a, b, "--key", KEY, "--tolerance", "2").returncode == 1  # rows differ

    missing = cli("diff", a, tmp_path / "nope", "--key", KEY)
    assert missing.returncode == 2
    assert "cannot read Delta table" in missing.stderr
    not_unique = cli("diff", a, b, "--key", "card_id")
    assert not_unique.returncode == 2
    assert "not unique" in not_unique.stderr
    assert "Traceback" not in missing.stderr + not_unique.stderr


def test_backfill_job_errors_are_clear(tmp_path: Path) -> None:
    result = cli("backfill", JOB, "--checkpoint", tmp_path / "chk", "--param", "input=x")
    assert result.returncode == 2
    assert "--param output=TABLE" in result.stderr
    result = cli("backfill", JOB, "--checkpoint", tmp_path / "chk",
                 "--param", f"input={tmp_path / 'none'}", "--param", f"output={tmp_path / 'o'}")
    assert result.returncode == 2
    assert "no Delta table" in result.stderr


def test_diff_frames_float_tolerance_and_multisets() -> None:
    from microbatch.tools.diff import diff_frames

    a = pl.DataFrame({"k": [1, 2, None], "x": [0.1 + 0.2, float("nan"), 1.0]})
    b = pl.DataFrame({"k": [1, 2, None], "x": [0.3, float("nan"), 1.0]})
    assert diff_frames(a, b, keys=["k"]).equal  # last-bit difference of a sum
    exact = diff_frames(a, b, keys=["k"], rel_tolerance=0)
    assert (exact.changed, exact.changed_columns) == (1, {"x": 1})
    twice = pl.concat([a, a.head(1)])
    whole = diff_frames(twice, a, rel_tolerance=0)
    assert (whole.only_in_a, whole.only_in_b, whole.changed) == (1, 0, 0)
    assert diff_frames(a, b.rename({"x": "y"})).schema_differences == [
        "column 'x' (Float64) is only in A", "column 'y' (Float64) is only in B"]
