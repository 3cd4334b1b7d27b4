"""A public snapshot of a query: what every view of a query reads.

The notebook view, ``explain()`` and the Prometheus collector take a
:class:`QuerySnapshot` (made by ``StreamingQuery.snapshot()``), never the query
or its engine, so they cannot reach into private state and cannot import the
query: the dependency runs one way, from the query to its views.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from microbatch.observability.progress_schema import ProgressRecord
from microbatch.plan.nodes import PlanNode

__all__ = ["QuerySnapshot"]


@dataclass(frozen=True)
class QuerySnapshot:
    """A query at one moment; the progress records are the query thread's copies."""

    id: str
    """The query id (stable across restarts of a checkpoint)."""
    run_id: str
    name: str | None
    checkpoint: str
    trigger: str
    message: str
    """``initializing``, ``running``, ``stopped`` or ``failed: ...``."""
    is_active: bool
    failed: bool
    metrics_url: str | None
    recent: Sequence[ProgressRecord]
    """Progress records of recent batches, oldest first."""
    totals: Mapping[str, Any]
    """This run's totals (batches, input/output/late/dead-letter rows, per source)."""
    plan: PlanNode
    node_ids: Mapping[int, str] = field(default_factory=dict)
    """Plan node (``id(node)``) -> the id the engine gave it: a stateful operator
    (``agg-0``), a watermark node (``wm-0``) or a source (``0``)."""

    @property
    def label(self) -> str:
        """The query's name, else its id."""
        return self.name or self.id or "query"

    @property
    def last(self) -> ProgressRecord | None:
        """The newest progress record, or ``None``."""
        return self.recent[-1] if self.recent else None
