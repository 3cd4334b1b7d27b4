"""Old import paths, kept working for one release (removed in 0.3).

0.2 grouped the package into rooms (``api/``, ``plan/``, ``engine/``,
``observability/``, ``cli/``, ``tools/``). A user's ``import microbatch.stream``
or ``from microbatch.windows import window`` still works: a finder on
``sys.meta_path`` answers the old name with the module at its new place and
emits a ``DeprecationWarning`` naming it (:mod:`microbatch._deprecation`, the
one deprecation mechanism). No file is left at the old place.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType

from microbatch._deprecation import REMOVED_IN, issue_deprecation_warning

MOVED: dict[str, str] = {
    "microbatch.stream": "microbatch.api.stream",
    "microbatch.writer": "microbatch.api.writer",
    "microbatch.query": "microbatch.api.query",
    "microbatch.windows": "microbatch.plan.windows",
    "microbatch.aggregates": "microbatch.plan.aggregates",
    "microbatch.joins": "microbatch.plan.joins",
    "microbatch.triggers": "microbatch.plan.triggers",
    "microbatch.execution": "microbatch.engine.execution",
    "microbatch.executor": "microbatch.engine.batch_executor",
    # 0.3: one letter from engine/executors.py (where a query runs); this one
    # evaluates the plan over a batch
    "microbatch.engine.executor": "microbatch.engine.batch_executor",
    "microbatch.watermark": "microbatch.engine.watermark",
    "microbatch.read_ahead": "microbatch.engine.read_ahead",
    "microbatch.faults": "microbatch.engine.faults",
    "microbatch.progress": "microbatch.observability.progress",
    "microbatch.batch_metrics": "microbatch.observability.record",
    "microbatch.source_lag": "microbatch.observability.source_lag",
    "microbatch.latency": "microbatch.observability.latency",
    "microbatch.status": "microbatch.observability.status",
    "microbatch.status_view": "microbatch.observability.status_view",
    "microbatch.prometheus": "microbatch.observability.prometheus",
    "microbatch.report": "microbatch.observability.report",
    "microbatch.query_view": "microbatch.observability.query_view",
    "microbatch.cli_display": "microbatch.cli.display",
    "microbatch.jobfile": "microbatch.cli.jobfile",
    "microbatch.backfill": "microbatch.cli.backfill",
    "microbatch.table_diff": "microbatch.tools.diff",
}
"""Old module name -> its module now."""


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module name and loads it as the module at its new place."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        issue_deprecation_warning(
            f"{spec.name} moved to {new}; the old name will be removed in microbatch "
            f"{REMOVED_IN} (everything a job needs is also on `import microbatch as mb`)",
            version="0.2.0",
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module at the new place is already executed."""


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
        sys.meta_path.append(_MovedModules())
