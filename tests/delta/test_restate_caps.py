"""Restating a day of the finance job (``microbatch backfill --replace-where``)
is right for any batch cap, as real processes on real Delta tables.

The live job sent a refund booked 12 days late (past its 7-day allowance) to
its late table, so the live total of that day lacks it. The restatement holds
the watermark (no row is late in the replay) and stages its side outputs, so
for caps 1, 3 and none: the day equals the one-shot total of *all* its rows,
refund included; every other day's rows and the Delta files holding no row of
that day are untouched; the live late table is not written to.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest
from delta_helpers import append_versions, transactions
from deltalake import DeltaTable
from polars.testing import assert_frame_equal

from tests.delta.test_delta_cli import JOB, cli, one_shot_daily_totals

pytestmark = pytest.mark.delta

DAY = "2026-01-02"
PREDICATE = f"day = '{DAY}'"
IS_DAY = pl.col("day") == pl.date(2026, 1, 2)


@dataclass(frozen=True)
class Live:
    """The live job's tables after it ran (read-only: tests copy them)."""

    root: Path
    lake: Path
    out: Path

    @property
    def late(self) -> Path:
        return Path(f"{self.out}-late")


def refund(event_id: int) -> pl.DataFrame:
    """A refund of -50.00 on card 1, at noon on the restated day."""
    row = transactions(event_id, 1, cards=3)
    return row.with_columns(
        pl.lit(1, pl.Int64).alias("card_id"),
        pl.lit(-50.0).alias("amount"),
        pl.lit(f"{DAY} 12:00:00").str.to_datetime(time_unit="us", time_zone="UTC")
        .alias("event_time"),
    )


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Live:
    """Jan 1-14, 4 rows a day on 3 cards, in 7 versions of 2 days; the live job
    runs; then the refund for Jan 2 is booked on Jan 14 and the job runs again."""
    root = tmp_path_factory.mktemp("restate")
    lake, out = root / "lake" / "transactions", root / "lake" / "daily"
    append_versions(str(lake), [transactions(i * 8, 8, minutes_per_row=360, cards=3)
                                for i in range(7)])
    run = ["run", JOB, "--checkpoint", root / "chk-live", "--trigger", "available-now",
           "--param", f"input={lake}", "--param", f"output={out}"]
    assert cli(*run).returncode == 0
    append_versions(str(lake), [refund(10_000)])
    done = cli(*run)
    assert done.returncode == 0, done.stderr
    live = Live(root, lake, out)
    late = pl.read_delta(str(live.late))
    assert late["event_id"].to_list() == [10_000]  # 12 days late: past the 7d allowance
    want = one_shot_daily_totals(lake)
    got = pl.read_delta(str(out)).sort("day", "card_id")
    assert not got.filter(IS_DAY).equals(want.filter(IS_DAY))  # the live day lacks it
    return live


def copy_tables(live: Live, into: Path) -> tuple[Path, Path]:
    """This test's own copy of the live output and late tables."""
    out = into / "daily"
    shutil.copytree(live.out, out)
    shutil.copytree(live.late, f"{out}-late")
    return out, Path(f"{out}-late")


@dataclass(frozen=True)
class Before:
    """The copied tables before a restatement."""

    rows: pl.DataFrame
    files_without_the_day: set[str]
    version: int
    late_version: int


def before(out: Path, late: Path) -> Before:
    table = DeltaTable(str(out))
    return Before(
        rows=pl.read_delta(str(out)).sort("day", "card_id"),
        files_without_the_day={uri for uri in table.file_uris()
                               if pl.read_parquet(uri).filter(IS_DAY).height == 0},
        version=table.version(),
        late_version=DeltaTable(str(late)).version(),
    )


def restate(live: Live, out: Path, chk: Path, cap: int | None,
            env: dict[str, str] | None = None) -> str:
    """Run the restatement of the day; its stdout (exit 0 asserted)."""
    caps = [] if cap is None else ["--param", f"max_files_per_batch={cap}"]
    done = cli("backfill", JOB, "--checkpoint", chk, "--param", f"input={live.lake}",
               "--param", f"output={out}", *caps, "--replace-where", PREDICATE, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def assert_restated(live: Live, out: Path, late: Path, was: Before) -> None:
    got = pl.read_delta(str(out)).sort("day", "card_id")
    want = one_shot_daily_totals(live.lake)  # every row, the refund included
    assert_frame_equal(got.filter(IS_DAY), want.filter(IS_DAY))
    assert_frame_equal(got.filter(~IS_DAY), was.rows.filter(~IS_DAY))  # untouched
    table = DeltaTable(str(out))
    assert was.files_without_the_day <= set(table.file_uris())  # other days' files kept
    assert table.version() == was.version + 1  # one commit
    assert DeltaTable(str(late)).version() == was.late_version  # never written to
    assert pl.read_delta(str(late))["event_id"].to_list() == [10_000]


@pytest.mark.parametrize("cap", [1, 3, None])
def test_restating_a_day_is_right_for_any_batch_cap(
    live: Live, tmp_path: Path, cap: int | None
) -> None:
    out, late = copy_tables(live, tmp_path)
    was = before(out, late)
    said = restate(live, out, tmp_path / "chk", cap)
    assert f"restated 3 rows where {PREDICATE}" in said  # one row per card
    assert "side outputs" not in said  # nothing late in the replay
    assert_restated(live, out, late, was)


def test_a_restatement_killed_midway_replaces_nothing_and_reruns_on_a_new_checkpoint(
    live: Live, tmp_path: Path
) -> None:
    out, late = copy_tables(live, tmp_path)
    was = before(out, late)
    killed = cli("backfill", JOB, "--checkpoint", tmp_path / "chk", "--param",
                 f"input={live.lake}", "--param", f"output={out}", "--param",
                 "max_files_per_batch=1", "--replace-where", PREDICATE,
                 env={"MICROBATCH_FAULT": "after_commit@4"})
    assert killed.returncode == -9
    assert DeltaTable(str(out)).version() == was.version  # nothing replaced yet
    # the same checkpoint is refused, saying so (tests/delta/test_delta_cli.py)
    restate(live, out, tmp_path / "chk-2", 1)
    assert_restated(live, out, late, was)
