"""Every workload, by name, in the order they run."""

from __future__ import annotations

import importlib

from benchmarks.harness import Workload

MODULES = {
    "fixed-cost": "benchmarks.fixed_cost",
    "stateless": "benchmarks.stateless",
    "q1-tumbling": "benchmarks.q1_tumbling",
    "q2-hopping": "benchmarks.q2_hopping",
    "q3-session": "benchmarks.q3_session",
}


def load(name: str) -> Workload:
    """The workload ``name`` (imported on demand, so one broken module skips alone)."""
    module = importlib.import_module(MODULES[name])
    workload: Workload = module.WORKLOAD
    return workload
