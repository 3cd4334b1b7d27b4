"""The one benchmark harness: every entry point defines, times, compares and prints
through this module.

- **Define** a workload: :class:`Workload` (phases, each run in a fresh
  subprocess, and a summary into table :class:`Row` s); ``python -m benchmarks``
  runs the registered ones (:mod:`benchmarks.runner`). The peer comparison
  (:mod:`benchmarks.compare`) runs its engines the same way: one fresh process
  per engine, workload and repetition, through :func:`run_process`.
- **Time** it: :func:`timed` (one call), :func:`repeat` (``warmup`` untimed calls,
  then ``reps`` timed ones), :func:`cold_then_warm` (the first run in a fresh
  process, then the same again in that process).
- **Compare** with the one-shot Polars limit: :func:`rate` and :func:`ratio`
  (engine rate / one-shot rate, NaN when either is unknown).
- **Print** the table: :func:`markdown_table`; numbers with :func:`fmt_num`,
  statistics with :func:`median`, :func:`percentile`, :func:`spread`.

Nothing here decides *what* is measured: each workload times the same calls as
before, the harness only runs, collects and prints them one way.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# --------------------------------------------------------------------------- define

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


# --------------------------------------------------------------------------- time


def timed(fn: Callable[[], object]) -> float:
    """Seconds taken by ``fn()``."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def timed_value(fn: Callable[[], T]) -> tuple[float, T]:
    """Seconds taken by ``fn()``, and what it returned."""
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def repeat(fn: Callable[[], object], reps: int, *, warmup: int = 0) -> list[float]:
    """Seconds of each of ``reps`` calls of ``fn``, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    return [timed(fn) for _ in range(reps)]


PHASES = ("cold", "warm")
"""A process's two runs of the same workload: the first one pays imports, first calls
and JIT compilation; the second is the steady state."""


def cold_then_warm(run: Callable[[str], dict[str, Any]],
                   on_run: Callable[[dict[str, dict[str, Any]]], None] | None = None,
                   ) -> dict[str, dict[str, Any]]:
    """``{"cold": run("cold"), "warm": run("warm")}``, in this process, in that order;
    ``on_run`` gets the results so far after each (so a warm run that fails or times
    out leaves the cold one)."""
    results: dict[str, dict[str, Any]] = {}
    for phase in PHASES:
        results[phase] = run(phase)
        if on_run is not None:
            on_run(results)
    return results


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --------------------------------------------------------------------------- compare


def rate(rows: float, seconds: float) -> float:
    """Rows per second, NaN when ``seconds`` is not positive."""
    return rows / seconds if seconds > 0 else math.nan


def ratio(engine: float | None, oneshot: float | None) -> float:
    """The engine's rate over the one-shot Polars rate of the same data and run (NaN
    when either is unknown or the limit is zero): 1.0 is the one-shot limit."""
    if engine is None or oneshot is None or not oneshot or math.isnan(oneshot):
        return math.nan
    return engine / oneshot


# --------------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    """Median, NaN when empty."""
    return statistics.median(values) if values else math.nan


def spread(values: Sequence[float]) -> str:
    """``min-max`` of repeated measurements, as a short string."""
    if len(values) < 2:
        return "1 run"
    return f"{len(values)} runs, {fmt_num(min(values))}-{fmt_num(max(values))}"


def fmt_num(x: float) -> str:
    """Human-friendly rate/count: 1.23M, 456k, 12.3."""
    if math.isnan(x):
        return "n/a"
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= size:
            return f"{x / size:.2f}{suffix}"
    return f"{x:.3g}"


# --------------------------------------------------------------------------- print


def markdown_row(cells: Iterable[object]) -> str:
    """One line of a Markdown table (for tables printed a row at a time as results
    come in); cells are ``str()``-ed with ``|`` escaped."""
    return "| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]],
                   align: str | None = None) -> list[str]:
    """The lines of a Markdown table: ``align`` is one letter per column, ``l`` or
    ``r`` (default: all left); the rows as :func:`markdown_row` writes them."""
    spec = align or "l" * len(header)
    rule = "|" + "|".join("---:" if a == "r" else "---" for a in spec) + "|"
    return ["| " + " | ".join(header) + " |", rule, *(markdown_row(row) for row in rows)]


def _numeric(value: object) -> bool:
    """A number, or a number already formatted (``1,234.5``)."""
    if isinstance(value, int | float):
        return True
    return isinstance(value, str) and value.replace(",", "").replace(".", "", 1).lstrip(
        "-").isdigit()


def dict_table(rows: Sequence[dict[str, object]]) -> list[str]:
    """:func:`markdown_table` of records sharing their keys (the first one's, in order),
    numbers (formatted or not) right-aligned."""
    if not rows:
        return []
    cols = list(rows[0])
    align = "".join("r" if _numeric(rows[0][c]) else "l" for c in cols)
    return markdown_table(cols, [[r.get(c, "") for c in cols] for r in rows], align)


# --------------------------------------------------------------------------- processes


def _tree_rss_bytes(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (psutil, else /proc)."""
    try:
        import psutil

        try:
            proc = psutil.Process(pid)
            procs = [proc, *proc.children(recursive=True)]
        except psutil.Error:
            return 0
        total = 0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return total
    except ImportError:
        pass
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


class TreeSampler:
    """Samples the process tree's RSS in a thread; ``peak_mb`` after ``stop``."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid, self.interval, self.peak = pid, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _tree_rss_bytes(self.pid))
            self._stop.wait(self.interval)

    def stop(self) -> float:
        """Stop sampling; the peak in MiB."""
        self._stop.set()
        self._thread.join()
        return self.peak / 2**20


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s descendants, then ``pid`` (only processes the harness started)."""
    try:
        import psutil

        procs = psutil.Process(pid).children(recursive=True)
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
    except Exception:
        pass
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def log_tail(path: Path) -> str:
    """The last meaningful line of a worker's log, and where the log is."""
    text = path.read_text(errors="replace")
    lines = [ln for ln in text.strip().splitlines() if ln.strip() and "WARN" not in ln]
    return f"{lines[-1][:300] if lines else 'no output'} (log: {path})"


@dataclass
class ProcessRun:
    """What :func:`run_process` saw of one worker process."""

    result: dict[str, Any] | None
    """The worker's JSON result file, ``None`` when it wrote none."""
    failure: str | None
    """Why the process did not end well (timeout, exit code and its log's tail)."""
    seconds: float
    peak_tree_rss_mb: float | None
    log: Path


def run_process(cmd: Sequence[str], *, result_file: Path, log: Path, timeout_s: float,
                cwd: Path | None = None, sample_tree_rss: bool = False) -> ProcessRun:
    """Run one worker ``cmd`` in a fresh interpreter, its output to ``log``; read the
    JSON it writes to ``result_file``. A process that outlives ``timeout_s`` is
    killed with its descendants. Never raises for the worker's failures: they are in
    :attr:`ProcessRun.failure`."""
    result_file.parent.mkdir(parents=True, exist_ok=True)
    result_file.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
        sampler = TreeSampler(proc.pid) if sample_tree_rss else None
        failure = None
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait()
            failure = f"timed out after {timeout_s:.0f} s"
        peak = sampler.stop() if sampler is not None else None
    if failure is None and code != 0:
        failure = f"exit code {code}: {log_tail(log)}"
    result = json.loads(result_file.read_text()) if result_file.exists() else None
    return ProcessRun(result, failure, time.perf_counter() - t0, peak, log)
