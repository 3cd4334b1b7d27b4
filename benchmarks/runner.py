"""Runs workloads phase by phase in subprocesses (through :mod:`benchmarks.harness`)
and collects their sections."""

from __future__ import annotations

import shutil
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import data, registry
from benchmarks.harness import Config, PhaseResults, Section, SkipWorkload, run_process


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
    """One phase in a fresh interpreter (:func:`benchmarks.harness.run_process`); its
    JSON result."""
    result_file = workdir.with_suffix(".json")
    cmd = [sys.executable, "-m", "benchmarks.worker", name, phase, str(workdir),
           str(result_file), *cfg.to_args()]
    run = run_process(cmd, result_file=result_file, log=workdir.with_suffix(".log"),
                      timeout_s=timeout_s)
    if run.failure is not None and run.failure.startswith("timed out"):
        raise PhaseFailed(f"{phase} {run.failure}")
    if run.failure is not None or run.result is None:
        text = run.log.read_text(errors="replace")
        tail = [line for line in text.strip().splitlines() if line.strip()]
        reason = tail[-1] if tail else run.failure or "no result written"
        print(f"failed\n{text[-3000:]}", flush=True)
        raise PhaseFailed(f"{phase} failed: {reason}")
    return run.result


def _describe(result: dict[str, Any]) -> str:
    seconds = result.get("wall_s", result.get("seconds"))
    timing = f"{seconds:.2f} s, " if isinstance(seconds, int | float) else ""
    return f"{timing}peak RSS {result['peak_rss_mb']:.0f} MiB"
