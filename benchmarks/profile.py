"""Where an engine run's time went, as Markdown."""

from __future__ import annotations

from typing import Any

from benchmarks.harness import markdown_table, median
from benchmarks.measure import STEPS, step_totals


def step_profile(title: str, run: dict[str, Any]) -> list[str]:
    """A table of each lifecycle step's total and share of the run's wall clock."""
    totals = step_totals(run["progress"])
    wall_ms = run["wall_s"] * 1000
    rows = []
    for step in STEPS:
        per_batch = [float(p["duration_ms"].get(step, 0.0)) for p in run["progress"]]
        rows.append((step, f"{totals[step]:.0f}", f"{median(per_batch):.1f}",
                     f"{totals[step] / wall_ms:.0%}"))
    outside = wall_ms - totals["total"]
    rows.append(("outside steps (start, report, loop, stop)", f"{outside:.0f}", "",
                 f"{outside / wall_ms:.0%}"))
    return [
        f"### {title}: where the engine's time goes ({run['batches']} batches, "
        f"wall {run['wall_s']:.2f} s)",
        "",
        *markdown_table(("step", "total ms", "median ms/batch", "share of wall"), rows,
                        align="lrrr"),
        "",
    ]
