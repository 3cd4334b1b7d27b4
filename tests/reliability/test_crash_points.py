"""Kill a real windowed job at every lifecycle point, inside state commits and at
random moments; stop it with SIGTERM; restart it each time on the same
checkpoint. The final output must equal the one-shot Polars result exactly.

Short runs: the long soak is ``scripts/crash_soak.py``.
"""

from __future__ import annotations

import signal
from pathlib import Path

import polars as pl
import pytest
from harness import (
    JobSpec,
    Kill,
    Soak,
    expected_output,
    input_rows,
    points_for,
    read_output,
    soak,
)

pytestmark = [pytest.mark.crash, pytest.mark.slow]


def assert_exact(run: Soak) -> None:
    """Nothing lost, nothing twice, nothing late, dead letters once."""
    verdict = run.verdict
    assert verdict is not None
    assert verdict.exact, f"{verdict}\nhistory: {run.history()}"
    assert verdict.rows_expected > 100, "too few windows closed to test anything"


def test_kill_at_every_lifecycle_point_and_state_write(tmp_path: Path) -> None:
    spec = JobSpec(rows=240_000, cap=4_000, window="10s")
    run = soak(spec, tmp_path, kills=len(points_for(spec)), seed=3, sigterms=1)

    assert_exact(run)
    assert not any(label.startswith("random") for label in run.killed_at())
    killed = {label.split("@")[0].removeprefix("state ") for label in run.killed_at()}
    assert killed == set(points_for(spec)), run.history()
    stops = [o for o in run.outcomes if o.kill.how == "sigterm"]
    assert stops, run.history()
    assert all(o.returncode == 0 and "SIGTERM" in o.stderr for o in stops), run.history()


def test_session_windows_over_files_survive_kills(tmp_path: Path) -> None:
    spec = JobSpec(source="files", agg="session", files=30, cap=1)
    named = ["after_execute", "sink.after_data", "after_state_commit",
             "after:changelog",  # between the two stores of a session window
             "torn:changelog", "after:snapshot"]
    run = soak(spec, tmp_path, kills=len(named) + 2, seed=5, named=named, sigterms=0)

    assert_exact(run)
    assert run.kills >= len(named), run.history()
    assert run.verdict is not None
    assert run.verdict.dead_letters == 2 * spec.files  # the bad lines, each exactly once


@pytest.mark.delta
def test_delta_sink_survives_kills_around_its_commit(tmp_path: Path) -> None:
    spec = JobSpec(source="files", sink="delta", files=24, cap=1)
    named = ["sink.before_commit", "sink.after_commit", "after_sink", "after_state_commit",
             "after_commit"]
    run = soak(spec, tmp_path, kills=len(named), seed=11, named=named, sigterms=0)

    assert_exact(run)
    assert run.kills == len(named), run.history()


def test_iceberg_sink_survives_kills_at_each_of_its_fault_points(tmp_path: Path) -> None:
    """Before the data files, between them and the catalog commit, after the
    commit (the engine's ``commits/N`` not written: the restart replays the
    batch, which the table's record turns into a no-op); each window once."""
    spec = JobSpec(source="files", sink="iceberg", files=12, cap=1)
    named = ["sink.before_data", "sink.before_commit", "sink.after_commit", "after_sink"]
    run = soak(spec, tmp_path, kills=len(named), seed=17, named=named, sigterms=0)

    assert_exact(run)
    assert [label.split("@")[0] for label in run.killed_at()] == named, run.history()


def test_random_kills(tmp_path: Path) -> None:
    # Enough work (~450 batches) that a kill up to 2.5 s after the start still
    # lands before the job has processed everything, on a fast machine too.
    spec = JobSpec(rows=1_800_000, cap=4_000, window="30s")
    run = soak(spec, tmp_path, kills=4, seed=13, named=[], sigterms=0)

    assert_exact(run)
    assert run.kills >= 3, run.history()


def test_sigterm_finishes_the_batch_in_flight_and_resumes_exactly(tmp_path: Path) -> None:
    run = Soak(JobSpec(rows=240_000, cap=4_000, window="10s"), tmp_path)
    run.prepare()

    stopped = run.run(Kill("sigterm"))

    assert stopped.returncode == 0, stopped.stderr
    assert "SIGTERM" in stopped.stderr
    assert "Traceback" not in stopped.stderr
    batch, pending = run.next_batch()
    assert not pending
    assert 0 < batch < 60, "the stop came too late to test anything"
    run.finish()
    assert_exact(run)
    assert run.outcomes[-1].returncode == 0
    assert -signal.SIGKILL not in [o.returncode for o in run.outcomes]


def test_kills_in_the_last_data_batch_and_the_final_no_data_batch(tmp_path: Path) -> None:
    # 240,000 rows in batches of 4,000: batches 0..59 hold data; batch 60 is the
    # no-data batch that emits what the final watermark closes
    run = Soak(JobSpec(rows=240_000, cap=4_000, window="10s"), tmp_path)
    run.prepare()

    for point, batch in [("after_commit", 59), ("after_sink", 60), ("after_state_commit", 60)]:
        killed = run.run(Kill("point", point=point, batch=batch))
        assert killed.killed, f"{point}@{batch}: {killed.stderr[-2000:]}"
    run.finish()

    assert_exact(run)
    assert (run.chk / "commits" / "60").exists()
    assert not (run.chk / "offsets" / "61").exists()


def test_fire_once_alerts_fire_once_across_kills(tmp_path: Path) -> None:
    """Early alerts (fire_once over a 10 s window): every window that reaches the
    threshold fires exactly once, whatever batch a kill lands in, on a fresh run
    of the same log or across many restarts."""
    spec = JobSpec(agg="fire_once", rows=120_000, cap=3_000, window="10s", cards=2_000)
    named = ["after_execute", "sink.after_data", "after_sink", "after_state_commit",
             "after_commit", "after:changelog", "torn:changelog"]
    run = soak(spec, tmp_path, kills=len(named) + 2, seed=17, named=named, sigterms=0)

    assert_exact(run)
    assert run.kills >= len(named), run.history()
    assert run.verdict is not None
    # the alerts fired early: some with fewer rows than their window ended up holding
    out = read_output(spec, run.work / "out")
    want = expected_output(spec, input_rows(spec))
    early = out.join(want, on=["window_start", "card_id"]).filter(pl.col("n") < pl.col("n_right"))
    assert early.height > 0


@pytest.mark.delta
def test_pipelined_job_survives_kills_at_every_lifecycle_point(tmp_path: Path) -> None:
    """``--pipelined``: a batch's Delta commit and ``commits/N`` run beside the next
    batch's write-ahead, read, execute and state commit, so a kill may leave two
    batches uncommitted; every point of both threads, a SIGTERM (which lets the
    batch in flight finish) and random kills; the output stays exact."""
    spec = JobSpec(source="files", sink="delta", files=24, cap=1, pipelined=True)
    run = soak(spec, tmp_path, kills=len(points_for(spec)) + 2, seed=19, sigterms=1)

    assert_exact(run)
    killed = {label.split("@")[0].removeprefix("state ") for label in run.killed_at()}
    assert killed >= set(points_for(spec)), run.history()
