"""Subprocess entry point: run one phase of one workload, write its JSON result.

``python -m benchmarks.worker WORKLOAD PHASE WORKDIR RESULT [--quick] [--reps N]``
Each phase runs in its own process so its peak RSS is its own.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from benchmarks import registry
from benchmarks.harness import Config, peak_rss_mb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.worker")
    parser.add_argument("workload")
    parser.add_argument("phase")
    parser.add_argument("workdir", type=Path)
    parser.add_argument("result", type=Path)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int)
    args = parser.parse_args(argv)
    cfg = Config(quick=args.quick, reps=args.reps)
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    result = registry.load(args.workload).run_phase(args.phase, cfg, args.workdir)
    result["peak_rss_mb"] = peak_rss_mb()
    args.result.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
