"""Crash soak: kill real microbatch jobs many times, restart them, check the output.

Usage::

    .venv/bin/python scripts/crash_soak.py --kills 50 --seed 1
    .venv/bin/python scripts/crash_soak.py --kills 20 --job generator/session/parquet
    .venv/bin/python scripts/crash_soak.py --kills 1000 --jobs 3 --write-docs docs/reliability.md
    make soak   # the last line, from a fresh clone (about 40 minutes on 2 cores)

For each job variant (``SOURCE/AGG/SINK``; default: the six below) the job
runs as a ``microbatch run`` subprocess on one checkpoint and is SIGKILLed at
every named lifecycle point (the sink's own points included), inside state
store commits and then at random moments, and stopped with SIGTERM once,
until its share of ``--kills`` is used; then it runs to the end and its
output is compared with a one-shot Polars computation (see
``tests/reliability/harness.py``): Parquet and Delta tables as read back, the
Kafka output topic as a ``read_committed`` consumer sees it, the webhook's
rows as the receiver accepted them. The Kafka variants run against a real
broker that the soak starts (``scripts/kafka_broker.py``) and stops, unless
``--bootstrap`` names one. The bad-input corpus of the file source runs too
(``tests/reliability/corpus.py``). Prints Markdown tables; ``--write-docs``
puts them into the figures section of that file. Exit code 1 when any
output is not exact or any bad input lost a record.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "reliability")]

import corpus  # noqa: E402  (the harness lives next to the tests that use it)
import harness  # noqa: E402

from scripts.kafka_broker import running_broker  # noqa: E402

VARIANTS: dict[str, harness.JobSpec] = {
    "generator/tumbling/parquet": harness.JobSpec(rows=1_500_000, cap=4_000),
    "generator/session/parquet": harness.JobSpec(agg="session", rows=1_500_000, cap=4_000,
                                                 gap="3s"),
    "files/tumbling/delta": harness.JobSpec(source="files", sink="delta", files=240, cap=2),
    "files/session/parquet": harness.JobSpec(source="files", agg="session", files=240, cap=2),
    "kafka/tumbling/kafka": harness.JobSpec(source="kafka", sink="kafka", files=240, cap=1_000),
    "kafka/tumbling/webhook": harness.JobSpec(source="kafka", sink="webhook", files=240,
                                              cap=1_000, cards=20),
}
"""The soak's job variants: at least 25 minutes of generated payments per
generator run, at least 240 files of 500 payments (plus 2 bad lines each) per
files run, at least 240 chunks of 500 payments (plus 2 bad values each) in
the input topic of a Kafka run (two partitions, 1,000 records per batch); more
with more kills (:func:`sized`). Kafka -> Kafka is exactly once (one
transaction per batch); Kafka -> webhook is one POST per result row with the
Idempotency-Key ``<window_start>/<card_id>`` (20 cards: a few dozen POSTs
per batch) to a receiver that fails 5 % of the requests with 503."""
BATCHES_PER_KILL = 5
"""Input per kill, in batches: a run is killed a few batches after its start
(a named point within two batches, a random moment within 2.5 s), so that
much input leaves enough for every kill to land before the input runs out;
the clean run at the end processes the rest."""

FIGURES_START = "<!-- figures:start -->"
FIGURES_END = "<!-- figures:end -->"


def share(total: int, parts: int, index: int) -> int:
    """``index``-th of ``parts`` near-equal shares of ``total``."""
    return total // parts + (1 if index < total % parts else 0)


def sized(spec: harness.JobSpec, kills: int) -> harness.JobSpec:
    """``spec`` with at least :data:`BATCHES_PER_KILL` batches of input per kill."""
    if spec.landed_input:
        per_batch = spec.cap if spec.source == "files" else spec.cap // harness.EVENTS_PER_FILE
        return dataclasses.replace(spec, files=max(spec.files,
                                                   kills * BATCHES_PER_KILL * per_batch))
    return dataclasses.replace(spec, rows=max(spec.rows, kills * BATCHES_PER_KILL * spec.cap))


def named_points(spec: harness.JobSpec, kills: int, index: int) -> list[str]:
    """All named points when the share allows; otherwise two thirds of it,
    rotated per variant so that the variants together cover every point."""
    points = harness.points_for(spec)
    if kills >= len(points) + 2:
        return points
    count = max(1, 2 * kills // 3)
    start = (index * count) % len(points)
    return (points[start:] + points[:start])[:count]


def run_soaks(names: list[str], kills: int, seed: int, work: Path, *, bootstrap: str = "",
              jobs: int = 1) -> list[harness.Soak]:
    """One soak per variant, sharing ``kills`` between them; ``jobs`` at a time."""

    def one(index: int) -> harness.Soak:
        name = names[index]
        mine = share(kills, len(names), index)
        spec = sized(VARIANTS[name], mine)
        if "kafka" in (spec.source, spec.sink):
            spec = dataclasses.replace(spec, bootstrap=bootstrap,
                                       topic=f"soak-{index}-{uuid.uuid4().hex[:8]}")
        started = time.monotonic()
        print(f"-- {name}: {mine} kills", flush=True)
        done = harness.soak(spec, work / name.replace("/", "-"), kills=mine, seed=seed + index,
                            named=named_points(spec, mine, index))
        assert done.verdict is not None
        if done.kills < mine:
            print(f"   {name}: WARNING: the input ran out after {done.kills} of {mine} kills",
                  flush=True)
        print(f"   {name}: {done.kills} kills, {done.restarts} restarts, batches "
              f"{done.batches_when_killed} when killed / {done.batches_total}, "
              f"exact={done.verdict.exact} ({time.monotonic() - started:.0f} s)", flush=True)
        return done

    def reported(index: int) -> harness.Soak | None:
        try:
            return one(index)
        except Exception:  # say so now, not when the other variants are done
            print(f"   {names[index]}: FAILED\n{traceback.format_exc()}", flush=True)
            return None

    # the Kafka variants take longest per kill: start them first
    first = sorted(range(len(names)), key=lambda i: "kafka" not in names[i])
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        futures = {i: pool.submit(reported, i) for i in first}
        done = [futures[i].result() for i in range(len(names))]
    failed = [names[i] for i, run in enumerate(done) if run is None]
    if failed:
        raise SystemExit(f"the soak of {', '.join(failed)} failed (see above)")
    return [run for run in done if run is not None]


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
            "batches (killed in) | records in | records counted out / expected | "
            "result rows out / expected | duplicated | lost | wrong | late | "
            "dead letters / expected | exact |")
    lines = [head, "|" + "---|" * 14]
    total: Counter[str] = Counter()
    for run in soaks:
        v = run.verdict
        assert v is not None
        stops = sum(o.kill.how == "sigterm" for o in run.outcomes)
        row = {
            "kills": run.kills, "stops": stops, "restarts": run.restarts,
            "batches": run.batches_total, "killed_in": run.batches_when_killed,
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
        f"| {name} | {r['kills']} | {r['stops']} | {r['restarts']} | "
        f"{r['batches']:,} ({r['killed_in']:,}) | {r['in']:,} | "
        f"{r['out']:,} / {r['out_want']:,} | {r['rows']:,} / {r['rows_want']:,} | "
        f"{r['dupes']} | {r['lost']} | {r['wrong']} | {r['late']} | "
        f"{r['dead']} / {r['dead_want']} | {exact} |"
    )


def sink_table(soaks: list[harness.Soak]) -> str:
    """What the Kafka and webhook sinks did beyond the rows (empty without them)."""
    lines = []
    for run in soaks:
        v = run.verdict
        assert v is not None
        if run.spec.sink == "kafka":
            lines.append(f"| {run.spec.name} | {v.rows_out:,} records visible to read_committed; "
                         f"{v.aborted_rows:,} more in aborted transactions (written by killed "
                         "runs, never visible) |")
        elif run.spec.sink == "webhook":
            lines.append(f"| {run.spec.name} | {v.deliveries:,} POSTs acknowledged for "
                         f"{v.rows_out:,} distinct keys ({v.rows_expected:,} expected): "
                         f"{v.redeliveries:,} redeliveries of an acknowledged key with the "
                         f"same body (deduplicated by the receiver), {v.conflicts} with "
                         "another body |")
    return "\n".join(["| job | sink |", "|---|---|", *lines]) if lines else ""


def points_table(soaks: list[harness.Soak]) -> str:
    """How many kills landed at each kind of moment, per variant."""
    counts: dict[str, Counter[str]] = {}
    for run in soaks:
        mine = counts.setdefault(run.spec.name, Counter())
        for outcome in run.outcomes:
            if outcome.killed:
                kill = outcome.kill
                key = (f"random moment{' (mid-batch)' if kill.settle else ''}"
                       if kill.how == "random" else
                       f"state store: {kill.point}" if kill.how == "state" else kill.point)
                mine[key] += 1
    order = [*harness.POINTS[:4], harness.DEAD_LETTER_POINT, *harness.POINTS[4:],
             *harness.SINK_POINTS["delta"], *harness.STATE_FAULTS]
    every = {k for c in counts.values() for k in c}
    keys = sorted(every, key=lambda k: (order.index(k.removeprefix("state store: "))
                                        if k.removeprefix("state store: ") in order
                                        else len(order), k))
    names = list(counts)
    lines = ["| killed at | " + " | ".join(names) + " | all |",
             "|---|" + "---:|" * (len(names) + 1)]
    for k in keys:
        label = k if k.startswith("random") else f"`{k}`"
        cells = [str(counts[n][k]) if counts[n][k] else "-" for n in names]
        total = sum(c[k] for c in counts.values())
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {total} |")
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


def revision() -> str:
    """The commit the soak ran on (``+changes`` when the work tree differs)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"
    return f"commit {head}{' +changes' if dirty.strip() else ''}"


def figures(soaks: list[harness.Soak], results: list[corpus.CaseResult], seed: int,
            seconds: float, command: str) -> str:
    """The Markdown figures section."""
    sink = sink_table(soaks)
    parts = [
        f"Soak: `{command}` ({time.strftime('%Y-%m-%d')}, {revision()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{seconds / 60:.1f} min).",
        "",
        soak_table(soaks),
        "",
        "*Records counted out*: the sum of `n` over the output rows; the other input "
        "records are in windows or sessions that the final watermark has not closed "
        "(not emitted yet, by design). *Batches*: committed in all; the kills landed in "
        "the first ones (in brackets), the clean run did the rest. *Duplicated*: output "
        "rows of a key (window, card) that is there more than once (Kafka: as a "
        "`read_committed` consumer sees the topic), plus, for the webhook, POSTs of an "
        "acknowledged key with a different body. "
        "*Lost*: expected rows missing; *wrong*: rows with other values, or not expected "
        "at all; *late*: rows in the late output (none are late in this input).",
        *(["", sink] if sink else []),
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
    parser.add_argument("--jobs", type=int, default=1,
                        help="variants soaked at the same time (default 1)")
    parser.add_argument("--bootstrap", default="",
                        help="a running Kafka broker (default: start one for the soak)")
    args = parser.parse_args(argv)
    names = args.job or list(VARIANTS)
    work = args.work or Path(tempfile.mkdtemp(prefix="crash-soak-"))
    started = time.monotonic()
    command = (f"python scripts/crash_soak.py --kills {args.kills} --seed {args.seed}"
               + "".join(f" --job {n}" for n in args.job or ())
               + (f" --jobs {args.jobs}" if args.jobs != 1 else ""))
    bootstrap = args.bootstrap
    try:
        with contextlib.ExitStack() as stack:  # the broker stops before the work dir goes
            if not bootstrap and any(VARIANTS[n].source == "kafka" or VARIANTS[n].sink == "kafka"
                                     for n in names):
                print("-- Kafka broker", flush=True)
                broker = stack.enter_context(running_broker(work / "kafka-broker"))
                bootstrap = broker.bootstrap or ""
            soaks = run_soaks(names, args.kills, args.seed, work / "soak", bootstrap=bootstrap,
                              jobs=args.jobs)
            results = [] if args.no_corpus else run_corpus(work / "corpus")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    text = figures(soaks, results, args.seed, time.monotonic() - started, command)
    print(text)
    if args.write_docs:
        write_docs(args.write_docs, text)
    exact = all(s.verdict is not None and s.verdict.exact for s in soaks)
    return 0 if exact and not any(r.problems or r.lost for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
