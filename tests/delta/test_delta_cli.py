"""``microbatch backfill`` of the example job and ``microbatch diff``, as real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from delta_helpers import append_versions, operations, transactions
from deltalake import write_deltalake
from polars.testing import assert_frame_equal

pytestmark = pytest.mark.delta

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "jobs" / "daily_totals.py"
CLI = [sys.executable, "-m", "microbatch.cli"]
KEY = "day,card_id"


def cli(*args: str | Path, env: dict[str, str] | None = None,
        timeout: float = 90) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MICROBATCH_FAULT")}
    return subprocess.run([*CLI, *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**base, **(env or {})}, check=False)


def one_shot_daily_totals(table: Path, late: pl.DataFrame | None = None) -> pl.DataFrame:
    """What the job's table must hold, computed in one Polars query over the whole
    input table: every day's totals (the job MERGEs each day as it changes), without
    the rows the job sent to the late output."""
    rows = pl.read_delta(str(table)).with_columns(pl.col("amount").cast(pl.Decimal(18, 2)))
    if late is not None and late.height:
        rows = rows.join(late.select("event_id"), on="event_id", how="anti")
    return (
        rows.group_by(pl.col("event_time").dt.truncate("1d").alias("window_start"), "card_id")
        .agg(pl.len().cast(pl.Int64).alias("transactions"),
             pl.col("amount").sum().alias("total_amount"),
             pl.col("amount").max().alias("max_amount"))
        .with_columns((pl.col("window_start") + pl.duration(days=1)).alias("window_end"),
                      pl.col("window_start").dt.date().alias("day"))
        .select("day", "window_start", "window_end", "card_id", "transactions", "total_amount",
                "max_amount")
        .sort("day", "card_id")
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
    got = pl.read_delta(str(out)).sort("day", "card_id")
    assert_frame_equal(got, one_shot_daily_totals(lake))  # decimal money: exact


def test_backfill_killed_midway_resumes_exactly(lake: Path, tmp_path: Path) -> None:
    out, chk = tmp_path / "daily", tmp_path / "chk"
    killed = backfill(lake, chk, out, env={"MICROBATCH_FAULT": "sink.after_commit@3"})
    assert killed.returncode == -9
    done = backfill(lake, chk, out)
    assert done.returncode == 0, done.stderr
    first = next(ln for ln in done.stderr.splitlines() if ln.startswith("backfill batch"))
    assert first.startswith("backfill batch 3: versions 2/6 │")  # resumed at batch 3's range
    got = pl.read_delta(str(out)).sort("day", "card_id")
    assert_frame_equal(got, one_shot_daily_totals(lake))  # decimal money: exact


def corrections(day: int, ids: range) -> pl.DataFrame:
    """Ledger corrections booked later: refunds of -1.00 on ``day`` of January 2026."""
    base = transactions(ids.start, len(ids))
    return base.with_columns(
        pl.lit(-1.0).alias("amount"),
        (pl.datetime(2026, 1, day, 12, time_zone="UTC")
         + pl.duration(seconds=pl.col("event_id") % 1000))
        .dt.cast_time_unit("us").alias("event_time"),
    )


def test_late_corrections_update_their_day_and_older_ones_go_late(
    lake: Path, tmp_path: Path
) -> None:
    out, chk = tmp_path / "daily", tmp_path / "chk"
    run = ["run", JOB, "--checkpoint", chk, "--trigger", "available-now", "--param",
           f"input={lake}", "--param", f"output={out}", "--param", "allowed_lateness=5d"]
    assert cli(*run).returncode == 0
    before = pl.read_delta(str(out))
    # the input ends on Jan 20: day 17 is within 5 days of the watermark, day 3 is not
    append_versions(str(lake), [corrections(17, range(90_000, 90_020)),
                                corrections(3, range(91_000, 91_010))])
    done = cli(*run)
    assert done.returncode == 0, done.stderr
    late = pl.read_delta(f"{out}-late")
    assert sorted(late["event_id"].to_list()) == list(range(91_000, 91_010))
    assert late["late_reason"].str.contains("of allowed lateness").all()
    got = pl.read_delta(str(out)).sort("day", "card_id")
    assert_frame_equal(got, one_shot_daily_totals(lake, late))  # day 17 corrected in place
    day17 = pl.col("day") == pl.date(2026, 1, 17)
    assert (got.filter(day17)["total_amount"].sum()
            == before.filter(day17)["total_amount"].sum() - 20)
    assert got.height == before.height  # MERGEd: one row per day and card, still


def test_restating_one_day_replaces_its_rows_and_touches_no_other(
    lake: Path, tmp_path: Path
) -> None:
    out = tmp_path / "daily"
    assert backfill(lake, tmp_path / "chk", out).returncode == 0
    # the table goes wrong: day 3 by a bug, day 4 by a hand edit finance wants to keep
    rows = pl.read_delta(str(out))
    damaged = rows.with_columns(
        pl.when(pl.col("day") == pl.date(2026, 1, 3)).then(pl.lit(0)).otherwise("transactions")
        .alias("transactions"),
        pl.when(pl.col("day") == pl.date(2026, 1, 4)).then(pl.col("max_amount") + 1)
        .otherwise("max_amount").cast(rows.schema["max_amount"]).alias("max_amount"),
    )
    write_deltalake(str(out), damaged.to_arrow(), mode="overwrite")
    version = len(operations(str(out)))
    done = backfill(lake, tmp_path / "chk-restate", out, "--replace-where", "day = '2026-01-03'")
    assert done.returncode == 0, done.stderr
    assert "restated" in done.stdout
    assert "the other rows are unchanged" in done.stdout
    got = pl.read_delta(str(out)).sort("day", "card_id")
    want = one_shot_daily_totals(lake)
    day3, day4 = pl.col("day") == pl.date(2026, 1, 3), pl.col("day") == pl.date(2026, 1, 4)
    assert_frame_equal(got.filter(day3), want.filter(day3))
    assert_frame_equal(got.filter(~day3).sort("day", "card_id"),
                       damaged.filter(~day3).sort("day", "card_id"))  # untouched
    assert got.filter(day4)["max_amount"].to_list() != want.filter(day4)["max_amount"].to_list()
    assert len(operations(str(out))) == version + 1  # one commit
    again = backfill(lake, tmp_path / "chk-restate", out, "--replace-where", "day = '2026-01-03'")
    assert again.returncode == 2
    assert "use a new --checkpoint" in again.stderr
    assert "an interrupted restatement replaced nothing" in again.stderr


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
    assert "needs --param output=TEXT" in result.stderr  # the job's declared Params
    assert "Traceback" not in result.stderr
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
