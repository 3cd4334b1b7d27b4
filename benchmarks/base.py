"""Types shared by the runner and the workloads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PhaseResults = dict[str, list[dict[str, Any]]]
"""Raw results of one workload: phase name -> one JSON dict per repetition."""


class SkipWorkload(Exception):
    """Raised by a workload's ``prepare`` when it cannot run here (the reason)."""


@dataclass(frozen=True)
class Config:
    """Options of a benchmark run, passed on to every worker subprocess."""

    quick: bool = False
    reps: int | None = None
    """Repetitions override (``None``: each workload's default)."""

    def reps_for(self, default_full: int) -> int:
        """Repetitions of a workload whose full-run default is ``default_full``."""
        if self.reps is not None:
            return self.reps
        return 1 if self.quick else default_full

    def to_args(self) -> list[str]:
        """The command-line flags reproducing this config in a worker."""
        args = ["--quick"] if self.quick else []
        if self.reps is not None:
            args += ["--reps", str(self.reps)]
        return args


@dataclass
class Row:
    """One line of the results table."""

    workload: str
    case: str
    engine: str
    limit: str
    ratio: float | None = None
    target: str = ""
    target_met: bool | None = None
    rss: str = ""
    note: str = ""


@dataclass
class Section:
    """What a workload contributes to the report."""

    rows: list[Row] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    """Extra Markdown lines (breakdown tables, correctness notes)."""


@dataclass(frozen=True)
class Workload:
    """A benchmark: phases run in subprocesses, then a summary in the runner.

    ``prepare`` runs in the runner (generate data, check dependencies; raise
    :class:`SkipWorkload` to skip). ``run_phase(phase, config, workdir)`` runs
    in a fresh subprocess per phase and repetition and returns JSON-able
    numbers. ``summarize`` turns every phase's results into table rows.
    """

    name: str
    description: str
    phases: tuple[str, ...]
    default_reps: int
    prepare: Callable[[Config], None]
    run_phase: Callable[[str, Config, Path], dict[str, Any]]
    summarize: Callable[[Config, PhaseResults], Section]
