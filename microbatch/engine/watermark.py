"""Event-time watermarks: all of the watermark logic lives here.

Rule (docs/design.md): per input partition, the candidate is the maximum event
time seen minus the delay; the watermark of one ``with_watermark`` node is
the minimum over its partitions that are not idle (no rows for longer than
``idle_timeout`` of processing time); several nodes combine by ``min``
(default) or ``max``; the watermark never moves backwards.

NOTE: ordering matters for replay. The value computed at the end of batch N
is written to ``commits/N`` and recorded as the watermark in force in
``offsets/N+1``; batch N itself only ever uses the value recorded in its own
``offsets/N``. Idleness is judged against each batch's recorded timestamp,
never the wall clock of a re-run, so replays see the same watermarks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from microbatch.frames import collect
from microbatch.plan.event_time import WatermarkSpec, event_time_ms
from microbatch.plan.nodes import (
    AggregateNode,
    DedupeNode,
    IntervalJoinNode,
    PlanNode,
    StatefulNode,
)
from microbatch.plan.windows import SessionWindowSpec, WindowSpec
from microbatch.types import WatermarkPolicy

PARTITION_COLUMN = "__mb_partition"
"""Hidden column carrying a row's source partition up to the watermark node."""
MAX_REPORTED_PARTITIONS = 256
"""Partitions listed per progress record under ``watermark_partitions``."""

__all__ = [
    "PARTITION_COLUMN",
    "WatermarkSpec",
    "WatermarkTracker",
    "closes_state",
    "event_time_ms",
    "event_time_reach_ms",
]


def event_time_reach_ms(plan: PlanNode) -> int:
    """How far past a row's event time the plan's stateful operators may hold it.

    The sum over stateful nodes of a window's size plus its allowed lateness, a
    session's gap, an interval join's widest bound and a dedupe's ``within``
    (chained operators add up, so the sum bounds them all). A watermark of
    ``newest event time + reach`` closes every window, session and join
    buffer that rows up to the newest event time opened: the end of input of
    ``flush_at_end`` (see :meth:`WatermarkTracker.end_of_input`).
    """
    reach = 0
    for node in plan.walk():
        if isinstance(node, AggregateNode) and isinstance(node.window, WindowSpec):
            reach += node.window.size_ms + node.window.allowed_lateness_ms
        elif isinstance(node, AggregateNode) and isinstance(node.window, SessionWindowSpec):
            reach += node.window.gap_ms
        elif isinstance(node, IntervalJoinNode):
            reach += max(abs(node.spec.lower_ms), abs(node.spec.upper_ms))
        elif isinstance(node, DedupeNode):
            reach += node.within_ms or 0
    return reach



def closes_state(plan: PlanNode, before: int | None, after: int | None) -> bool:
    """Whether moving the watermark from ``before`` to ``after`` can close or
    evict anything: for tumbling and hopping windows, only when it crosses a
    window end (a multiple of the slide, or that plus the allowed lateness);
    any other stateful node is assumed to have something (its operator's
    ``has_expirable_state`` decides).

    A processing-time watermark moves at every trigger; this keeps an idle query
    from running a no-data batch per trigger when no window ends in between.
    """
    if after is None or before is None or after <= before:
        return False
    for node in plan.walk():
        if isinstance(node, AggregateNode) and isinstance(node.window, WindowSpec):
            slide, late = node.window.slide_ms, node.window.allowed_lateness_ms
            if any((after - lag) // slide > (before - lag) // slide for lag in {0, late}):
                return True
        elif isinstance(node, StatefulNode) and not (
            isinstance(node, AggregateNode) and node.window is None
        ):
            return True
    return False


class WatermarkTracker:
    """Per-partition maxima of every watermark node, and the resulting watermark."""

    def __init__(self, specs: dict[str, WatermarkSpec], policy: WatermarkPolicy = "min") -> None:
        self.specs = specs
        self.policy = policy
        self.current: int | None = None
        self.held = False
        """``hold_watermark``: batches do not move the watermark (:meth:`hold`)."""
        # node id -> partition id -> {"max": ms, "seen": processing ms}
        self.partitions: dict[str, dict[str, dict[str, int]]] = {nid: {} for nid in specs}

    def observe(self, node_id: str, df: pl.DataFrame, batch_timestamp_ms: int) -> None:
        """Fold one batch's rows at a watermark node into the per-partition maxima."""
        self.fold(node_id, self.maxima(node_id, df, batch_timestamp_ms), batch_timestamp_ms)

    def maxima(
        self, node_id: str, df: pl.DataFrame, batch_timestamp_ms: int
    ) -> dict[str, int]:
        """The maximum event time per source partition of rows seen at a node
        (what :meth:`fold` takes; workers of a scaled-out query send these)."""
        spec = self.specs[node_id]
        if df.height == 0:
            return {}
        ts = event_time_ms(spec.column, df.schema)
        part = (
            pl.col(PARTITION_COLUMN).cast(pl.String)
            if PARTITION_COLUMN in df.columns
            else pl.lit("0")
        )
        rows = df.lazy().select(part.alias("p"), ts.alias("t")).drop_nulls("t")
        if spec.max_future_skew_ms is not None:
            rows = rows.filter(pl.col("t") <= batch_timestamp_ms + spec.max_future_skew_ms)
        found = collect(rows.group_by("p").agg(pl.col("t").max()))
        return {str(p): int(t) for p, t in found.iter_rows()}  # one row per partition

    def fold(self, node_id: str, maxima: Mapping[str, int], batch_timestamp_ms: int) -> None:
        """Take per-partition maxima seen in a batch (max is order-free, so the
        pieces of a batch may be folded in any order)."""
        seen = self.partitions[node_id]
        for p, t in maxima.items():
            entry = seen.setdefault(p, {"max": t, "seen": batch_timestamp_ms})
            entry["max"] = max(entry["max"], t)
            entry["seen"] = batch_timestamp_ms

    def partition_report(self, batch_ms: int) -> list[dict[str, Any]]:
        """Per node and partition, what holds the watermark where it is (for the
        progress record; at most :data:`MAX_REPORTED_PARTITIONS` entries)."""
        out: list[dict[str, Any]] = []
        for nid, spec in self.specs.items():
            node_wm = self.node_watermark(nid, batch_ms)
            for pid, seen in sorted(self.partitions.get(nid, {}).items()):
                idle_ms = batch_ms - seen["seen"]
                idle = spec.idle_timeout_ms is not None and idle_ms > spec.idle_timeout_ms
                out.append(
                    {
                        "node": nid,
                        "column": spec.column,
                        "partition": pid,
                        "max_event_time_ms": seen["max"],
                        "last_rows_at_ms": seen["seen"],
                        "idle_ms": idle_ms,
                        "idle": idle,
                        "holding": not idle and seen["max"] - spec.delay_ms == node_wm,
                    }
                )
                if len(out) >= MAX_REPORTED_PARTITIONS:
                    return out
        return out

    def node_watermark(self, node_id: str, now_ms: int) -> int | None:
        """The watermark of one node: min over active partitions of max - delay;
        ``now_ms`` for a processing-time node (its rows all carry the batch's time)."""
        spec = self.specs[node_id]
        if spec.processing_time:
            return now_ms
        parts = self.partitions[node_id]
        if not parts:
            return None
        active = [
            p["max"]
            for p in parts.values()
            if spec.idle_timeout_ms is None or now_ms - p["seen"] <= spec.idle_timeout_ms
        ]
        # every partition idle: nothing holds the watermark back any more
        candidates = active or [p["max"] for p in parts.values()]
        return min(candidates) - spec.delay_ms

    def hold(self) -> None:
        """Hold the watermark where it is until the end of input (``hold_watermark``).

        Batches still fold their event-time maxima (so :meth:`end_of_input` knows
        the newest row), but neither :meth:`advance` nor a processing-time
        attribute moves the watermark: no row is late and no window closes
        before the flush at the end of input (:meth:`raise_to`), whatever the
        batch boundaries. A restatement's rule (``microbatch backfill
        --replace-where``).
        """
        self.held = True

    def advance(self, now_ms: int) -> int | None:
        """Recompute the watermark after a batch; it never moves backwards (nor
        at all when :meth:`held <hold>`)."""
        if not self.held:
            self.current = self._at(now_ms)
        return self.current

    def planned(self, now_ms: int) -> int | None:
        """The watermark in force for a batch planned at processing time ``now_ms``.

        The value computed after the previous batch (:meth:`advance`), except on
        a stream with a processing-time attribute (``with_processing_time``):
        its watermark is the batch's own time, so a batch closes every
        processing-time window that ends at or before the moment it was planned
        (its own rows, stamped with that moment, are never late), and an idle
        query's trigger still runs the no-data batch that closes them. The value
        is recorded in ``offsets/N``: a re-run uses it, never the clock.
        """
        if self.held or not self.has_processing_time():
            return self.current
        return self._at(now_ms)

    def has_processing_time(self) -> bool:
        """Some watermark node is a processing-time attribute."""
        return any(spec.processing_time for spec in self.specs.values())

    def _at(self, now_ms: int) -> int | None:
        """The nodes' watermarks at ``now_ms`` combined by the policy, never below
        :attr:`current` (no change to the tracker)."""
        values = [self.node_watermark(nid, now_ms) for nid in self.specs]
        known = [v for v in values if v is not None]
        if not known or (self.policy == "min" and len(known) < len(values)):
            return self.current
        new = min(known) if self.policy == "min" else max(known)
        return new if self.current is None or new > self.current else self.current

    def raise_to(self, watermark_ms: int | None) -> None:
        """Hold the watermark at ``watermark_ms`` at least (it never moves backwards).

        NOTE: after a batch ran at watermark W, the next one must not run below
        W; a re-run of a flush batch restores the tracker from the commit before
        it, whose watermark is lower, so the engine raises it to the batch's own.
        """
        if watermark_ms is not None and (self.current is None or watermark_ms > self.current):
            self.current = watermark_ms

    def end_of_input(self, reach_ms: int) -> int | None:
        """The watermark at the end of a bounded input: the newest event time seen
        on any partition (the delay no longer matters: nothing more comes) plus
        ``reach_ms`` (:func:`event_time_reach_ms`); ``None`` when no row was seen.

        Flink's ``MAX_WATERMARK`` at the end of input, made finite so that a later
        run on the same checkpoint still accepts rows of newer windows.
        """
        newest = [p["max"] for parts in self.partitions.values() for p in parts.values()]
        if not newest:
            return None
        return max(newest) + reach_ms

    def to_json(self) -> dict[str, Any]:
        return {"watermark_ms": self.current, "partitions": self.partitions}

    def restore(self, doc: Mapping[str, Any] | None) -> None:
        """Load the state written to ``commits/N``."""
        if not doc:
            return
        self.current = doc.get("watermark_ms")
        for nid, parts in (doc.get("partitions") or {}).items():
            if nid in self.partitions:
                self.partitions[nid] = {p: dict(v) for p, v in parts.items()}
