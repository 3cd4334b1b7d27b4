"""The progress record of one batch: every figure of docs/design.md's Observability.

:func:`progress_record` is step 7 of the batch lifecycle: after ``commits/N``
the engine pushes a :class:`BatchFacts` (it never hands over itself, so this
module cannot depend on the engine). The record is a
:class:`~microbatch.observability.progress_schema.ProgressRecord`: a plain
JSON dict (``json.dumps`` works without a ``default``) whose schema is typed
and versioned in :mod:`microbatch.observability.progress_schema`, kept in
``query.recent_progress``, written to ``chk/progress/N`` and logged as one
JSON line on the ``microbatch.observability.progress`` logger. Fields:

- ``progress_version``: the schema version of the record (see
  :data:`~microbatch.observability.progress_schema.PROGRESS_VERSION`);
- ``batch_id``, ``timestamp_ms``: the batch and its recorded processing time;
- ``input_rows``; ``input_rows_per_second`` (rows / time since the previous
  batch of this run); ``processed_rows_per_second`` (rows / this batch's
  duration);
- ``duration_ms``: per lifecycle step, and ``total``;
- ``trigger_interval_ms`` (``None`` unless a processing-time interval) and
  ``falling_behind`` (the batch took longer than the interval);
- ``watermark_ms`` (in force for the batch), ``next_watermark_ms`` (after
  it), ``watermark_lag_ms`` (wall clock minus ``watermark_ms``);
- ``watermark_partitions``: per watermark node and partition, the newest
  event time, how long it has had no rows, idle, and whether it holds the
  watermark;
- ``sources[i].lag``: not yet read, per partition: records (files for a
  files source) and the age of the oldest in seconds (see
  :mod:`microbatch.observability.source_lag`); ``source_lag_records`` (total) and
  ``source_lag_seconds`` (oldest) over the sources;
- ``state``: per operator, rows, bytes, commit time, late rows, ``eviction``
  (``"watermark"``, ``"ttl"`` or ``"none"``), ``expired_rows`` (removed by TTL
  in this batch)…; ``state_rows``, ``state_bytes``, ``state_expired_rows`` totals;
- ``late_rows``, ``dead_letter_rows``: this batch's; ``schema_mismatch``: of
  those dead letters, the input files that did not fit the declared schema
  (a column missing, or of a type that does not convert);
- ``sink``: output rows, write time and latency; ``latency_ms``:
  ``{"column", "rows", "max_ms", "median_ms"}`` of now minus event time of
  the rows the sink took (see :mod:`microbatch.observability.latency`), or ``None``;
- ``executor``: ``None`` in one process; for a query on Ray workers
  (:mod:`microbatch.distributed`): ``workers``, ``shards``, ``nodes``,
  ``restarts``, the driver's wall time of the batch's one exchange
  (``exchange_ms``) and its ``barrier_ms`` (that minus the busiest worker's
  busy time), each worker's and shard's busy time, the rows and bytes
  exchanged between workers (``combined``: pre-aggregated on the map side),
  rows per shard (``shard_rows``, ``routed_rows``), their ``skew`` (max/mean),
  the ``hot_key`` and the ``skew_alarm`` (docs/scale-out.md).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, cast

from microbatch.observability.progress_schema import (
    PROGRESS_VERSION,
    ExecutorProgress,
    Latency,
    ProgressRecord,
    SourceProgress,
    StateProgress,
    StepDurations,
    WatermarkPartition,
)
from microbatch.observability.source_lag import source_lag
from microbatch.sources.base import Source
from microbatch.types import Offset

__all__ = ["BatchFacts", "progress_record"]

log = logging.getLogger("microbatch.progress")

_AFTER_COMMIT = ("version", "commit_ms", "changelog_bytes", "snapshot_written")
"""State-store figures only known once the state version is committed."""


@dataclass(frozen=True)
class BatchFacts:
    """What the engine knows about a batch once it is committed: pushed by
    step 7 of the lifecycle, the only input of :func:`progress_record`."""

    query_id: str
    run_id: str
    name: str | None
    trigger: str
    interval_ms: int | None
    """The processing-time trigger's interval; ``None`` for once/available-now,
    ``0`` (back to back) is reported as ``None``."""
    batch_id: int
    timestamp_ms: int
    recovered: bool
    watermark_ms: int | None
    next_watermark_ms: int | None
    durations_ms: Mapping[str, float]
    ranges: Mapping[str, tuple[Offset, Offset]]
    sources: Mapping[str, Source]
    input_rows: Mapping[str, int]
    output_rows: int
    dead_letter_rows: int
    late_rows: int
    state: Mapping[str, Mapping[str, Any]]
    """Per operator: the batch's figures (late rows, keys updated...)."""
    state_committed: Mapping[str, Mapping[str, Any]]
    """Per operator: the store's figures after the commit (rows, bytes, version...)."""
    eviction: Mapping[str, str]
    """Per operator: ``"watermark"``, ``"ttl"`` or ``"none"`` (its state only grows)."""
    watermark_partitions: Sequence[Mapping[str, Any]]
    sink_description: Mapping[str, Any]
    sink_metrics: Mapping[str, Any]
    """The sink's own figures of the batch (a webhook's posts, retries...)."""
    latency: Mapping[str, Any] | None
    previous: ProgressRecord | None
    """The progress record of the batch before (``None`` for the first one)."""
    schema_mismatch: int = 0
    """Dead letters for whole input files that do not fit the declared schema."""
    executor: Mapping[str, Any] | None = None
    """Where the plan ran, when not in this process: a scaled-out batch's
    workers, shards, phase times and busy time per worker and shard."""


def progress_record(facts: BatchFacts, *, now_ms: int) -> ProgressRecord:
    """The progress record of a batch as of ``now_ms`` (the fields are listed in
    the module docstring)."""
    f = facts
    total_ms = sum(f.durations_ms.values())
    rows = sum(f.input_rows.values())
    previous = f.previous
    since_last_s = (
        (f.timestamp_ms - previous["timestamp_ms"]) / 1000
        if previous and previous.get("run_id") == f.run_id
        else None
    )
    sources = [_source_entry(f, sid, span, now_ms) for sid, span in f.ranges.items()]
    state = _state(f.state, f.state_committed)
    for op_id, kind in f.eviction.items():
        if op_id in state:
            state[op_id]["eviction"] = kind
    latency = cast(Latency, _jsonable(f.latency)) if f.latency is not None else None
    lags = [s["lag"] for s in sources if s["lag"]]
    lag_records = [lag["records"] for lag in lags if lag["records"] is not None]
    lag_seconds = [lag["seconds"] for lag in lags if lag["seconds"] is not None]
    interval_ms = f.interval_ms
    durations = cast(StepDurations, {**f.durations_ms, "total": round(total_ms, 3)})
    partitions = cast(list[WatermarkPartition], [dict(p) for p in f.watermark_partitions])
    executor = cast(ExecutorProgress, _jsonable(f.executor)) if f.executor is not None else None
    return {
        "progress_version": PROGRESS_VERSION,
        "query_id": f.query_id,
        "run_id": f.run_id,
        "name": f.name,
        "batch_id": f.batch_id,
        "timestamp_ms": f.timestamp_ms,
        "reported_at_ms": now_ms,
        "recovered": f.recovered,
        "trigger": f.trigger,
        "trigger_interval_ms": interval_ms or None,
        "input_rows": rows,
        "input_rows_per_second": round(rows / since_last_s, 1) if since_last_s else None,
        "processed_rows_per_second": round(rows / (total_ms / 1000), 1) if total_ms else None,
        "output_rows": f.output_rows,
        "dead_letter_rows": f.dead_letter_rows,
        "schema_mismatch": f.schema_mismatch,
        "late_rows": f.late_rows,
        "watermark_ms": f.watermark_ms,
        "next_watermark_ms": f.next_watermark_ms,
        "watermark_lag_ms": (
            now_ms - f.watermark_ms if f.watermark_ms is not None else None
        ),
        "watermark_partitions": partitions,
        "duration_ms": durations,
        "falling_behind": bool(interval_ms and total_ms > interval_ms),
        "sources": sources,
        "source_lag_records": sum(lag_records) if lag_records else None,
        "source_lag_seconds": max(lag_seconds) if lag_seconds else None,
        "state": state,
        "state_rows": sum(m.get("rows") or 0 for m in state.values()),
        "state_bytes": sum(m.get("bytes") or 0 for m in state.values()),
        "state_expired_rows": sum(m.get("expired_rows") or 0 for m in state.values()),
        "sink": {
            "description": _jsonable(f.sink_description),
            "output_rows": f.output_rows,
            "write_ms": f.durations_ms.get("sink"),
            "latency_ms": latency,
            "metrics": _jsonable(f.sink_metrics),
        },
        "latency_ms": latency,
        "executor": executor,
    }


def _source_entry(
    facts: BatchFacts, sid: str, span: tuple[Any, Any], now_ms: int
) -> SourceProgress:
    start, end = span
    source = facts.sources[sid]
    entry: SourceProgress = {
        "id": sid,
        "description": source.describe(),
        "start_offset": start,
        "end_offset": end,
        "input_rows": facts.input_rows.get(sid, 0),
        "lag": source_lag(source, end, now_ms),
    }
    try:
        extra = source.metrics()
    except Exception as exc:  # informational only: never fail a committed batch
        log.warning("could not read the metrics of source %s: %s", sid, exc)
        extra = {}
    if extra:
        entry["metrics"] = _jsonable(extra)
    return entry


def _state(
    during: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]
) -> dict[str, StateProgress]:
    """Per operator: the batch's figures, plus what only the commit knows (an
    operator's own figures beyond :class:`StateProgress`'s are kept too)."""
    out: dict[str, StateProgress] = {}
    for op_id in dict.fromkeys([*during, *after]):
        merged = dict(during.get(op_id) or {})
        committed = after.get(op_id) or {}
        merged.update({k: committed[k] for k in _AFTER_COMMIT if k in committed})
        for key in ("rows", "bytes"):
            if key not in merged and key in committed:
                merged[key] = committed[key]
        out[op_id] = cast(StateProgress, _jsonable(merged))
    return out


def _jsonable(value: Any) -> Any:
    """``value`` with numpy scalars and paths turned into JSON values."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, PurePath):
        return str(value)
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        return value.item()
    return value
