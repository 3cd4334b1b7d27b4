"""Running a real job process and killing it with SIGKILL mid-run (the crash tests)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def committed(chk: Path) -> int:
    """How many batches the checkpoint has committed so far (old entries are purged)."""
    commits = chk / "commits"
    ids = [int(n) for n in os.listdir(commits) if n.isdigit()] if commits.exists() else []
    return max(ids) + 1 if ids else 0


def run_with_kills(cmd: list[str], chk: Path, log: Path, rng: random.Random, *, kills: int,
                   most_commits: int, most_delay_s: float) -> int:
    """Run ``cmd`` to completion, SIGKILLing it ``kills`` times, each after 1 to
    ``most_commits`` new commits plus 0 to ``most_delay_s`` seconds, so every kill
    lands mid-run however slow the machine is; the number of kills that landed
    (fewer when a run finished before its kill). The last run must exit 0."""
    done = 0
    while True:
        with log.open("wb") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT)
            if done < kills:
                target = committed(chk) + rng.randint(1, most_commits)
                deadline = time.monotonic() + 120
                while proc.poll() is None and committed(chk) < target:
                    assert time.monotonic() < deadline, "the job made no progress in 120 s"
                    time.sleep(0.002)
                time.sleep(rng.uniform(0, most_delay_s))
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    done += 1
                    continue
            assert proc.wait(timeout=300) == 0, log.read_text()
            return done
