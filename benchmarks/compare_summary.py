"""The peer comparison at a glance: one row per workload, one column per engine.

``python -m benchmarks.compare_summary [COMPARE.json]`` prints, from a run's
``compare.json`` (default: the latest quick run), the Markdown matrix the
README embeds: events/s per engine with the Parquet-style sink (median of
the runs), this engine's ratio to the one-shot limit, and a peak-memory row.
:mod:`benchmarks.compare` puts the same matrix at the top of ``compare.md``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.measure import fmt_num

COLUMNS = (
    ("polars-oneshot", "one-shot Polars"),
    ("microbatch", "microbatch"),
    ("spark", "Spark SS"),
    ("bytewax", "Bytewax"),
    ("quix", "Quix Streams"),
)
"""Engines shown, each with the sink that writes its result (not the no-op runs)."""
DEFAULT = Path(__file__).resolve().parent / "results" / "compare" / "quick" / "compare.json"


def rate(cell: dict[str, Any]) -> float | None:
    """Median events/s over a cell's runs, or None when it did not run."""
    rates = [r["input_rows"] / r["wall_s"] for r in cell.get("runs", []) if r.get("wall_s")]
    return statistics.median(rates) if rates else None


def _short_reason(cell: dict[str, Any]) -> str:
    why = cell.get("skipped") or ""
    if "timed out" in why:
        return "timed out"
    if why.startswith("n/a"):
        return "n/a"
    return "failed" if why else "-"


def matrix(doc: dict[str, Any], titles: dict[str, str]) -> list[str]:
    """The Markdown lines of the matrix for a parsed ``compare.json``."""
    lines = ["| workload | " + " | ".join(title for _, title in COLUMNS) + " |",
             "|---|" + "---:|" * len(COLUMNS)]
    peak: dict[str, float] = {}
    for name, cells in doc["cells"].items():
        limit = rate(cells.get("polars-oneshot", {}))
        row = []
        for engine, _ in COLUMNS:
            cell = cells.get(engine)
            if cell is None:
                row.append("-")
                continue
            r = rate(cell)
            if r is None:
                row.append(_short_reason(cell))
                continue
            text = f"{fmt_num(r)}/s"
            if engine == "microbatch":
                text = f"**{text}**" + (f" ({r / limit:.2f} of one-shot)" if limit else "")
            row.append(text)
            if name.startswith("q1-small"):
                peak[engine] = max(run["peak_tree_rss_mb"] for run in cell["runs"])
        lines.append(f"| {titles.get(name, name)} | " + " | ".join(row) + " |")
    if peak:
        lines.append("| peak RSS on q1-small (process tree) | " + " | ".join(
            f"{peak[e]:,.0f} MiB" if e in peak else "-" for e, _ in COLUMNS) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else DEFAULT
    if not path.exists():
        print(f"no comparison results at {path}: run `make bench-peers` first", file=sys.stderr)
        return 2
    doc = json.loads(path.read_text())
    print("\n".join(matrix(doc, titles(bool(doc.get("quick"))))))
    return 0


def titles(quick: bool) -> dict[str, str]:
    """Workload name -> its short title with the batch size."""
    from benchmarks.compare_engines import WORKLOADS

    return {name: f"{w.short}, {w.rows_per_batch(quick):,} "
                  f"{'records' if w.kafka_partitions else 'rows'}/batch"
            for name, w in WORKLOADS.items()}


if __name__ == "__main__":
    sys.exit(main())
