"""Progress of a replay backfill (``microbatch backfill``).

A backfill runs a job with the ``available-now`` trigger: every batch up to
what its sources hold at start, then it stops. For Delta and Iceberg sources
the whole backlog is known up front from the table's log: Delta versions,
data files and, from the files' statistics, rows; Iceberg snapshots (of the
lineage), data files and rows (from the manifests). Progress is shown against
it: a rich progress bar on a terminal (rows and versions or snapshots / files
done of total, rate, ETA), one plain line per batch otherwise. Other sources show rows and
batches without a total.

The tracker reads the log through its own copies of the job's sources (the
engine's instances belong to the query thread), and measures progress from
the end offsets in the query's progress records, so it never slows the
query down.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from microbatch.api.query import StreamingQuery
from microbatch.api.writer import DataStreamWriter
from microbatch.cli.display import BatchLines, LiveLine, RunStats, out
from microbatch.exceptions import SourceError
from microbatch.observability.progress_schema import ProgressRecord
from microbatch.sources.delta import DeltaSource
from microbatch.sources.iceberg import IcebergSource
from microbatch.types import Offset

LakeSource = DeltaSource | IcebergSource
"""The sources whose backlog a backfill knows up front (their log says it)."""


@dataclass
class _Tracked:
    sid: str
    source: LakeSource
    start: Offset
    total_units: int
    total_files: int
    total_rows: int | None
    last: Offset = None
    units: set[int] = field(default_factory=set)
    files: int = 0
    rows: int | None = 0

    def advance(self, end: Offset) -> None:
        """Count the files between the last end seen and ``end`` (incremental)."""
        last = self.start if self.last is None else self.last
        if self.source.compare(end, last) <= 0:
            return
        for unit, rows in self.source.progress_items(last, end):
            self.units.add(unit)
            self.files += 1
            self.rows = None if self.rows is None or rows is None else self.rows + rows
        self.last = end


@dataclass(frozen=True)
class Done:
    """Progress so far, summed over the job's Delta and Iceberg sources."""

    versions: int
    """Delta versions and Iceberg snapshots with data read (the ``unit``)."""
    files: int
    rows: int | None
    total_versions: int
    total_files: int
    total_rows: int | None
    unit: str = "versions"
    """What ``versions`` counts: ``versions`` (Delta), ``snapshots`` (Iceberg) or
    ``commits`` (both)."""

    @property
    def fraction(self) -> float | None:
        """Share of the backlog done (by rows when known, else by files)."""
        if self.total_rows:
            return min(1.0, (self.rows or 0) / self.total_rows)
        if self.total_files:
            return min(1.0, self.files / self.total_files)
        return None


class BackfillTracker:
    """Knows each Delta or Iceberg source's backlog for this run and how much of it
    is done."""

    def __init__(self, writer: DataStreamWriter, checkpoint: Path) -> None:
        resume = _resume_offsets(checkpoint)
        self.tracked: list[_Tracked] = []
        for i, source in enumerate(writer.plan.sources()):
            if not isinstance(source, DeltaSource | IcebergSource):
                continue
            sid = str(i)
            copy = source.clone()
            start = resume.get(sid)
            if start is None or not _is_offset_of(copy, start):
                start = copy.initial_offset()
            target = copy.latest_offset(start, capped=False)
            items = copy.progress_items(start, target)
            rows = [r for _, r in items]
            self.tracked.append(_Tracked(
                sid, copy, start, total_units=len({u for u, _ in items}), total_files=len(items),
                total_rows=None if any(r is None for r in rows) else sum(r or 0 for r in rows)))
        units = {t.source.backlog_unit for t in self.tracked}
        self.unit = units.pop() if len(units) == 1 else "commits"
        self.started = time.monotonic()

    @property
    def has_totals(self) -> bool:
        """True when the job reads at least one Delta or Iceberg table."""
        return bool(self.tracked)

    def done(self, record: ProgressRecord | None) -> Done:
        """Progress as of the progress record ``record`` (``None``: nothing yet)."""
        ends = {s["id"]: s["end_offset"] for s in record["sources"]} if record else {}
        versions = files = 0
        rows: int | None = 0
        for t in self.tracked:
            end = ends.get(t.sid)
            if end is not None and _is_offset_of(t.source, end):
                # e.g. the log was cleaned up meanwhile: the query itself reports that
                with contextlib.suppress(SourceError):
                    t.advance(end)
            versions += len(t.units)
            files += t.files
            rows = None if rows is None or t.rows is None else rows + t.rows
        total_rows: int | None = 0
        for t in self.tracked:
            total_rows = None if total_rows is None or t.total_rows is None \
                else total_rows + t.total_rows
        return Done(
            versions=versions,
            files=files,
            rows=rows,
            total_versions=max(versions, sum(t.total_units for t in self.tracked)),
            total_files=max(files, sum(t.total_files for t in self.tracked)),
            total_rows=None if total_rows is None else max(total_rows, rows or 0),
            unit=self.unit,
        )


def _is_offset_of(source: LakeSource, offset: Offset) -> bool:
    """True when ``offset`` is a position of ``source``'s kind."""
    try:
        source.compare(offset, offset)
    except SourceError:
        return False
    return True


def _resume_offsets(checkpoint: Path) -> dict[str, Offset]:
    """Where a backfill on an existing checkpoint resumes, per source id."""
    from microbatch.checkpoint import Checkpoint

    chk = Checkpoint(checkpoint)
    if not chk.exists():
        return {}
    latest = chk.offsets.latest()
    if latest is None:
        return {}
    done = chk.commits.get(latest.batch_id) is not None
    return {sid: end if done else start for sid, (start, end) in latest.sources.items()}


def _eta(done: Done, elapsed_s: float) -> str:
    fraction = done.fraction
    if not fraction or elapsed_s <= 0:
        return "-"
    left = elapsed_s * (1 - fraction) / fraction
    return time.strftime("%H:%M:%S", time.gmtime(left))


def summary_line(done: Done, stats: RunStats, elapsed_s: float) -> str:
    """``versions 3/10 │ files 12/40 │ rows 1,200/4,000 (30.0%) │ 5,000 rows/s │ ETA ...``."""
    rows_done = done.rows if done.rows is not None else stats.input_rows
    rate = rows_done / elapsed_s if elapsed_s > 0 else 0.0
    fraction = done.fraction
    rows_total = f"/{done.total_rows:,}" if done.total_rows is not None else ""
    pct = f" ({fraction * 100:.1f}%)" if fraction is not None else ""
    return (
        f"{done.unit} {done.versions}/{done.total_versions} │ "
        f"files {done.files}/{done.total_files}"
        f" │ rows {rows_done:,}{rows_total}{pct} │ {rate:,.0f} rows/s │ "
        f"ETA {_eta(done, elapsed_s)}"
    )


class BackfillLines(BatchLines):
    """Not a terminal: one plain progress line per batch on stderr."""

    def __init__(self, tracker: BackfillTracker) -> None:
        self.tracker = tracker

    def batch(self, record: ProgressRecord, stats: RunStats) -> None:
        elapsed = time.monotonic() - self.tracker.started
        if self.tracker.has_totals:
            detail = summary_line(self.tracker.done(record), stats, elapsed)
        else:
            rate = stats.input_rows / max(elapsed, 1e-9)
            detail = f"rows {stats.input_rows:,} │ {rate:,.0f} rows/s"
        recovered = " [recovered]" if record["recovered"] else ""
        sys.stderr.write(f"backfill batch {record['batch_id']}: {detail}{recovered}\n")
        sys.stderr.flush()


class _RateColumn(ProgressColumn):
    """Rows (or files) per second, from rich's own speed estimate."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        speed = task.speed
        return Text("-" if speed is None else f"{speed:,.0f} {self.unit}/s", style="cyan")


class BackfillBar(LiveLine):
    """A terminal: a progress bar over the backlog, redrawn as batches commit."""

    def __init__(self, tracker: BackfillTracker) -> None:
        super().__init__("backfill")
        self.tracker = tracker
        first = tracker.done(None)
        self.by_rows = first.total_rows is not None
        unit = "rows" if self.by_rows else "files"
        self.progress = Progress(
            TextColumn("[bold]backfill"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[detail]}"),
            _RateColumn(unit),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            TimeElapsedColumn(),
            console=out,
            auto_refresh=False,
        )
        total = (first.total_rows if self.by_rows else first.total_files) or None
        self.task = self.progress.add_task("backfill", total=total, detail=self._detail(first))

    def _detail(self, done: Done) -> str:
        rows = "" if done.rows is None else f"rows {done.rows:,}"
        if done.total_rows is not None:
            rows += f"/{done.total_rows:,}"
        return (f"{rows} │ {done.unit} {done.versions}/{done.total_versions} │ "
                f"files {done.files}/{done.total_files}")

    def batch(self, record: ProgressRecord, stats: RunStats) -> None:
        done = self.tracker.done(record) if self.tracker.has_totals else None
        if done is None:
            self.progress.update(self.task, completed=stats.input_rows,
                                 detail=f"rows {stats.input_rows:,}")
            return
        self.progress.update(self.task, completed=(done.rows or 0) if self.by_rows else done.files,
                             detail=self._detail(done))

    def render(self, stats: RunStats, query: StreamingQuery) -> Any:
        status = Text(f"  {query.status['message']} · {stats.batches} batches", style="dim")
        return Group(self.progress.make_tasks_table(self.progress.tasks), status)
