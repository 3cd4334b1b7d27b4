"""Runs workloads phase by phase in subprocesses and collects their sections."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import data, registry
from benchmarks.base import Config, PhaseResults, Section, SkipWorkload


class PhaseFailed(Exception):
    """A worker subprocess failed; the message is the tail of its stderr."""


@dataclass
class Outcome:
    """What happened to one workload."""

    name: str
    section: Section | None = None
    skipped: str | None = None
    raw: PhaseResults = field(default_factory=dict)
    seconds: float = 0.0


def run_workload(name: str, cfg: Config, *, timeout_s: float) -> Outcome:
    """Prepare, run every phase and repetition (interleaved), summarize; never raises."""
    t0 = time.perf_counter()
    outcome = Outcome(name)
    try:
        workload = registry.load(name)
        workload.prepare(cfg)
        scratch = data.ROOT / "runs" / name
        shutil.rmtree(scratch, ignore_errors=True)
        for rep in range(cfg.reps_for(workload.default_reps)):
            for phase in workload.phases:
                print(f"  {name}: {phase} (run {rep + 1}) ...", end=" ", flush=True)
                result = run_phase(name, phase, scratch / f"{phase}-r{rep}", cfg, timeout_s)
                print(f"{_describe(result)}", flush=True)
                outcome.raw.setdefault(phase, []).append(result)
        outcome.section = workload.summarize(cfg, outcome.raw)
    except SkipWorkload as exc:
        outcome.skipped = str(exc)
    except PhaseFailed as exc:
        outcome.skipped = str(exc)
    except Exception as exc:
        traceback.print_exc()
        outcome.skipped = f"{type(exc).__name__}: {exc}"
    outcome.seconds = time.perf_counter() - t0
    if outcome.skipped:
        print(f"{name}: skipped: {outcome.skipped}", flush=True)
    return outcome


def run_phase(
    name: str, phase: str, workdir: Path, cfg: Config, timeout_s: float
) -> dict[str, Any]:
    """One phase in a fresh interpreter; its JSON result."""
    result_file = workdir.with_suffix(".json")
    result_file.parent.mkdir(parents=True, exist_ok=True)
    result_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "benchmarks.worker", name, phase, str(workdir),
           str(result_file), *cfg.to_args()]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        raise PhaseFailed(f"{phase} timed out after {timeout_s:.0f} s") from exc
    if proc.returncode != 0 or not result_file.exists():
        tail = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        reason = tail[-1] if tail else f"exit code {proc.returncode}"
        print(f"failed\n{proc.stderr[-3000:]}", flush=True)
        raise PhaseFailed(f"{phase} failed: {reason}")
    result: dict[str, Any] = json.loads(result_file.read_text())
    return result


def _describe(result: dict[str, Any]) -> str:
    seconds = result.get("wall_s", result.get("seconds"))
    timing = f"{seconds:.2f} s, " if isinstance(seconds, int | float) else ""
    return f"{timing}peak RSS {result['peak_rss_mb']:.0f} MiB"
