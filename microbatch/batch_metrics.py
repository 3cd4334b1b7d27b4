"""The progress record of one batch: every figure of DESIGN.md's Observability.

:func:`progress_record` is step 7 of the batch lifecycle (called by
:meth:`MicroBatchExecution.report`, after ``commits/N``). The record is a
plain JSON dict (``json.dumps`` works without a ``default``), kept in
``query.recent_progress``, written to ``chk/progress/N`` and logged as one
JSON line on the ``microbatch.progress`` logger. Fields:

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
  :mod:`microbatch.source_lag`); ``source_lag_records`` (total) and
  ``source_lag_seconds`` (oldest) over the sources;
- ``state``: per operator, rows, bytes, commit time, late rows, ``eviction``
  (``"watermark"`` or ``"none"``)…; ``state_rows``, ``state_bytes`` totals;
- ``late_rows``, ``dead_letter_rows``: this batch's;
- ``sink``: output rows, write time and latency; ``latency_ms``:
  ``{"column", "rows", "max_ms", "median_ms"}`` of now minus event time of
  the rows the sink took (see :mod:`microbatch.latency`), or ``None``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from microbatch.latency import LatencyProbe
from microbatch.source_lag import source_lag

if TYPE_CHECKING:
    from microbatch.execution import BatchResult, MicroBatchExecution, PlannedBatch

log = logging.getLogger("microbatch.progress")

MAX_WATERMARK_PARTITIONS = 256
"""Partitions listed per progress record under ``watermark_partitions``."""

_AFTER_COMMIT = ("version", "commit_ms", "changelog_bytes", "snapshot_written")
"""State-store figures only known once the state version is committed."""


def progress_record(
    ex: MicroBatchExecution,
    batch: PlannedBatch,
    result: BatchResult,
    *,
    now_ms: int,
    interval_ms: int | None,
) -> dict[str, Any]:
    """The progress record of ``batch`` (run by ``ex``) as of ``now_ms``.

    ``interval_ms`` is the processing-time trigger's interval (``None`` for
    ``once``/``available-now``; ``0``, back to back, is reported as ``None``).
    """
    durations = batch.durations_ms
    total_ms = sum(durations.values())
    rows = sum(result.input_rows.values())
    previous = ex.progress.recent[-1] if ex.progress.recent else None
    since_last_s = (
        (batch.timestamp_ms - previous["timestamp_ms"]) / 1000
        if previous and previous.get("run_id") == ex.run_id
        else None
    )
    sources = [
        _source_entry(ex, sid, span, result, now_ms) for sid, span in batch.ranges.items()
    ]
    state = _state(result.state, ex.executor.state_metrics())
    for op in ex.executor.operators:
        if op.operator_id in state:
            state[op.operator_id]["eviction"] = _eviction(op, bool(ex.tracker.specs))
    latency = ex.sink.latency(batch.batch_id) if isinstance(ex.sink, LatencyProbe) else None
    lags = [s["lag"] for s in sources if s.get("lag")]
    lag_records = [lag["records"] for lag in lags if lag.get("records") is not None]
    lag_seconds = [lag["seconds"] for lag in lags if lag.get("seconds") is not None]
    return {
        "query_id": ex.query_id,
        "run_id": ex.run_id,
        "name": ex.name,
        "batch_id": batch.batch_id,
        "timestamp_ms": batch.timestamp_ms,
        "reported_at_ms": now_ms,
        "recovered": batch.recovered,
        "trigger": str(ex.trigger),
        "trigger_interval_ms": interval_ms or None,
        "input_rows": rows,
        "input_rows_per_second": round(rows / since_last_s, 1) if since_last_s else None,
        "processed_rows_per_second": round(rows / (total_ms / 1000), 1) if total_ms else None,
        "output_rows": result.output_rows,
        "dead_letter_rows": result.dead_letter_rows,
        "late_rows": result.late_rows,
        "watermark_ms": batch.watermark_ms,
        "next_watermark_ms": ex.tracker.current,
        "watermark_lag_ms": (
            now_ms - batch.watermark_ms if batch.watermark_ms is not None else None
        ),
        "watermark_partitions": _watermark_partitions(ex, batch.timestamp_ms),
        "duration_ms": {**durations, "total": round(total_ms, 3)},
        "falling_behind": bool(interval_ms and total_ms > interval_ms),
        "sources": sources,
        "source_lag_records": sum(lag_records) if lag_records else None,
        "source_lag_seconds": max(lag_seconds) if lag_seconds else None,
        "state": state,
        "state_rows": sum(int(m.get("rows") or 0) for m in state.values()),
        "state_bytes": sum(int(m.get("bytes") or 0) for m in state.values()),
        "sink": {
            "description": _jsonable(ex.sink.describe()),
            "output_rows": result.output_rows,
            "write_ms": durations.get("sink"),
            "latency_ms": latency,
        },
        "latency_ms": latency,
    }


def _source_entry(
    ex: MicroBatchExecution, sid: str, span: tuple[Any, Any], result: BatchResult, now_ms: int
) -> dict[str, Any]:
    start, end = span
    source = ex.sources[sid]
    entry: dict[str, Any] = {
        "id": sid,
        "description": source.describe(),
        "start_offset": start,
        "end_offset": end,
        "input_rows": result.input_rows.get(sid, 0),
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
) -> dict[str, dict[str, Any]]:
    """Per operator: the batch's figures, plus what only the commit knows."""
    out: dict[str, dict[str, Any]] = {}
    for op_id in dict.fromkeys([*during, *after]):
        merged = dict(during.get(op_id) or {})
        committed = after.get(op_id) or {}
        merged.update({k: committed[k] for k in _AFTER_COMMIT if k in committed})
        for key in ("rows", "bytes"):
            if key not in merged and key in committed:
                merged[key] = committed[key]
        out[op_id] = _jsonable(merged)
    return out


def _eviction(op: object, has_watermark: bool) -> str:
    """``"watermark"`` when the operator drops state as the watermark passes,
    ``"none"`` when its state only grows (a plain ``group_by``, ``complete``
    mode, or no watermark at all)."""
    if not has_watermark or getattr(op, "output_mode", None) == "complete":
        return "none"
    if hasattr(op, "window") and getattr(op, "window", None) is None:
        return "none"
    return "watermark"


def _watermark_partitions(ex: MicroBatchExecution, batch_ms: int) -> list[dict[str, Any]]:
    """Per watermark node and partition: what holds the watermark where it is."""
    tracker = ex.tracker
    out: list[dict[str, Any]] = []
    for nid, spec in tracker.specs.items():
        node_wm = tracker.node_watermark(nid, batch_ms)
        for pid, seen in sorted(tracker.partitions.get(nid, {}).items()):
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
            if len(out) >= MAX_WATERMARK_PARTITIONS:
                return out
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
