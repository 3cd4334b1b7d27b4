"""The state memory budget: a query whose state outgrows it stops with a clear error.

``writer.start(..., state_memory_budget="512MB")`` (CLI: ``microbatch run
--state-memory-budget 512MB``) caps the memory the query's state stores hold.
After step 4 (execute) of every batch, before the sink, the engine adds up the
``bytes`` each stateful operator reported for the batch (its stores' Arrow /
numpy buffers, spare capacity included: what the process really holds; an
O(1)-per-store figure, no scan of the rows). Over the budget, the batch fails
with :class:`~microbatch.StateBudgetExceededError` naming the largest
operators and how to bound them; it is not committed, so a restart with a
larger budget, a TTL or a shorter window re-runs it from the checkpoint,
exactly once. The alternative — the OS killing the process — loses the reason.

With the Ray executor the operators' figures are summed over every shard: the
budget bounds the whole query's state, wherever it lives.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from microbatch.exceptions import PlanError, StateBudgetExceededError
from microbatch.operators.base import StatefulOperator

OPTION = "state_memory_budget"
"""The ``writer.start`` argument (the CLI's flag is ``--state-memory-budget``)."""

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
    "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
    "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
    "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
}
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)")
SHOWN = 3
"""How many of the largest operators the error describes."""


def parse_size_bytes(value: int | str, *, what: str = OPTION) -> int:
    """``value`` in bytes: an int, or a number with a unit (``"512MB"``, ``"1.5g"``,
    ``"64KiB"``); like Spark's and Flink's memory options, ``KB``/``MB``/``GB``/``TB``
    are powers of 1024 (the same as ``KiB``...). Raises :class:`PlanError` naming
    ``what`` when it is not a positive size."""
    if isinstance(value, bool):
        raise PlanError(f"{what}: expected a size such as '512MB', got {value!r}")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.fullmatch(str(value).strip().lower())
        if match is None or match.group(2) not in _UNITS:
            raise PlanError(
                f"{what}: cannot parse {value!r}; write a number and a unit, e.g. '512MB', "
                "'2GB' or '64KiB' (KB, MB, GB are powers of 1024, as in Spark and Flink)"
            )
        size = int(float(match.group(1)) * _UNITS[match.group(2)])
    if size <= 0:
        raise PlanError(f"{what}: must be a positive size, got {value!r}")
    return size


def format_bytes(size: float) -> str:
    """``12.3 MiB``: a byte count for people."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover


@dataclass(frozen=True)
class StateBudget:
    """The budget of one query, checked after each batch's execute."""

    limit: int
    """Bytes the state of all operators together may hold."""
    spec: str
    """The budget as the user wrote it (echoed in the error)."""

    @classmethod
    def of(cls, value: int | str | None) -> StateBudget | None:
        """The budget ``value`` asks for (``None``: no budget)."""
        if value is None:
            return None
        return cls(parse_size_bytes(value), str(value))

    def check(
        self,
        batch_id: int,
        metrics: Mapping[str, Mapping[str, Any]],
        operators: Sequence[StatefulOperator],
        *,
        has_watermark: bool,
        fallback: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """Raise :class:`StateBudgetExceededError` when the operators' ``bytes``
        (this batch's ``metrics``, else ``fallback``: the last committed figures)
        add up to more than the budget. O(operators)."""
        total = 0
        for op in operators:
            figures = metrics.get(op.operator_id)
            if not figures and fallback is not None:
                figures = fallback.get(op.operator_id)
            total += int((figures or {}).get("bytes") or 0)
        if total <= self.limit:
            return
        sizes = []
        for op in operators:
            figures = metrics.get(op.operator_id) or (fallback or {}).get(op.operator_id) or {}
            sizes.append((int(figures.get("bytes") or 0), int(figures.get("rows") or 0), op))
        sizes.sort(key=lambda s: -s[0])
        raise StateBudgetExceededError(
            self._message(batch_id, total, sizes, has_watermark=has_watermark),
            batch_id=batch_id,
            budget_bytes=self.limit,
            state_bytes=total,
            operators=[
                {"operator": op.operator_id, "kind": _kind(op), "keys": _keys(op),
                 "bytes": nbytes, "rows": rows}
                for nbytes, rows, op in sizes
            ],
        )

    def _message(
        self,
        batch_id: int,
        total: int,
        sizes: list[tuple[int, int, StatefulOperator]],
        *,
        has_watermark: bool,
    ) -> str:
        parts = []
        for nbytes, rows, op in sizes[:SHOWN]:
            keys = _keys(op)
            by = f" by {', '.join(map(repr, keys))}" if keys else ""
            parts.append(
                f"{op.operator_id} ({_kind(op)}{by}): {format_bytes(nbytes)} in {rows:,} rows"
            )
        more = f" and {len(sizes) - SHOWN} more" if len(sizes) > SHOWN else ""
        largest = sizes[0][2]
        return (
            f"the query's state holds {format_bytes(total)} ({total:,} bytes) in memory after "
            f"batch {batch_id}, over its {OPTION} of {self.spec} ({self.limit:,} bytes); largest: "
            f"{'; '.join(parts)}{more}. Batch {batch_id} was not committed. To bound the "
            f"state: {_advice(largest, has_watermark)} (a changed operator needs a new "
            f"checkpoint and a backfill); or give it more memory: a larger budget "
            f"(writer.start(..., {OPTION}=...), microbatch run --state-memory-budget SIZE) "
            f"restarts on this checkpoint, and batch {batch_id} then runs again, once"
        )


_KINDS = {
    "window_aggregate": "window aggregation",
    "session_aggregate": "session window aggregation",
    "deduplicate": "drop_duplicates",
    "fire_once": "fire_once",
}


def _kind(op: StatefulOperator) -> str:
    """What the operator is, in the API's words (a plain ``group_by`` has no window)."""
    sig = op.signature()
    kind = str(sig.get("kind") or type(op).__name__)
    if kind == "window_aggregate" and sig.get("window") is None:
        return "group_by aggregation"
    return _KINDS.get(kind, kind)


def _keys(op: StatefulOperator) -> list[str]:
    sig = op.signature()
    for field in ("keys", "subset", "on"):
        keys = sig.get(field)
        if isinstance(keys, list | tuple) and keys:
            return [str(k) for k in keys]
    return []


def _advice(op: StatefulOperator, has_watermark: bool) -> str:
    """How to make operator ``op``'s state expire, by its kind and eviction."""
    eviction = op.eviction(has_watermark=has_watermark)
    kind = op.operator_id.rsplit("-", 1)[0]
    if eviction == "none":
        how = {
            "agg": "give its group_by a TTL (group_by(..., ttl='1d') forgets keys idle that "
                   "long), or group by mb.window(...) with a watermark so that windows close "
                   "and leave state",
            "dedupe": "give drop_duplicates a ttl= (or within= with a watermark)",
            "transform": "give transform_with_state a ttl=, or delete state in fn",
        }.get(kind, "add a watermark (with_watermark) so that its state can expire")
        return f"{how} (its state has no TTL and no watermark eviction, so it grows with " \
               "every new key)"
    if eviction == "ttl":
        return "shorten its ttl= so that idle keys expire sooner"
    return (
        "let its state expire sooner: a shorter window or session gap, less "
        "allowed_lateness, or a shorter watermark delay (with_watermark(col, delay))"
    )
