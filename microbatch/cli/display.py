"""What the CLI shows while a query runs: one line per batch when stderr is not a
terminal (:class:`BatchLines`), a live status line (:class:`LiveLine`) or the
demo's live table (:class:`DemoTable`) on a terminal, and the run's totals
(:class:`RunStats`). Display only: nothing here changes what a query does.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from microbatch.api.query import StreamingQuery
from microbatch.observability.progress_schema import ProgressRecord, step_durations
from microbatch.observability.status import lag_unit
from microbatch.observability.timefmt import fmt_duration_ms, watermark_lag_text, watermark_text

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

STEPS = ("plan", "write_ahead", "read", "execute", "sink", "commit")
"""Lifecycle steps shown with their durations, in order."""


def fmt_int(value: Any) -> str:
    """``value`` with thousands separators, or ``-`` when it is not a number."""
    return f"{int(value):,}" if isinstance(value, int | float) else "-"


def row_rate(record: ProgressRecord) -> float | None:
    """A progress record's input rate, else its processing rate (rows/s)."""
    rate = record["input_rows_per_second"]
    return rate if rate is not None else record["processed_rows_per_second"]


def fmt_ms_time(ms: int | None) -> str | None:
    """Epoch milliseconds as an ISO-8601 UTC time (``None`` stays ``None``)."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


@dataclass
class RunStats:
    """Totals of the batches this process ran."""

    batches: int = 0
    input_rows: int = 0
    output_rows: int = 0
    last: ProgressRecord | None = None
    started: float = field(default_factory=time.monotonic)

    def add(self, record: ProgressRecord) -> None:
        """Count one more batch."""
        self.batches += 1
        self.input_rows += record["input_rows"]
        self.output_rows += record["output_rows"]
        self.last = record




class BatchLines:
    """Not a terminal: one plain line per batch on stderr, no colours, no redraws.

    ``prefix`` starts every line (``microbatch sql`` names the query when a
    script runs several)."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    def __enter__(self) -> BatchLines:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def batch(self, record: ProgressRecord, stats: RunStats) -> None:
        durations = step_durations(record)
        steps = " ".join(f"{s}={durations[s]:.0f}" for s in STEPS if s in durations)
        rate = row_rate(record)
        line = (
            f"{self.prefix}{fmt_ms_time(record['timestamp_ms'])} batch {record['batch_id']}: "
            f"{record['input_rows']} rows in, {record['output_rows']} rows out, "
            f"{'-' if rate is None else f'{rate:.0f}'} rows/s, "
            f"{durations.get('total', 0):.0f} ms ({steps})"
            f"{lag_and_watermark(record)}"
            f"{' [recovered]' if record['recovered'] else ''}"
            f"{' [falling behind]' if record['falling_behind'] else ''}"
        )
        sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def refresh(self, stats: RunStats, query: StreamingQuery) -> None:
        return None

    def note(self, message: str) -> None:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()


def lag_and_watermark(record: ProgressRecord) -> str:
    """``, lag 1200 records (oldest 3.1 s), late 2, watermark 2026-01-01T12:00:05Z
    (lag 9.8 s)``; for old data ``(event time 336 d 2 h behind the clock: old data)``."""
    parts = []
    lag, lag_s = record["source_lag_records"], record["source_lag_seconds"]
    if lag is not None:
        unit = lag_unit(record["sources"])
        oldest = f" (oldest {fmt_duration_ms(lag_s * 1000)})" if lag_s else ""
        parts.append(f"lag {lag:,} {unit.removesuffix('s') if lag == 1 else unit}{oldest}")
    if record["late_rows"]:
        parts.append(f"late {record['late_rows']}")
    watermark = record["next_watermark_ms"]
    if watermark is not None:
        now = record["reported_at_ms"] or watermark
        parts.append(f"watermark {watermark_text(watermark, now)}")
    return "".join(f", {p}" for p in parts)


class LiveLine:
    """A terminal: one status line redrawn from the newest progress record."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.live = Live(console=out, refresh_per_second=4, transient=False)

    def __enter__(self) -> LiveLine:
        self.live.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.live.__exit__(exc_type, exc, tb)

    def batch(self, record: ProgressRecord, stats: RunStats) -> None:
        return None

    def refresh(self, stats: RunStats, query: StreamingQuery) -> None:
        self.live.update(self.render(stats, query))

    def note(self, message: str) -> None:
        self.live.console.print(f"[yellow]{escape(message)}[/]", soft_wrap=True)

    def render(self, stats: RunStats, query: StreamingQuery) -> Any:
        last = stats.last
        text = Text()
        text.append(f"{self.title} ", style="bold")
        text.append(query.status["message"], style="green" if query.is_active else "dim")
        if last is None:
            text.append("  waiting for the first batch…", style="dim")
            return text
        rate = row_rate(last)
        text.append(f"  batch {last['batch_id']}", style="bold cyan")
        text.append(f" │ {fmt_int(rate)} rows/s │ in {fmt_int(last['input_rows'])}"
                    f" │ out {fmt_int(last['output_rows'])} │ {stats.batches} batches")
        if last["source_lag_records"] is not None:
            text.append(f" │ lag {fmt_int(last['source_lag_records'])} "
                        f"{lag_unit(last['sources'])}")
        watermark = last["next_watermark_ms"]
        if watermark is not None:
            text.append(f" │ watermark {watermark_text(watermark, int(time.time() * 1000))}")
        if last["falling_behind"]:
            text.append(" │ falling behind", style="bold red")
        return text


class DemoTable(LiveLine):
    """The demo's terminal view: totals, then the last batches with per-step times."""

    def __init__(self, seconds: float) -> None:
        super().__init__("demo")
        self.seconds = seconds
        self.records: list[ProgressRecord] = []
        self.late_rows = 0

    def batch(self, record: ProgressRecord, stats: RunStats) -> None:
        self.records = [*self.records[-7:], record]
        self.late_rows += record["late_rows"]

    def render(self, stats: RunStats, query: StreamingQuery) -> Any:
        elapsed = time.monotonic() - stats.started
        limit = f"/{self.seconds:g}s" if self.seconds > 0 else " (Ctrl-C stops)"
        rate = row_rate(stats.last) if stats.last else None
        head = Text.assemble(
            ("demo ", "bold"), (query.status["message"], "green" if query.is_active else "dim"),
            f"  {elapsed:.0f}s{limit} · {stats.batches} batches · "
            f"{fmt_int(stats.input_rows)} in · {fmt_int(stats.output_rows)} out · "
            f"{fmt_int(rate)} rows/s · late {fmt_int(self.late_rows)}"
            + (f" · watermark {watermark_lag_text(lag)}" if (lag := watermark_lag(stats)) else ""),
        )
        table = Table(box=box.SIMPLE_HEAD, header_style="bold", padding=(0, 1), pad_edge=False,
                      collapse_padding=True, show_edge=False, caption="step times in ms",
                      caption_justify="left")
        for title in ("batch", "in", "out", "rows/s", *_STEP_TITLES, "total"):
            table.add_column(title, justify="right", no_wrap=True)
        for rec in self.records:
            durations = step_durations(rec)
            table.add_row(
                str(rec["batch_id"]), fmt_int(rec["input_rows"]),
                fmt_int(rec["output_rows"]), fmt_int(row_rate(rec)),
                *(f"{durations[s]:.1f}" if s in durations else "-" for s in STEPS),
                f"{durations.get('total', 0):.1f}",
            )
        return Group(head, table)


def watermark_lag(stats: RunStats) -> float | None:
    """The last batch's watermark lag in ms, if it had one."""
    return stats.last["watermark_lag_ms"] if stats.last else None


_STEP_TITLES = ("plan", "wal", "read", "exec", "sink", "commit")
"""Short column titles of :data:`STEPS` (``wal``: the write-ahead of offsets/N)."""
