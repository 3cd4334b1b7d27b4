"""``microbatch report CHECKPOINT -o report.html``: plots over the recorded batches.

Reads the progress records kept in the checkpoint (the newest ``retention``
batches) and the status document (state, alarms), draws one PNG per figure
with matplotlib (the Agg renderer, no display needed), writes each PNG next
to the HTML page (``report-<plot>.png``) and embeds the same images in the
page as base64, so the page is one self-contained file: no scripts, no
external style sheets, no network.
"""

from __future__ import annotations

import base64
import html
import io
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from microbatch.observability.progress import load_progress
from microbatch.observability.progress_schema import ProgressRecord, SourceLag, step_durations
from microbatch.observability.status import fmt_time, status_document
from microbatch.observability.status_view import fmt_bytes, fmt_int, fmt_seconds
from microbatch.observability.timefmt import is_history, watermark_lag_text

if TYPE_CHECKING:
    from matplotlib.axes import Axes

MAX_RECORDS = 100_000
"""Upper bound on records read (the checkpoint keeps ``retention`` of them)."""

STEPS = ("plan", "write_ahead", "read", "execute", "sink", "commit")
TABLE_ROWS = 100


@dataclass(frozen=True)
class Plot:
    """One figure of the report."""

    name: str
    title: str
    draw: Callable[[Axes, Sequence[ProgressRecord]], bool]
    """Draws on the axes; returns False when there was nothing to draw."""


@dataclass(frozen=True)
class WrittenReport:
    """What :func:`write_report` wrote."""

    html: Path
    images: dict[str, Path]
    batches: int


def _value(value: object, *, scale: float = 1.0) -> float:
    """``value * scale``, NaN when missing (matplotlib leaves a gap)."""
    return float(value) * scale if isinstance(value, int | float) else math.nan


def _ids(records: Sequence[ProgressRecord]) -> list[int]:
    return [r["batch_id"] for r in records]


def _has(values: Sequence[float]) -> bool:
    return any(not math.isnan(v) for v in values)


def _legend(ax: Axes) -> None:
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="best", fontsize="small")


def _rates(ax: Axes, records: Sequence[ProgressRecord]) -> bool:
    x = _ids(records)
    got = False
    for ys, label in (([_value(r["input_rows_per_second"]) for r in records],
                        "input (arrival) rows/s"),
                       ([_value(r["processed_rows_per_second"]) for r in records],
                        "processed rows/s")):
        if _has(ys):
            ax.plot(x, ys, marker=".", label=label)
            got = True
    ax.set_ylabel("rows / s")
    _legend(ax)
    return got


def _durations(ax: Axes, records: Sequence[ProgressRecord]) -> bool:
    x = _ids(records)
    bottom = [0.0] * len(records)
    for step in STEPS:
        ys = [0.0 if math.isnan(v := _value(step_durations(r).get(step))) else v
              for r in records]
        if any(ys):
            ax.bar(x, ys, bottom=bottom, label=step, width=0.8)
            bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
    intervals = [_value(r["trigger_interval_ms"]) for r in records]
    if _has(intervals):
        ax.plot(x, intervals, color="black", linestyle="--", label="trigger interval")
    ax.set_ylabel("ms")
    _legend(ax)
    return any(bottom)


def replaying_history(records: Sequence[ProgressRecord]) -> bool:
    """True when the newest watermark lag says the data is old (a replay, a backfill):
    then the event time itself is plotted, as dates, not a lag of millions of seconds."""
    lags = [r["watermark_lag_ms"] for r in records if r["watermark_lag_ms"] is not None]
    return bool(lags) and is_history(lags[-1])


def time_unit(values_s: Sequence[float]) -> tuple[str, float]:
    """The unit that keeps an axis of seconds readable: (name, seconds per unit)."""
    top = max((abs(v) for v in values_s if not math.isnan(v)), default=0.0)
    for name, size in (("days", 86_400.0), ("hours", 3_600.0), ("minutes", 60.0)):
        if top >= 2 * size:
            return name, size
    return "seconds", 1.0


def _watermark_lag(ax: Axes, records: Sequence[ProgressRecord]) -> bool:
    if replaying_history(records):
        from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

        marks = [(r["batch_id"], r["watermark_ms"]) for r in records
                 if r["watermark_ms"] is not None]
        ax.plot([b for b, _ in marks], [_as_date(ms) for _, ms in marks], marker=".",
                color="tab:purple", label="watermark (event time, UTC): replaying old data")
        locator = AutoDateLocator()  # type: ignore[no-untyped-call]
        ax.yaxis.set_major_locator(locator)
        ax.yaxis.set_major_formatter(ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
        ax.set_ylabel("event time (UTC)")
        _legend(ax)
        return bool(marks)
    seconds = [_value(r["watermark_lag_ms"], scale=1 / 1000) for r in records]
    unit, size = time_unit(seconds)
    ys = [v / size for v in seconds]
    ax.plot(_ids(records), ys, marker=".", color="tab:purple", label="wall clock - watermark")
    ax.set_ylabel(unit)
    _legend(ax)
    return _has(ys)


def _as_date(ms: int) -> Any:
    """Epoch ms as a timezone-aware datetime (what matplotlib's date axes take)."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _source_lag(ax: Axes, records: Sequence[ProgressRecord]) -> bool:
    x = _ids(records)
    ids = sorted({s["id"] for r in records for s in r["sources"]})
    got = False
    seconds_ax = None
    for sid in ids:
        lags: list[SourceLag | None] = [
            next((s["lag"] for s in r["sources"] if s["id"] == sid), None) for r in records
        ]
        unit = next((lag["unit"] for lag in lags if lag and lag["unit"]), "records")
        counts = [_value(lag["records"] if lag else None) for lag in lags]
        ages = [_value(lag["seconds"] if lag else None) for lag in lags]
        if _has(counts):
            ax.plot(x, counts, marker=".", label=f"source {sid} ({unit})")
            got = True
        if _has(ages):
            seconds_ax = seconds_ax or ax.twinx()
            seconds_ax.plot(x, ages, linestyle=":", label=f"source {sid} oldest (s)")
            seconds_ax.set_ylabel("seconds (dotted)")
    ax.set_ylabel("not yet read")
    _legend(ax)
    return got


def _state(ax: Axes, records: Sequence[ProgressRecord]) -> bool:
    x = _ids(records)
    ops = sorted({op for r in records for op in r["state"]})
    got = False
    for op in ops:
        ys = [_value(r["state"].get(op, {}).get("rows")) for r in records]
        if _has(ys):
            ax.plot(x, ys, marker=".", label=f"{op} rows")
            got = True
    mib = [_value(r["state_bytes"], scale=1 / 2**20) for r in records]
    if got and _has(mib):
        right = ax.twinx()
        right.plot(x, mib, color="gray", linestyle=":", label="all state MiB")
        right.set_ylabel("MiB (dotted)")
    ax.set_ylabel("rows")
    _legend(ax)
    return got


def _bad_rows(ax: Axes, records: Sequence[ProgressRecord]) -> bool:
    x = _ids(records)
    late = [_value(r["late_rows"]) for r in records]
    dead = [_value(r["dead_letter_rows"]) for r in records]
    ax.bar([i - 0.2 for i in x], [0 if math.isnan(v) else v for v in late], width=0.4,
           label="late rows", color="tab:orange")
    ax.bar([i + 0.2 for i in x], [0 if math.isnan(v) else v for v in dead], width=0.4,
           label="dead-letter rows", color="tab:red")
    ax.set_ylabel("rows")
    _legend(ax)
    return bool(records)


def _latency(ax: Axes, records: Sequence[ProgressRecord]) -> bool:
    x = _ids(records)
    got = False
    latencies = [r["latency_ms"] for r in records]
    series = (([_value(m["max_ms"] if m else None, scale=1 / 1000) for m in latencies], "max"),
              ([_value(m["median_ms"] if m else None, scale=1 / 1000) for m in latencies],
               "median"))
    unit, size = time_unit([v for ys, _ in series for v in ys])
    for ys, label in series:
        if _has(ys):
            ax.plot(x, [v / size for v in ys], marker=".", label=f"{label} (now - event time)")
            got = True
    ax.set_ylabel(unit)
    _legend(ax)
    return got


PLOTS = (
    Plot("rows_per_second", "Rows per second: arriving and processed", _rates),
    Plot("batch_duration", "Batch duration by step, against the trigger interval", _durations),
    Plot("watermark_lag", "Watermark lag (wall clock minus watermark); when replaying old "
         "data, the watermark's event time", _watermark_lag),
    Plot("source_lag", "Source lag: not yet read (solid) and age of the oldest (dotted)",
         _source_lag),
    Plot("state_size", "State size per operator", _state),
    Plot("late_and_dead_letter_rows", "Late and dead-letter rows per batch", _bad_rows),
    Plot("latency", "End-to-end latency at the sink", _latency),
)
"""The report's figures, in page order."""


def render_png(plot: Plot, records: Sequence[ProgressRecord]) -> bytes:
    """One figure as PNG bytes (matplotlib's Agg renderer, no pyplot state)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    fig = Figure(figsize=(10, 3.4), dpi=100, layout="constrained")
    ax = fig.subplots()
    drew = plot.draw(ax, records) if records else False
    if not drew:
        ax.text(0.5, 0.5, "no data recorded", ha="center", va="center",
                transform=ax.transAxes, color="gray", fontsize="large")
    if isinstance(ax.yaxis.get_major_formatter(), ScalarFormatter):  # not a date axis
        ax.ticklabel_format(axis="y", useOffset=False, style="plain")  # no "+2.9e7" offsets
    ax.set_title(plot.title, loc="left", fontsize="medium")
    ax.set_xlabel("batch id")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def write_report(checkpoint: Path, output: Path) -> WrittenReport:
    """Write the HTML page (and a PNG per figure next to it); return what was written.

    ``output`` may be a directory (the page is then ``report.html`` in it).
    Raises :class:`~microbatch.exceptions.CheckpointError` when ``checkpoint``
    is not a checkpoint.
    """
    doc = status_document(checkpoint)
    records = load_progress(Path(doc["checkpoint"]) / "progress", limit=MAX_RECORDS)
    target = output / "report.html" if output.is_dir() else output
    target.parent.mkdir(parents=True, exist_ok=True)
    images: dict[str, Path] = {}
    pngs: dict[str, bytes] = {}
    for plot in PLOTS:
        png = render_png(plot, records)
        path = target.with_name(f"{target.stem}-{plot.name}.png")
        path.write_bytes(png)
        images[plot.name], pngs[plot.name] = path, png
    target.write_text(render_html(doc, records, pngs), encoding="utf-8")
    return WrittenReport(html=target, images=images, batches=len(records))


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 0.9em; }
td, th { padding: 2px 10px; border-bottom: 1px solid #ddd; text-align: right; }
table.summary td:first-child { font-weight: bold; text-align: left; }
table.summary td { text-align: left; }
img { max-width: 100%; border: 1px solid #eee; }
.error { color: #b00; } .warning { color: #a60; } .ok { color: #070; }
"""


def render_html(
    doc: dict[str, Any], records: Sequence[ProgressRecord], pngs: dict[str, bytes]
) -> str:
    """The self-contained page: summary, alarms, every figure, the batch table."""
    e = html.escape
    first, last = (records[0]["batch_id"], records[-1]["batch_id"]) if records else (None, None)
    summary = [
        ("checkpoint", doc["checkpoint"]),
        ("query id", doc["query_id"]),
        ("state", doc["state"]),
        ("batches recorded", f"{len(records)} (batch {first} to {last})" if records else "none"),
        ("trigger", doc.get("trigger") or "-"),
        ("watermark", doc.get("watermark") or "none"),
        ("watermark lag now", watermark_lag_text(doc.get("watermark_lag_ms"))
         .removeprefix("lag ")),
        ("state size", f"{fmt_int(doc.get('state_rows'))} rows, "
                       f"{fmt_bytes(doc.get('state_bytes'))}"),
        ("late rows (all recorded batches)",
         fmt_int(sum(r["late_rows"] for r in records))),
        ("dead-letter rows (all recorded batches)",
         fmt_int(sum(r["dead_letter_rows"] for r in records))),
        ("generated", fmt_time(int(time.time() * 1000))),
    ]
    if doc.get("last_error"):
        err = doc["last_error"]
        summary.insert(3, ("last error", f"batch {err.get('batch_id')}: {err.get('type')}: "
                                         f"{err.get('message')}"))
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>microbatch report: {e(str(doc['query_id']))}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>microbatch report</h1>",
        '<table class="summary">',
        *(f"<tr><td>{e(k)}</td><td>{e(str(v))}</td></tr>" for k, v in summary),
        "</table>",
        "<h2>Alarms</h2>",
    ]
    alarms = doc.get("alarms") or []
    if alarms:
        parts.append("<ul>")
        parts += [f'<li class="{e(a["severity"])}"><b>{e(a["severity"])}</b> '
                  f'[{e(a["code"])}] {e(a["message"])}</li>' for a in alarms]
        parts.append("</ul>")
    else:
        parts.append('<p class="ok">none</p>')
    for plot in PLOTS:
        data = base64.b64encode(pngs[plot.name]).decode("ascii")
        parts.append(
            f'<section id="plot-{plot.name}"><h2>{e(plot.title)}</h2>'
            f'<img id="img-{plot.name}" alt="{e(plot.title)}" width="1000" height="340" '
            f'src="data:image/png;base64,{data}"></section>'
        )
    parts.append(_batch_table(records))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _batch_table(records: Sequence[ProgressRecord]) -> str:
    head = ("batch", "time UTC", "rows in", "rows out", "rows/s in", "rows/s done", "ms",
            "late", "dead letters", "source lag", "watermark lag", "state rows")
    rows = []
    for r in list(records)[-TABLE_ROWS:]:
        cells = (
            str(r["batch_id"]), (fmt_time(r["timestamp_ms"]) or "-")[11:23],
            fmt_int(r["input_rows"]), fmt_int(r["output_rows"]),
            fmt_int(r["input_rows_per_second"]), fmt_int(r["processed_rows_per_second"]),
            f"{r['duration_ms'].get('total', 0):.1f}",
            fmt_int(r["late_rows"]), fmt_int(r["dead_letter_rows"]),
            fmt_int(r["source_lag_records"]), fmt_seconds(r["watermark_lag_ms"]),
            fmt_int(r["state_rows"]),
        )
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    header = "".join(f"<th>{h}</th>" for h in head)
    title = f"<h2>Batches (newest {TABLE_ROWS})</h2>" if len(records) > TABLE_ROWS else (
        "<h2>Batches</h2>")
    return f'{title}<table class="batches"><tr>{header}</tr>{"".join(rows)}</table>'
