"""A scaled-out job survives SIGKILLs of its driver and of its Ray workers, and
restarts with a different number of workers, with exactly the rows one
process computes (the oracle: the same job file run with the local executor).

Every run is ``microbatch run JOB --workers N --ray-address ADDR`` in a fresh
process against the session's Ray cluster; kills are real SIGKILLs: of the
driver (named fault points, or from outside at random moments) and of the
worker processes (a fault point inside the worker, or ``os.kill`` of a
``ray::ShardWorker`` process from outside).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import determinism_queries as queries
import polars as pl
import pytest

import microbatch as mb
from microbatch.cli.jobfile import build_writer
from microbatch.observability.progress import load_progress

JOB = Path(__file__).resolve().parent / "jobs" / "windowed_sessions.py"
pytestmark = pytest.mark.slow


def _cli(args: list[str], env: dict[str, str] | None = None, timeout: float = 240
         ) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
    for name in ("MICROBATCH_FAULT", "MICROBATCH_FAULT_ONCE"):
        if env is None or name not in env:
            full.pop(name, None)
    return subprocess.run([sys.executable, "-m", "microbatch.cli", *args], env=full,
                          capture_output=True, text=True, timeout=timeout)


def _run_args(out: Path, chk: Path, kind: str, workers: int | None, address: str | None,
              *, batch: int = 1500) -> list[str]:
    args = ["run", str(JOB), "--checkpoint", str(chk), "--trigger", "available-now",
            "--param", f"output={out}", "--param", f"kind={kind}", "--param", f"batch={batch}"]
    if workers is not None:
        args += ["--workers", str(workers)]
    if address is not None:
        args += ["--ray-address", address]
    return args


_oracles: dict[tuple[str, int], pl.DataFrame] = {}
_oracle_late: dict[tuple[str, int], list[int]] = {}


def _oracle(kind: str, tmp: Path, batch: int) -> pl.DataFrame:
    """The job's rows run once in this process on the local executor."""
    if (kind, batch) not in _oracles:
        out = tmp / f"oracle-{kind}-{batch}"
        writer = build_writer(JOB, {"output": str(out), "kind": kind, "batch": str(batch)})
        query = writer.start(tmp / f"oracle-chk-{kind}-{batch}", trigger="available-now")
        assert query.await_termination(300)
        assert query.exception is None
        _oracles[kind, batch] = mb.parquet_table(out)
        _oracle_late[kind, batch] = _late_rows(tmp / f"oracle-chk-{kind}-{batch}")
    return _oracles[kind, batch]


def _assert_exactly_the_oracle(out: Path, kind: str, tmp: Path, batch: int = 1500) -> None:
    got, want = mb.parquet_table(out), _oracle(kind, tmp, batch)
    assert want.height > 150
    assert got.height == want.height, f"{got.height} rows, the oracle has {want.height}"
    key = ["window_start", "card_id"]
    assert got.select(key).is_duplicated().sum() == 0, "a window was written twice"
    assert queries.bits(got).sort(key).equals(queries.bits(want).sort(key))


@pytest.mark.parametrize("point", ["worker.map@3", "worker.reduce@4", "worker.commit@5",
                                   "worker.after_commit@6"])
def test_a_worker_killed_mid_batch_is_replaced_and_the_batch_rerun(
    ray_cluster: str, tmp_path: Path, point: str
) -> None:
    fired = tmp_path / "fired"
    fired.mkdir()
    out, chk = tmp_path / "out", tmp_path / "chk"
    done = _cli(_run_args(out, chk, "window", 2, ray_cluster),
                env={"MICROBATCH_FAULT": point, "MICROBATCH_FAULT_ONCE": str(fired)})
    assert done.returncode == 0, done.stderr
    assert [p.name for p in fired.iterdir()] == [point], "the worker did not die there"
    assert "replacing the workers" in done.stderr
    _assert_exactly_the_oracle(out, "window", tmp_path)
    # the re-run batch counts its late rows once, as one process does
    assert _late_rows(chk) == _oracle_late["window", 1500]


def _late_rows(chk: Path) -> list[int]:
    return [r["late_rows"] for r in sorted(load_progress(chk / "progress", limit=1000),
                                           key=lambda r: r["batch_id"])]


def test_driver_killed_then_restarted_on_other_worker_counts(
    ray_cluster: str, tmp_path: Path
) -> None:
    out, chk = tmp_path / "out", tmp_path / "chk"
    first = _cli(_run_args(out, chk, "session", 2, ray_cluster),
                 env={"MICROBATCH_FAULT": "after_sink@4"})
    assert first.returncode == -signal.SIGKILL, first.stderr
    # the workers' state is version N+1 once the batch executed (the reduce commits
    # it): a driver killed before its sink re-runs batch N from version N
    again = _cli(_run_args(out, chk, "session", 2, ray_cluster),
                 env={"MICROBATCH_FAULT": "after_execute@6"})
    assert again.returncode == -signal.SIGKILL, again.stderr
    assert (chk / "offsets" / "6").exists()
    assert not (chk / "commits" / "6").exists()
    orphans = list((chk / "state" / "shards").glob("*/*/**/changelog/7.arrow"))
    assert orphans, "no shard had committed version 7 (batch 6's state) before the kill"
    second = _cli(_run_args(out, chk, "session", 1, ray_cluster),
                  env={"MICROBATCH_FAULT": "after_state_commit@9"})
    assert second.returncode == -signal.SIGKILL, second.stderr
    last = _cli(_run_args(out, chk, "session", 3, ray_cluster))
    assert last.returncode == 0, last.stderr
    assert (chk / "state" / "shards.json").exists()
    _assert_exactly_the_oracle(out, "session", tmp_path)


def _shard_workers() -> list[int]:
    """PIDs of the Ray processes running a ShardWorker actor."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if cmdline.startswith(b"ray::ShardWorker"):
            pids.append(int(entry.name))
    return pids


def _wait_for_workers(proc: subprocess.Popen[str], timeout_s: float) -> list[int]:
    """The ShardWorker processes once the job has started them ([] if it ended first)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        workers = _shard_workers()
        if workers:
            return workers
        time.sleep(0.1)
    return []


def test_random_sigkills_of_driver_and_workers(ray_cluster: str, tmp_path: Path) -> None:
    """Kills at random moments of the batches (timed from when the job's workers
    exist, not from its start, which takes seconds more on a busy machine):
    every other run loses a worker, then the driver."""
    out, chk = tmp_path / "out", tmp_path / "chk"
    rng = random.Random(15)
    kills = {"driver": 0, "worker": 0}
    for attempt in range(12):
        proc = subprocess.Popen(
            [sys.executable, "-m", "microbatch.cli",
             *_run_args(out, chk, "window", rng.choice([1, 2]), ray_cluster, batch=750)],
            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        workers = _wait_for_workers(proc, 120)
        time.sleep(rng.uniform(0.0, 1.5))
        if proc.poll() is None and workers and attempt % 2 == 0:
            try:
                os.kill(rng.choice(_shard_workers() or workers), signal.SIGKILL)
                kills["worker"] += 1
            except ProcessLookupError:  # the job ended (its workers with it) meanwhile
                pass
            time.sleep(rng.uniform(0.5, 1.5))
        if proc.poll() is None and attempt < 6:
            proc.kill()
            kills["driver"] += 1
        _, stderr = proc.communicate(timeout=240)
        # the workers of a killed driver die with it (in ~0.1 s): gone before the next run
        deadline = time.monotonic() + 30
        while _shard_workers() and time.monotonic() < deadline:
            time.sleep(0.1)
        if proc.returncode == 0:
            break
        assert proc.returncode == -signal.SIGKILL, stderr
    else:
        pytest.fail(f"the job never finished ({kills})")
    assert kills["driver"] >= 2, kills
    assert kills["worker"] >= 1, kills
    _assert_exactly_the_oracle(out, "window", tmp_path, batch=750)


def test_workers_that_keep_dying_fail_the_query_with_a_clear_error(
    ray_cluster: str, tmp_path: Path
) -> None:
    out, chk = tmp_path / "out", tmp_path / "chk"
    failed = _cli(_run_args(out, chk, "window", 2, ray_cluster),
                  env={"MICROBATCH_FAULT": "worker.map@2"})
    assert failed.returncode == 1, failed.stderr
    assert "Ray workers were lost 4 times" in failed.stderr
    assert "re-runs the batch from the checkpoint" in failed.stderr
    assert "Traceback" not in failed.stderr
    # the batch was not committed: a run without the fault completes it exactly once
    again = _cli(_run_args(out, chk, "window", 2, ray_cluster))
    assert again.returncode == 0, again.stderr
    _assert_exactly_the_oracle(out, "window", tmp_path)
