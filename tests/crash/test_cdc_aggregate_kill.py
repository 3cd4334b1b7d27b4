"""A group_by over a Delta Change Data Feed into Delta, under SIGKILL.

``jobs/cdc_group_totals.py`` reads a source table's feed (appends, UPDATEs of
values and of the group column, DELETEs, MERGEs: ``tests/cdf_history.py``)
and MERGEs totals per group into a Delta table. Killed at random moments and
restarted on its checkpoint, while the source keeps receiving commits
between runs, it must leave exactly a one-shot ``group_by`` over the source's
final state: groups whose rows were all deleted absent, nothing counted twice
or retracted twice (issue 28).
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import polars as pl
import pytest
from cdf_history import Source, one_shot
from deltalake import DeltaTable
from kill_helpers import run_with_kills
from polars.testing import assert_frame_equal

pytestmark = [pytest.mark.crash, pytest.mark.slow, pytest.mark.delta]

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "cdc_group_totals.py"


def command(chk: Path, src: str, out: Path) -> list[str]:
    return [
        sys.executable, "-m", "microbatch.cli", "run", str(JOB),
        "--checkpoint", str(chk), "--trigger", "available-now",
        "--param", f"input={src}", "--param", f"output={out}",
        "--param", "max_files_per_batch=1",
    ]  # fmt: skip


def totals(out: Path) -> pl.DataFrame:
    frame = pl.from_arrow(DeltaTable(str(out)).to_pyarrow_table())
    assert isinstance(frame, pl.DataFrame)
    return frame.select(
        pl.col("g").cast(pl.String), pl.col("rows").alias("n"), "counted", "total",
        pl.col("average").alias("avg"),
    ).sort("g")  # fmt: skip


def test_cdf_aggregate_under_sigkill_equals_one_shot_over_the_final_source(
    tmp_path: Path,
) -> None:
    rng = random.Random(int(os.environ.get("CRASH_SEED", "2829")))
    source = Source(tmp_path / "src", seed=11)
    out, chk = tmp_path / "out", tmp_path / "chk"
    ops: list[str] = []
    kills = 0
    for commits in (25, 15):  # a second round: the feed grows between runs
        ops += [source.commit() for _ in range(commits)]
        kills += run_with_kills(command(chk, source.path, out), chk, tmp_path / "stderr.log",
                                rng, kills=2, most_commits=6, most_delay_s=0.05)
        got, want = totals(out), one_shot(source.final())
        assert_frame_equal(got.drop("avg"), want.drop("avg"))
        assert_frame_equal(got.select("avg"), want.select("avg"), rel_tol=1e-12)
    assert kills == 4
    assert {"update_group", "delete", "merge"} <= set(ops), ops
