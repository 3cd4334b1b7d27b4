"""The peer comparison at a glance: one row per workload, one column per engine.

``python -m benchmarks.compare_summary [COMPARE.json]`` prints, from a run's
``compare.json`` (default: the latest quick run), the Markdown matrix the
README embeds: events/s per engine with the Parquet-style sink (median of
the runs), cold and warm, this engine's ratio to the one-shot limit and to
Spark (warm figures), and a peak-memory row. :mod:`benchmarks.compare` puts
the same matrix at the top of ``compare.md``.

Cold is the first run in a fresh worker process, warm the same workload run
again in that process (:mod:`benchmarks.compare_engines`). Results written
before the runs were split hold one measurement per run, shown as cold.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import PHASES, fmt_num, markdown_table

COLUMNS = (
    ("polars-oneshot", "one-shot Polars"),
    ("microbatch", "microbatch"),
    ("spark", "Spark SS"),
    ("bytewax", "Bytewax"),
    ("quix", "Quix Streams"),
)
"""Engines shown, each with the sink that writes its result (not the no-op runs)."""
HEADLINE = "warm"
"""The phase every ratio uses: the steady state, JIT and first-call costs paid."""
DEFAULT = Path(__file__).resolve().parent / "results" / "compare" / "quick" / "compare.json"


def measurement(run: dict[str, Any], phase: str) -> dict[str, Any] | None:
    """A run record's ``phase`` (cold or warm) measurement, None when it has none
    (a record from before the split is one cold measurement)."""
    if not any(p in run for p in PHASES):
        return run if phase == "cold" else None
    found: dict[str, Any] | None = run.get(phase)
    return found


def rates(cell: dict[str, Any], phase: str = HEADLINE) -> list[float]:
    """Events/s of each of a cell's runs that has a ``phase`` measurement."""
    found = (measurement(run, phase) for run in cell.get("runs", []))
    return [m["input_rows"] / m["wall_s"] for m in found if m and m.get("wall_s")]


def rate(cell: dict[str, Any], phase: str = HEADLINE) -> float | None:
    """Median events/s over a cell's ``phase`` runs, or None when there is none."""
    found = rates(cell, phase)
    return statistics.median(found) if found else None


def _short_reason(cell: dict[str, Any]) -> str:
    why = cell.get("skipped") or ""
    if "timed out" in why:
        return "timed out"
    if why.startswith("n/a"):
        return "n/a"
    return "failed" if why else "-"


def cold_warm(cell: dict[str, Any]) -> str:
    """``1.33M/s cold · 1.90M/s warm`` (``no warm run`` when only the cold one ran)."""
    cold, warm = rate(cell, "cold"), rate(cell, "warm")
    text = f"{fmt_num(cold)}/s cold" if cold is not None else "cold -"
    return text + (f" · {fmt_num(warm)}/s warm" if warm is not None else " · no warm run")


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def _engine_cell(engine: str, cell: dict[str, Any] | None, limit: float | None) -> str:
    if cell is None:
        return "-"
    if rate(cell, "cold") is None and rate(cell, "warm") is None:
        return _short_reason(cell)
    text = cold_warm(cell)
    if engine != "microbatch":
        return text
    of_limit = _ratio(rate(cell), limit)
    return f"**{text}**" + (f" ({of_limit:.2f} of one-shot)" if of_limit is not None else "")


def matrix(doc: dict[str, Any], titles: dict[str, str]) -> list[str]:
    """The Markdown lines of the matrix for a parsed ``compare.json``."""
    header = ("workload", *(title for _, title in COLUMNS), "microbatch ÷ Spark (warm)")
    rows: list[list[str]] = []
    peak: dict[str, float] = {}
    for name, cells in doc["cells"].items():
        limit = rate(cells.get("polars-oneshot", {}))
        row = [_engine_cell(engine, cells.get(engine), limit) for engine, _ in COLUMNS]
        vs_spark = _ratio(rate(cells.get("microbatch", {})), rate(cells.get("spark", {})))
        row.append(f"{vs_spark:,.1f}×" if vs_spark is not None else "-")  # noqa: RUF001
        rows.append([titles.get(name, name), *row])
        if name.startswith("q1-small"):
            for engine, _ in COLUMNS:
                runs = (cells.get(engine) or {}).get("runs") or []
                if runs:
                    peak[engine] = max(run["peak_tree_rss_mb"] for run in runs)
    if peak:
        rows.append(["peak RSS on q1-small (process tree, cold + warm run)",
                     *(f"{peak[e]:,.0f} MiB" if e in peak else "-" for e, _ in COLUMNS), ""])
    return markdown_table(header, rows, align="l" + "r" * (len(COLUMNS) + 1))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else DEFAULT
    if not path.exists():
        print(f"no comparison results at {path}: run `make bench-peers` first", file=sys.stderr)
        return 2
    doc = json.loads(path.read_text())
    print("\n".join(matrix(doc, titles(bool(doc.get("quick")), doc.get("rows_per_batch")))))
    return 0


def titles(quick: bool, rows_per_batch: dict[str, int] | None = None) -> dict[str, str]:
    """Workload name -> its short title with the batch size (``rows_per_batch``: the
    run's own, e.g. over ``--data``; default: the generated data's)."""
    from benchmarks.compare_engines import WORKLOADS

    sizes = rows_per_batch or {}
    return {name: f"{w.short}, {sizes.get(name, w.rows_per_batch(quick)):,} "
                  f"{'records' if w.kafka_partitions else 'rows'}/batch"
            for name, w in WORKLOADS.items()}


if __name__ == "__main__":
    sys.exit(main())
