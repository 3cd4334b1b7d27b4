"""Issue 30's check on ``jobs/fraud_alerts.py``: the job runs live over Parquet
files with a SIGKILL after a sink commit and a restart; ``microbatch replay``
then runs its checkpoint into a new alert table, with another batch cap (a
replay ignores caps: the ranges are recorded), SIGKILLed after a state commit
and resumed by the same command; the replayed tables are identical bit for bit
to the live ones (``microbatch diff``'s comparison, frame equality) and the live one
equals the batch recompute of ``tests/jobs/test_fraud_alerts_job.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from microbatch.tools.diff import diff_frames
from tests.jobs.test_fraud_alerts_job import (
    FILES,
    JOB,
    MINUTE_MS,
    PER_BATCH,
    ROOT,
    job,
    run,
    simulate,
    table,
)

pytestmark = [pytest.mark.slow, pytest.mark.crash, pytest.mark.delta]


def replay(params: dict[str, str], old: Path, new: Path, *,
           fault: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROBATCH_FAULT")}
    env["PYTHONPATH"] = str(ROOT)
    if fault:
        env["MICROBATCH_FAULT"] = fault
    cmd = [sys.executable, "-m", "microbatch.cli", "replay", str(JOB), "--from", str(old),
           "--checkpoint", str(new),
           *[a for k, v in params.items() for a in ("--param", f"{k}={v}")]]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)


def test_a_replay_of_the_killed_live_run_killed_itself_is_identical_bit_for_bit(
    tmp_path: Path,
) -> None:
    fraud = job()
    data = fraud.generated_transactions(rows=4_000, cards=120, events_per_second=50.0,
                                        late_fraction=0.03, late_by=("1m", "2h"), seed=5)
    fraud.write_files(tmp_path / "in", data, files=FILES)
    late_ids, want = simulate(data)
    assert late_ids
    assert want.height > 20
    live = {"input": str(tmp_path / "in"), "max_files_per_batch": str(PER_BATCH),
            "output": str(tmp_path / "alerts"), "late_output": str(tmp_path / "late")}
    assert run(live, tmp_path / "chk", fault="sink.after_commit@3") == -9
    assert run(live, tmp_path / "chk") == 0
    again = {**live, "max_files_per_batch": "5", "output": str(tmp_path / "replay"),
             "late_output": str(tmp_path / "replay-late")}

    killed = replay(again, tmp_path / "chk", tmp_path / "chk-replay",
                    fault="after_state_commit@5")
    resumed = replay(again, tmp_path / "chk", tmp_path / "chk-replay")

    assert killed.returncode == -9, killed.stderr[-3000:]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "replay batch 5/" in resumed.stderr
    assert "[recovered]" in resumed.stderr
    expected = want.select(
        "alert_id", "card_id", "ws", pl.lit(MINUTE_MS).alias("len_ms"), "transactions",
        "total_amount", "max_amount", pl.col("first_event_time").dt.epoch("ms"),
        pl.col("last_event_time").dt.epoch("ms"),
    ).sort("alert_id")
    got = table(tmp_path / "alerts")
    assert got.equals(expected.cast(dict(got.schema)))  # type: ignore[arg-type]
    for a, b, key in (("alerts", "replay", "alert_id"), ("late", "replay-late", "event_id")):
        was = pl.read_delta(str(tmp_path / a)).sort(key)
        assert pl.read_delta(str(tmp_path / b)).sort(key).equals(was), (a, b)
    same = diff_frames(pl.read_delta(str(tmp_path / "alerts")),
                       pl.read_delta(str(tmp_path / "replay")), keys=["alert_id"],
                       rel_tolerance=0)  # what `microbatch diff` compares (the README runs it)
    assert same.equal, same.to_json()
