"""Crash soak: kill real microbatch jobs many times, restart them, check the output.

Usage::

    .venv/bin/python scripts/crash_soak.py --kills 50 --seed 1
    .venv/bin/python scripts/crash_soak.py --kills 20 --job generator/session/parquet
    .venv/bin/python scripts/crash_soak.py --kills 50 --write-docs docs/reliability.md

For each job variant (``SOURCE/AGG/SINK``; default: the four below) the job
runs as a ``microbatch run`` subprocess on one checkpoint and is SIGKILLed at
named lifecycle points, inside state store commits and at random moments,
and stopped with SIGTERM once, until its share of ``--kills`` is used; then it
runs to the end and its output is compared with a one-shot Polars
computation (see ``tests/reliability/harness.py``). The bad-input corpus of
the file source runs too (``tests/reliability/corpus.py``). Prints Markdown
tables; ``--write-docs`` puts them into the figures section of that file.
Exit code 1 when any output is not exact or any bad input lost a record.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "reliability")]

import corpus  # noqa: E402  (the harness lives next to the tests that use it)
import harness  # noqa: E402

VARIANTS: dict[str, harness.JobSpec] = {
    "generator/tumbling/parquet": harness.JobSpec(rows=1_500_000, cap=4_000),
    "generator/session/parquet": harness.JobSpec(agg="session", rows=1_500_000, cap=4_000,
                                                 gap="3s"),
    "files/tumbling/delta": harness.JobSpec(source="files", sink="delta", files=240, cap=2),
    "files/session/parquet": harness.JobSpec(source="files", agg="session", files=240, cap=2),
}
"""The soak's job variants: 25 minutes of generated payments per generator
run, 240 files of 500 payments (plus 2 bad lines each) per files run."""

FIGURES_START = "<!-- figures:start -->"
FIGURES_END = "<!-- figures:end -->"


def share(total: int, parts: int, index: int) -> int:
    """``index``-th of ``parts`` near-equal shares of ``total``."""
    return total // parts + (1 if index < total % parts else 0)


def named_points(spec: harness.JobSpec, kills: int, index: int) -> list[str]:
    """All named points when the share allows; otherwise two thirds of it,
    rotated per variant so that the variants together cover every point."""
    points = harness.points_for(spec)
    if kills >= len(points) + 2:
        return points
    count = max(1, 2 * kills // 3)
    start = (index * count) % len(points)
    return (points[start:] + points[:start])[:count]


def run_soaks(names: list[str], kills: int, seed: int, work: Path) -> list[harness.Soak]:
    """One soak per variant, sharing ``kills`` between them."""
    soaks = []
    for index, name in enumerate(names):
        spec = VARIANTS[name]
        mine = share(kills, len(names), index)
        started = time.monotonic()
        print(f"-- {name}: {mine} kills", flush=True)
        done = harness.soak(spec, work / name.replace("/", "-"), kills=mine, seed=seed + index,
                            named=named_points(spec, mine, index))
        print(f"   {done.kills} kills, {done.restarts} restarts, exact={done.verdict.exact} "
              f"({time.monotonic() - started:.0f} s)", flush=True)
        soaks.append(done)
    return soaks


def run_corpus(work: Path) -> list[corpus.CaseResult]:
    """Every bad-input case, each in its own directory (the expected query
    failures of the ``stop`` cases are not logged)."""
    logging.getLogger("microbatch").setLevel(logging.CRITICAL)
    print("-- bad-input corpus", flush=True)
    results = []
    for index, case in enumerate(corpus.cases()):
        results.append(corpus.run_case(case, work / f"case-{index:02d}"))
    return results


def soak_table(soaks: list[harness.Soak]) -> str:
    """Kills, restarts and the verdict per variant, with a total row."""
    head = ("| job (source/aggregation/sink) | kills survived | SIGTERM stops | restarts | "
            "records in | records counted out / expected | result rows out / expected | "
            "duplicates | lost | wrong | late | dead letters / expected | exact |")
    lines = [head, "|" + "---|" * 13]
    total: Counter[str] = Counter()
    for run in soaks:
        v = run.verdict
        assert v is not None
        stops = sum(o.kill.how == "sigterm" for o in run.outcomes)
        row = {
            "kills": run.kills, "stops": stops, "restarts": run.restarts,
            "in": v.records_in, "out": v.records_out, "out_want": v.records_expected,
            "rows": v.rows_out, "rows_want": v.rows_expected, "dupes": v.duplicates,
            "lost": v.missing, "wrong": v.wrong_values + v.extra, "late": v.late_rows,
            "dead": v.dead_letters, "dead_want": v.dead_letters_expected,
        }
        total.update(row)
        lines.append(_soak_row(run.spec.name, row, "yes" if v.exact else "**NO**"))
    all_exact = all(r.verdict is not None and r.verdict.exact for r in soaks)
    lines.append(_soak_row("**total**", dict(total), "yes" if all_exact else "**NO**"))
    return "\n".join(lines)


def _soak_row(name: str, r: dict[str, int], exact: str) -> str:
    return (
        f"| {name} | {r['kills']} | {r['stops']} | {r['restarts']} | {r['in']:,} | "
        f"{r['out']:,} / {r['out_want']:,} | {r['rows']:,} / {r['rows_want']:,} | "
        f"{r['dupes']} | {r['lost']} | {r['wrong']} | {r['late']} | "
        f"{r['dead']} / {r['dead_want']} | {exact} |"
    )


def points_table(soaks: list[harness.Soak]) -> str:
    """How many kills landed at each kind of moment."""
    counts: Counter[str] = Counter()
    for run in soaks:
        for outcome in run.outcomes:
            if outcome.killed:
                kill = outcome.kill
                key = (f"random moment{' (mid-batch)' if kill.settle else ''}"
                       if kill.how == "random" else
                       f"state store: {kill.point}" if kill.how == "state" else kill.point)
                counts[key] += 1
    order = [*harness.POINTS, *harness.SINK_POINTS["delta"], *harness.STATE_FAULTS]
    keys = sorted(counts, key=lambda k: (order.index(k.removeprefix("state store: "))
                                         if k.removeprefix("state store: ") in order
                                         else len(order), k))
    lines = ["| killed at | kills |", "|---|---|"]
    lines += [f"| `{k}` |" + f" {counts[k]} |" if not k.startswith("random") else
              f"| {k} | {counts[k]} |" for k in keys]
    return "\n".join(lines)


def corpus_table(results: list[corpus.CaseResult]) -> str:
    """Bad inputs tried per kind, and what happened."""
    lines = ["| bad input | format | what | outcome | good records in | passed through | "
             "dead letters | late rows | lost |", "|" + "---|" * 9]
    for r in results:
        c = r.case
        ok = "" if not r.problems else " **(" + "; ".join(r.problems) + ")**"
        lines.append(f"| {c.kind} | {c.fmt} | {c.what} | {r.outcome}{ok} | {r.good_in} | "
                     f"{r.passed_through} | {r.dead_letters} | {r.late_rows} | {r.lost} |")
    return "\n".join(lines)


def figures(soaks: list[harness.Soak], results: list[corpus.CaseResult], seed: int,
            seconds: float) -> str:
    """The Markdown figures section."""
    kills = sum(s.kills for s in soaks)
    parts = [
        f"Soak: `python scripts/crash_soak.py --kills {kills} --seed {seed}` "
        f"({time.strftime('%Y-%m-%d')}, {seconds / 60:.1f} min).",
        "",
        soak_table(soaks),
        "",
        "*Records counted out*: the sum of `n` over the output rows; the other input "
        "records are in windows or sessions that the final watermark has not closed "
        "(not emitted yet, by design). *Lost*: expected rows missing; *wrong*: rows with "
        "other values, or not expected at all; *late*: rows in the late output (none are "
        "late in this input).",
        "",
        points_table(soaks),
    ]
    if results:
        lost = sum(r.lost for r in results)
        parts += ["", f"Bad inputs: {len(results)} cases, {lost} good records lost.", "",
                  corpus_table(results)]
    return "\n".join(parts)


def write_docs(path: Path, text: str) -> None:
    """Replace the figures section of ``path`` (between the markers) with ``text``."""
    doc = path.read_text()
    if FIGURES_START not in doc or FIGURES_END not in doc:
        raise SystemExit(f"{path} has no {FIGURES_START} ... {FIGURES_END} section")
    head, rest = doc.split(FIGURES_START, 1)
    _, tail = rest.split(FIGURES_END, 1)
    path.write_text(f"{head}{FIGURES_START}\n{text}\n{FIGURES_END}{tail}")


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run the soaks and the corpus, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=50, help="SIGKILLs in all (default 50)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--job", action="append", choices=sorted(VARIANTS),
                        help="a job variant (repeatable; default: all)")
    parser.add_argument("--no-corpus", action="store_true", help="skip the bad-input corpus")
    parser.add_argument("--work", type=Path, help="working directory (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    parser.add_argument("--write-docs", type=Path, metavar="FILE",
                        help="write the tables into FILE's figures section")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="crash-soak-"))
    started = time.monotonic()
    try:
        soaks = run_soaks(args.job or list(VARIANTS), args.kills, args.seed, work / "soak")
        results = [] if args.no_corpus else run_corpus(work / "corpus")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    text = figures(soaks, results, args.seed, time.monotonic() - started)
    print(text)
    if args.write_docs:
        write_docs(args.write_docs, text)
    exact = all(s.verdict is not None and s.verdict.exact for s in soaks)
    return 0 if exact and not any(r.problems or r.lost for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
