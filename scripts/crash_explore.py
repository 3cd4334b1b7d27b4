"""Power-loss crash explorer: every crash state of each job path, recovered and checked.

Usage::

    .venv/bin/python scripts/crash_explore.py
    .venv/bin/python scripts/crash_explore.py --path "file -> Delta" --per-point 32
    .venv/bin/python scripts/crash_explore.py --write-docs docs/reliability.md

For each path of ``tests/crash/explorer.py`` (file -> Parquet, file -> Delta,
file -> Iceberg, state store snapshot + changelog, ...) the job runs once with its file operations
recorded; every crash state the persistence model allows (all of them per
crash point up to ``--per-point``, a seeded sample beyond) is written onto the
job's directories, the job is restarted and its output compared with the
one-shot Polars result. Then the Delta and Iceberg paths again with ``strict``:
delta-rs's (PyIceberg's) own unsynced writes also torn and reordered (the
states outside our control).
Prints a Markdown table; ``--write-docs`` puts it between the
``crash-explorer`` markers of that file. Exit code 1 when a state of the
default model fails a check.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "crash")]

import explorer  # noqa: E402  (lives next to the test that uses it)

START = "<!-- crash-explorer:start -->"
END = "<!-- crash-explorer:end -->"


def main(argv: list[str] | None = None) -> int:
    """Explore, print the figures, optionally write them into the docs."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    names = [args.path] if args.path else list(explorer.PATHS)
    runs = [(name, False) for name in names]
    for library in ("Delta", "Iceberg"):  # the paths with another library's writes
        if not args.path or library in args.path:
            runs.append((f"file -> {library}", True))
    t0 = time.monotonic()
    reports = []
    for name, strict in runs:
        with tempfile.TemporaryDirectory(prefix="crash-explore-") as tmp:
            label = f"{name} (strict)" if strict else name
            print(f"exploring {label} ...", file=sys.stderr, flush=True)
            report = explorer.explore(name, explorer.PATHS[name], Path(tmp),
                                      per_point=args.per_point, seed=args.seed, strict=strict,
                                      progress=lambda m: print(m, file=sys.stderr, flush=True))
            reports.append((label, strict, report))
    text = _markdown(reports, time.monotonic() - t0, args)
    print(text)
    if args.write_docs:
        _write_docs(Path(args.write_docs), text)
    return 1 if any(r.findings or r.refused for _, strict, r in reports if not strict) else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", choices=list(explorer.PATHS), help="one path only")
    parser.add_argument("--per-point", type=int, default=16,
                        help="states per crash point before sampling (default 16)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--write-docs", metavar="FILE",
                        help="replace the figures between the crash-explorer markers")
    return parser


def _markdown(reports: list[tuple[str, bool, explorer.Report]], seconds: float,
              args: argparse.Namespace) -> str:
    lines = [
        f"Crash explorer: `python scripts/crash_explore.py --per-point {args.per_point} "
        f"--seed {args.seed}` ({time.strftime('%Y-%m-%d')}, {seconds / 60:.1f} min).",
        "",
        "| path | operations recorded | crash points | crash states | distinct states "
        "| recovered exactly once | refused (clear error) | failed |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, _strict, r in reports:
        ops = ", ".join(f"{k} {v}" for k, v in sorted(r.ops.items()))
        lines.append(f"| {label} | {ops} | {r.crash_points} | {r.states:,} | {r.distinct:,} "
                     f"| {r.recovered:,} | {len(r.refused)} | {len(r.findings)} |")
    for label, _strict, r in reports:
        problems = [f"{f.problem}" for f in r.findings] + list(r.refused)
        if problems:
            kinds: dict[str, int] = {}
            for p in problems:
                key = _kind(p)
                kinds[key] = kinds.get(key, 0) + 1
            lines.append("")
            lines.append(f"{label}: " + "; ".join(f"{n} x {k}" for k, n in kinds.items()))
    return "\n".join(lines)


def _kind(problem: str) -> str:
    """A problem without its file names and numbers, to count alike ones together."""
    if "No such file" in problem:
        return "a log entry persisted without its data file (output unreadable)"
    if "range.end" in problem or "parquet" in problem.lower():
        return "a log entry persisted with a torn data file (output unreadable)"
    if "Json error" in problem or "Truncated" in problem:
        return "a torn log entry (the table cannot be opened: refused)"
    return problem.split(":", maxsplit=1)[0]


def _write_docs(path: Path, text: str) -> None:
    doc = path.read_text(encoding="utf-8")
    if START not in doc or END not in doc:
        raise SystemExit(f"{path} has no {START} ... {END} markers")
    head, rest = doc.split(START, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{START}\n{text}\n{END}{tail}", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
