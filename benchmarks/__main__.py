"""``python -m benchmarks [WORKLOAD ...] [--quick] [--out DIR]``.

``python -m benchmarks compare [...]`` runs :mod:`benchmarks.compare` instead.

Runs the chosen workloads (all by default), each phase in its own
subprocess, prints a Markdown table and writes ``<out>/results.md``,
``<out>/results.json`` and, when matplotlib is importable,
``<out>/results.png``. A workload that cannot run is reported as skipped;
the others go on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks import registry, report
from benchmarks.harness import Config
from benchmarks.measure import machine_info
from benchmarks.runner import run_workload

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                        help=f"any of {', '.join(registry.MODULES)} (default: all)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 1M events in 20 files, one repetition")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory")
    parser.add_argument("--reps", type=int, help="repetitions (default: per workload)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per phase before it counts as failed "
                             "(default 900 quick, 3600 full)")
    args = parser.parse_args(argv)
    unknown = [w for w in args.workloads if w not in registry.MODULES]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {list(registry.MODULES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compare"]:  # python -m benchmarks compare ... (vs Spark, Bytewax, Quix)
        from benchmarks.compare import main as compare_main

        return compare_main(argv[1:])
    args = parse_args(argv)
    cfg = Config(quick=args.quick, reps=args.reps)
    timeout = args.timeout or (900.0 if cfg.quick else 3600.0)
    names = args.workloads or list(registry.MODULES)
    machine = machine_info()
    outcomes = []
    for name in names:
        print(f"== {name}", flush=True)
        outcomes.append(run_workload(name, cfg, timeout_s=timeout))
    text = report.render(outcomes, machine, cfg)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(text + "\n")
    report.write_json(args.out / "results.json", outcomes, machine, cfg)
    print()
    print(text)
    print(report.write_plot(args.out / "results.png", outcomes))
    print(f"results written to {args.out}/results.md and results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
