"""The results table (Markdown), the raw JSON and an optional bar chart."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.harness import Config, Row, markdown_table
from benchmarks.runner import Outcome

HEADER = ("workload", "case", "engine", "one-shot limit", "ratio", "target", "peak RSS",
          "notes")


def render(outcomes: list[Outcome], machine: dict[str, Any], cfg: Config) -> str:
    """The whole report as Markdown."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# microbatch benchmarks ({'quick' if cfg.quick else 'full'} run, {stamp})",
        "",
        f"Machine: {machine['nproc']} cores, {machine['ram_gib']} GiB RAM, {machine['cpu']}; "
        f"Python {machine['python']}, Polars {machine['polars']} "
        f"({machine['polars_threads']} threads), PyArrow {machine['pyarrow']}.",
        "",
        "ratio = engine rate / one-shot Polars rate, measured in the same run "
        "(for ms rows: limit ms / engine ms). Peak RSS: engine / one-shot process.",
        "",
    ]
    rows: list[tuple[str, ...]] = []
    for outcome in outcomes:
        if outcome.section is None:
            rows.append((outcome.name, f"skipped: {_short(outcome.skipped or '')}",
                         *[""] * (len(HEADER) - 2)))
            continue
        rows += [_cells(r) for r in outcome.section.rows]
    lines += markdown_table(HEADER, rows)
    lines.append("")
    for outcome in outcomes:
        if outcome.section is not None and outcome.section.details:
            lines += outcome.section.details
    return "\n".join(lines)


def _short(text: str, limit: int = 220) -> str:
    """One table cell's worth of ``text``."""
    text = text.replace("|", "/").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _cells(row: Row) -> tuple[str, ...]:
    ratio = "" if row.ratio is None or math.isnan(row.ratio) else f"{row.ratio:.2f}"
    target = row.target
    if row.target_met is not None:
        target += " ✅" if row.target_met else " ❌"
    return (row.workload, row.case, row.engine, row.limit, ratio, target, row.rss, row.note)


def write_json(path: Path, outcomes: list[Outcome], machine: dict[str, Any], cfg: Config) -> None:
    """Raw numbers of every phase and repetition."""
    body = {
        "config": {"quick": cfg.quick, "reps": cfg.reps},
        "machine": machine,
        "workloads": {
            o.name: {"skipped": o.skipped, "seconds": o.seconds, "phases": o.raw,
                     "rows": [vars(r) for r in (o.section.rows if o.section else [])]}
            for o in outcomes
        },
    }
    path.write_text(json.dumps(body, indent=1, default=str))


def write_plot(path: Path, outcomes: list[Outcome]) -> str:
    """A bar chart of every ratio; returns a note on what happened."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot skipped: matplotlib is not installed (pip install matplotlib)"
    bars = [(f"{r.workload}\n{r.case}", r.ratio) for o in outcomes if o.section
            for r in o.section.rows if r.ratio is not None and not math.isnan(r.ratio)]
    if not bars:
        return "plot skipped: no ratios to draw"
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(bars)), 4.5))
    ax.bar(range(len(bars)), [b[1] for b in bars], color="#4c72b0")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("engine / one-shot Polars")
    ax.set_title("microbatch vs one-shot limit")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"plot written to {path}"
