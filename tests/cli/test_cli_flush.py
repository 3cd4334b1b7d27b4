"""``microbatch run --trigger available-now [--flush]``, as a real subprocess: the
note of a caught-up checkpoint, the flush of the windows still open, and the
refusal of ``--flush`` with an interval trigger."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
from polars.testing import assert_frame_equal

import microbatch as mb
from tests.oracles import tumbling_or_hopping

CLI = [sys.executable, "-m", "microbatch.cli"]
REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 1, 1, tzinfo=UTC)

JOB = '''
from dataclasses import dataclass

import polars as pl
import microbatch as mb

@dataclass(frozen=True)
class Params:
    input: str
    output: str

def build(params: Params):
    schema = {"card": pl.Int64, "ts": pl.Datetime("ms", "UTC"), "amount": pl.Int64}
    return (mb.read_files(params.input, format="parquet", schema=schema,
                          max_files_per_batch=1)
            .with_watermark("ts", "30s")
            .group_by(mb.window("ts", "1m"), "card")
            .agg(pl.len().alias("n"), pl.col("amount").sum().alias("total"))
            .write_parquet(params.output))
'''


def setup(tmp_path: Path) -> tuple[Path, pl.DataFrame]:
    """The job file and its input: three files of events; returns (job, all rows)."""
    seconds = [0, 10, 50, 70, 130, 200, 205, 290]
    rows = pl.DataFrame({
        "card": [s % 3 for s in seconds],
        "ts": [T0 + timedelta(seconds=s) for s in seconds],
        "amount": list(range(1, len(seconds) + 1)),
    }, schema={"card": pl.Int64, "ts": pl.Datetime("ms", "UTC"), "amount": pl.Int64})
    (tmp_path / "in").mkdir()
    for i, part in enumerate(rows.iter_slices(3)):
        part.write_parquet(tmp_path / "in" / f"part-{i}.parquet")
    job = tmp_path / "job.py"
    job.write_text(JOB)
    return job, rows


def run(tmp_path: Path, job: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROBATCH_FAULT")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [*CLI, "run", str(job), "--checkpoint", str(tmp_path / "chk"),
         "--param", f"input={tmp_path / 'in'}", "--param", f"output={tmp_path / 'out'}",
         *extra],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env, check=False,
    )


def oracle(rows: pl.DataFrame) -> pl.DataFrame:
    found = tumbling_or_hopping(
        rows, time="ts", keys=["card"], size_ms=60_000, slide_ms=60_000,
        aggs=[pl.len().cast(pl.Int64).alias("n"), pl.col("amount").sum().alias("total")],
    )
    return found.select("ws", "we", "card", "n", "total").sort("ws", "card")


def written(out: Path) -> pl.DataFrame:
    return mb.parquet_table(out).select(
        pl.col("window_start").dt.epoch("ms").alias("ws"),
        pl.col("window_end").dt.epoch("ms").alias("we"), "card", "n", "total",
    ).sort("ws", "card")


def test_a_caught_up_checkpoint_says_nothing_new_and_exits_0(tmp_path: Path) -> None:
    job, _ = setup(tmp_path)
    first = run(tmp_path, job, "--trigger", "available-now")
    assert first.returncode == 0, first.stderr
    assert "nothing new" not in first.stderr
    height = mb.parquet_table(tmp_path / "out").height

    again = run(tmp_path, job, "--trigger", "available-now")

    assert again.returncode == 0, again.stderr
    text = " ".join(again.stderr.split())
    assert "Traceback" not in text
    assert "nothing new since batch 3" in text  # batches 0-2 (a file each), 3 (no data)
    assert str(tmp_path / "chk") in text
    assert "new checkpoint directory" in text
    assert text.count("nothing new since") == 1  # once, not again as a log line
    assert mb.parquet_table(tmp_path / "out").height == height


def test_flush_emits_every_open_window_and_a_rerun_is_caught_up(tmp_path: Path) -> None:
    job, rows = setup(tmp_path)

    flushed = run(tmp_path, job, "--trigger", "available-now", "--flush")

    assert flushed.returncode == 0, flushed.stderr
    assert_frame_equal(written(tmp_path / "out"), oracle(rows))
    again = run(tmp_path, job, "--trigger", "available-now", "--flush")
    assert again.returncode == 0, again.stderr
    assert "nothing new since batch 4" in " ".join(again.stderr.split())  # 4: the flush
    assert_frame_equal(written(tmp_path / "out"), oracle(rows))


def test_flush_with_an_interval_trigger_is_refused_with_exit_2(tmp_path: Path) -> None:
    job, _ = setup(tmp_path)

    result = run(tmp_path, job, "--trigger", "10s", "--flush")

    assert result.returncode == 2, (result.stdout, result.stderr)
    text = " ".join(result.stderr.split())
    assert "Traceback" not in text
    assert text.startswith("error:")
    assert "--flush" in text
    assert "bounded trigger" in text
    assert "'10s'" in text
    assert not (tmp_path / "chk").exists()
