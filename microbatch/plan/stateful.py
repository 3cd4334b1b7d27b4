"""Arbitrary stateful processing: what ``transform_with_state`` takes and gives.

``stream.group_by(*keys).transform_with_state(fn, state_schema=...)`` calls
``fn`` **once per batch** (not once per key) with a :class:`StateInput` of
DataFrames, and ``fn`` answers with a :class:`StateOutput`. Everything is
columnar: ``fn`` is written with Polars expressions over all the keys of the
batch at once (joins, ``group_by``, ``over``), so the hot path has no Python
call per key or per row. See docs/semantics.md ("Stateful processing").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import polars as pl

from microbatch.exceptions import PlanError

__all__ = ["StateInput", "StateOutput", "TransformSpec", "TtlTime"]

TtlTime = Literal["processing", "event"]
TIMER = "timer_ms"
"""Timer columns: the time it fires (epoch ms)..."""
KIND = "timer_kind"
"""... and ``"event"`` (fires when the watermark passes it) or ``"processing"``
(fires when a batch's recorded timestamp reaches it)."""
TIMER_KINDS = ("event", "processing")


@dataclass(frozen=True)
class StateInput:
    """What ``fn`` sees in one batch.

    ``rows``: the batch's rows (those that are not late), all columns, in batch
    order; with ``event_time_order=True``, instead, the rows the watermark has
    just passed (each row once, whichever batch brought it), ordered by event
    time, ties in arrival order. ``state``: the current state of every key that has rows in the
    batch or a timer firing, one row per key (key columns, then the state
    columns); keys without state are absent. ``timers``: the timers that fire in
    this batch: key columns, ``timer_ms``, ``timer_kind``. A key with a firing
    timer but no rows still gets its state. ``watermark_ms`` (``None`` before
    the first watermark) and ``timestamp_ms`` are the batch's recorded values:
    a re-run sees the same.
    """

    rows: pl.DataFrame
    state: pl.DataFrame
    timers: pl.DataFrame
    batch_id: int
    watermark_ms: int | None
    timestamp_ms: int


@dataclass(frozen=True)
class StateOutput:
    """What ``fn`` answers; every part is optional.

    ``rows``: the rows to emit downstream. ``upserts``: new state rows (key
    columns and every state column; a key's row replaces its state).
    ``deletes``: keys whose state is removed (key columns). ``timers``: timers
    to register (key columns, ``timer_ms``, and ``timer_kind``, default
    ``"event"``); registering the same timer twice keeps one. A fired timer is
    gone; register it again to repeat. Deletes apply before upserts, so a key
    deleted and upserted in one answer holds the upserted state.

    >>> import polars as pl, microbatch as mb
    >>> out = mb.StateOutput(
    ...     upserts=pl.DataFrame({"card": [7], "n": [1]}),
    ...     timers=pl.DataFrame({"card": [7], "timer_ms": [60_000]}),
    ... )
    >>> out.timers.columns
    ['card', 'timer_ms']
    """

    rows: pl.DataFrame | None = None
    upserts: pl.DataFrame | None = None
    deletes: pl.DataFrame | None = None
    timers: pl.DataFrame | None = None


TransformFn = Callable[[StateInput], StateOutput]


@dataclass(frozen=True)
class TransformSpec:
    """A validated ``transform_with_state`` call (what the checkpoint records)."""

    keys: tuple[str, ...]
    fn: TransformFn
    state_schema: pl.Schema
    output_schema: pl.Schema | None
    ttl_ms: int | None
    ttl_time: TtlTime
    time_column: str | None
    event_time_order: bool = False

    @classmethod
    def parse(
        cls,
        keys: tuple[str, ...],
        fn: Any,
        *,
        state_schema: Mapping[str, Any] | pl.Schema,
        output_schema: Mapping[str, Any] | pl.Schema | None,
        ttl_ms: int | None,
        ttl_time: str,
        time_column: str | None,
        event_time_order: bool = False,
    ) -> TransformSpec:
        if not keys:
            raise PlanError("transform_with_state needs group_by(*keys) with at least one key")
        if not callable(fn):
            raise PlanError(
                f"transform_with_state needs a function fn(StateInput) -> StateOutput, got "
                f"{type(fn).__name__}"
            )
        schema = pl.Schema(state_schema)
        if not len(schema):
            raise PlanError("transform_with_state needs state_schema={column: dtype, ...}")
        clash = [c for c in schema if c in keys or c.startswith("__")]
        if clash:
            raise PlanError(
                f"state_schema columns {clash} clash with the keys {list(keys)} or the "
                "engine's own columns (names starting with '__'); rename them"
            )
        if ttl_time not in ("processing", "event"):
            raise PlanError(f"ttl_time must be 'processing' or 'event', got {ttl_time!r}")
        if ttl_time == "event" and ttl_ms is not None and time_column is None:
            raise PlanError(
                "ttl_time='event' expires a key's state ttl after its newest event time: "
                "pass time_column=... (and set a watermark on it)"
            )
        if event_time_order and time_column is None:
            raise PlanError(
                "event_time_order=True releases rows in the order of their event time once "
                "the watermark passes them: pass time_column=... (and set a watermark on it)"
            )
        mode: TtlTime = "event" if ttl_time == "event" else "processing"
        return cls(keys, fn, schema, None if output_schema is None else pl.Schema(output_schema),
                   ttl_ms, mode, time_column, event_time_order)

    def describe(self) -> dict[str, Any]:
        """What must not change on a checkpoint (the state schema is checked apart;
        ``fn`` is code, free to change)."""
        return {
            "kind": "transform_with_state",
            "keys": list(self.keys),
            "ttl_ms": self.ttl_ms,
            "ttl_time": self.ttl_time,
            "time_column": self.time_column,
            "event_time_order": self.event_time_order,
        }
