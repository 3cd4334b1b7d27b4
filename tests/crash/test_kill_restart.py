"""Kill -9 a real job process, restart it on the same checkpoint, repeat.

The final output must equal one clean computation exactly: nothing lost,
nothing twice. Random kill moments, plus a self-kill at every named point
of the lifecycle (``MICROBATCH_FAULT``), with real processes and files.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from kill_helpers import run_with_kills

import microbatch as mb
from microbatch.sources.generator import GeneratorSource

pytestmark = [pytest.mark.crash, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "generated_to_parquet.py"
ROWS, CAP = 1_200_000, 2_000


def command(chk: Path, out: Path, durability: str = "fsync") -> list[str]:
    return [
        sys.executable,
        "-m",
        "microbatch.cli",
        "run",
        str(JOB),
        "--checkpoint",
        str(chk),
        "--trigger",
        "available-now",
        "--param",
        f"output={out}",
        "--param",
        f"rows={ROWS}",
        "--param",
        f"max_records_per_batch={CAP}",
        "--durability",
        durability,
    ]


def expected() -> pl.DataFrame:
    src = GeneratorSource(
        rows_per_second=None,
        total_rows=ROWS,
        seed=7,
        cards=1_000,
        start="2026-01-01T00:00:00+00:00",
    )
    o = src.initial_offset()
    rows = src.read(o, src.latest_offset(o, capped=False)).data
    return rows.filter(pl.col("amount") >= 20).select("event_id", "card_id", "amount", "event_time")


def assert_exact(out: Path) -> None:
    got = mb.parquet_table(out)
    want = expected()
    dupes = got.height - got["event_id"].n_unique()
    assert dupes == 0, f"{dupes} rows written twice"
    assert got.sort("event_id").equals(want), (
        f"{want.height - got.height} rows missing" if got.height < want.height else "rows differ"
    )


def test_sigkill_at_random_moments(tmp_path: Path) -> None:
    """Kill after a random number of new commits plus a random delay, so every
    kill lands mid-run however slow the machine is; the last run finishes."""
    chk, out = tmp_path / "chk", tmp_path / "out"
    rng = random.Random(int(os.environ.get("CRASH_SEED", "1234")))
    kills = run_with_kills(command(chk, out), chk, tmp_path / "stderr.log", rng, kills=6,
                           most_commits=40, most_delay_s=0.01)
    assert kills == 6
    assert_exact(out)


@pytest.mark.parametrize("durability", ["fsync", "process"])
@pytest.mark.parametrize(
    "point",
    ["after_write_ahead", "after_execute", "sink.after_data", "after_sink", "after_commit"],
)
def test_self_kill_at_named_point_then_restart(
    tmp_path: Path, point: str, durability: str
) -> None:
    """``durability="process"`` skips the fsyncs: a killed process must still
    leave a checkpoint that restarts exactly (the kernel keeps the writes)."""
    chk, out = tmp_path / "chk", tmp_path / "out"
    run = command(chk, out, durability)
    env = {**os.environ, "MICROBATCH_FAULT": f"{point}@2"}
    first = subprocess.run(run, env=env, capture_output=True, timeout=120, cwd=ROOT)
    assert first.returncode == -signal.SIGKILL
    env.pop("MICROBATCH_FAULT")
    second = subprocess.run(run, env=env, capture_output=True, timeout=120, cwd=ROOT)
    assert second.returncode == 0, second.stderr.decode()
    assert_exact(out)
    assert (chk / "commits" / str(ROWS // CAP - 1)).exists()
