"""Ctrl-C at any moment of ``microbatch run``'s first seconds: exit code 130, no traceback.

A real ``microbatch run`` subprocess of a real job (the generator job on local
files) gets SIGINT at 20 moments of its first 3 seconds: while Python starts,
while ``microbatch`` is imported, while the job is loaded and the checkpoint
opened, and during the first batches. Each time the exit code is 130 (the
shell's convention for SIGINT: started or not, the command was interrupted)
and the output holds no traceback (or, for a signal that comes before the
interpreter has set up its handlers, the process dies of SIGINT without output).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GENERATED_JOB = REPO / "jobs" / "generated_to_parquet.py"
CLI = [sys.executable, "-m", "microbatch.cli"]

MOMENTS = [round(0.15 * i, 2) for i in range(20)]
"""When the SIGINT is sent, in seconds after the process is started: 0 to 2.85 s."""

pytestmark = pytest.mark.slow


def interrupted_run(
    tmp_path: Path, after: float, *, after_commit: bool = False
) -> subprocess.CompletedProcess[str]:
    """Start a live ``run`` of the generator job, SIGINT it ``after`` seconds later
    (``after_commit``: once its first batch is committed, whatever the machine's speed)."""
    proc = subprocess.Popen(
        [*CLI, "run", GENERATED_JOB, "--checkpoint", "chk", "--trigger", "0.2s",
         "--param", "output=out", "--param", "rows_per_second=2000",
         "--param", "max_records_per_batch=500"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        if after_commit:
            commits, deadline = tmp_path / "chk" / "commits", time.monotonic() + 120
            while not (commits.is_dir() and any(n.isdigit() for n in os.listdir(commits))):
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "no batch committed in 120 s"
                time.sleep(0.01)
        time.sleep(after)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.parametrize("after", MOMENTS)
def test_sigint_at_any_moment_of_the_start_exits_130_without_a_traceback(
    tmp_path: Path, after: float
) -> None:
    result = interrupted_run(tmp_path, after)

    if result.returncode == -signal.SIGINT:
        # The signal came before the interpreter set up its handlers: the process
        # died of it (the shell reports 130) without running any code or output.
        assert (result.stdout, result.stderr) == ("", ""), after
        return
    assert result.returncode == 130, (after, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout, (after, result.stderr)
    assert "KeyboardInterrupt" not in result.stderr, (after, result.stderr)
    assert "SIGINT" in result.stderr, (after, result.stderr)


def test_a_sigint_that_stops_a_running_query_commits_the_batch_in_flight(
    tmp_path: Path,
) -> None:
    result = interrupted_run(tmp_path, 0.1, after_commit=True)

    assert result.returncode == 130, (result.stdout, result.stderr)
    assert "stopped (SIGINT)" in result.stderr
    assert "last committed batch: " in result.stderr
    assert "Traceback" not in result.stderr
    assert any((tmp_path / "chk" / "commits").iterdir())
