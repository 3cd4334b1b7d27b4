"""What ``microbatch status`` knows about a query, read from its checkpoint.

Works on a running query (files are written atomically, the lock is probed
without disturbing the holder), a stopped one, and one whose last run
failed (``chk/last_error``). :func:`status_document` returns one
JSON-serializable dict; :func:`alarms` turns recent progress records into
the conditions an operator should look at:

- ``failed``: the last run stopped on an error;
- ``falling_behind``: batches take longer than the trigger interval;
- ``backlog_growing``: the sources' lag keeps rising;
- ``watermark_stalled``: the watermark has not moved for several batches
  with data, held back by a partition that receives no rows (no
  ``idle_timeout``);
- ``state_growing``: an operator's state only grows and nothing is evicted
  (no window/watermark eviction and no TTL, or a watermark that does not
  advance); it names the operator and the ``ttl=`` that would bound it;
- ``late_rows_rising``: more late rows in the newest batches than before;
- ``dead_letters``: malformed input records in recent batches;
- ``schema_mismatch``: input files in recent batches that did not fit the
  declared schema (a column missing or of a type that does not convert) and
  went to the dead letters whole;
- ``shard_skew``: a query on Ray workers whose newest batch loaded one shard
  far above the mean (``RayExecutor(skew_alarm=...)``), naming the hot key.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

from microbatch.checkpoint import Checkpoint, read_lock_owner
from microbatch.exceptions import CheckpointError
from microbatch.observability.progress import load_progress, read_last_error
from microbatch.observability.progress_schema import ProgressRecord, StateProgress

ALARM_WINDOW = 20
"""Progress records read to judge alarms (at least; more when asked to show more)."""
FALLING_BEHIND_WINDOW = 5
BACKLOG_WINDOW = 4
STALL_BATCHES = 3
STATE_WINDOW = 5
LATE_WINDOW = 3


def fmt_time(ms: int | None) -> str | None:
    """Epoch milliseconds as ISO-8601 UTC, ``None`` stays ``None``."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def status_document(
    checkpoint: Path, *, last: int = 10, now_ms: int | None = None
) -> dict[str, Any]:
    """Everything ``microbatch status`` shows, as one JSON-serializable dict.

    Raises :class:`CheckpointError` when ``checkpoint`` is not a checkpoint
    directory, and what reading a corrupt metadata or log file raises.
    """
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    root = checkpoint.expanduser()
    if not root.exists():
        raise CheckpointError(f"checkpoint directory {root} does not exist")
    if not root.is_dir():
        raise CheckpointError(f"{root} is not a directory; pass a checkpoint directory")
    chk = Checkpoint(root)
    if not chk.exists():
        raise CheckpointError(
            f"{chk.root} is not a microbatch checkpoint (it has no metadata file); pass the "
            "directory that was given to --checkpoint"
        )
    meta = chk.read_metadata()
    try:
        running: bool | None = chk.is_running()
    except OSError:
        running = None  # e.g. a read-only copy of a checkpoint: cannot probe the lock
    owner = read_lock_owner(chk.root / "lock") if running else None
    planned = chk.offsets.latest()
    committed = chk.commits.latest()
    uncommitted = planned is not None and (
        committed is None or committed.batch_id < planned.batch_id
    )
    # NOTE: a running query's newest batch is uncommitted while it runs: that is not a
    # batch awaiting recovery (only a stopped or crashed query leaves one)
    pending = uncommitted and not running
    records = load_progress(chk.progress_dir, limit=max(last, ALARM_WINDOW))
    shown = records[-last:]
    newest = records[-1] if records else None
    last_error = read_last_error(chk.root)
    newest_sources = newest["sources"] if newest else []
    descriptions = {s["id"]: s["description"] for s in newest_sources}
    lags = {s["id"]: s["lag"] for s in newest_sources}
    sources = [
        {"id": sid, "start_offset": r.get("start"), "end_offset": r.get("end"),
         "description": descriptions.get(sid), "lag": lags.get(sid)}
        for sid, r in (planned.to_json()["sources"].items() if planned else [])
    ]
    if committed is not None and not uncommitted:
        watermark_ms = committed.next_watermark_ms
    else:
        watermark_ms = planned.watermark_ms if planned else None
    state = "running" if running else "failed" if last_error else "stopped"
    if running is None:
        state = "unknown"
    return {
        "checkpoint": str(chk.root),
        "query_id": meta.get("query_id"),
        "created_at": meta.get("created_at"),
        "replay_of": meta.get("replay_of"),
        "state": state,
        "running": running,
        "lock_owner": owner,
        "last_error": last_error,
        "last_planned_batch": planned.batch_id if planned else None,
        "last_committed_batch": committed.batch_id if committed else None,
        "pending_recovery": pending,
        "batch_in_flight": bool(uncommitted and running),
        "trigger": newest["trigger"] if newest else None,
        "trigger_interval_ms": newest["trigger_interval_ms"] if newest else None,
        "sources": sources,
        "source_lag_records": newest["source_lag_records"] if newest else None,
        "source_lag_seconds": newest["source_lag_seconds"] if newest else None,
        "source_lag_unit": lag_unit(newest_sources),
        "watermark_ms": watermark_ms,
        "watermark": fmt_time(watermark_ms),
        "watermark_lag_ms": None if watermark_ms is None else now_ms - watermark_ms,
        "watermark_partitions": newest["watermark_partitions"] if newest else [],
        "state_operators": newest["state"] if newest else {},
        "state_rows": newest["state_rows"] if newest else None,
        "state_bytes": newest["state_bytes"] if newest else None,
        "recent_state_expired_rows": sum(r["state_expired_rows"] for r in shown),
        "latency_ms": newest["latency_ms"] if newest else None,
        "shard_skew": shard_skew(newest),
        "recent_late_rows": sum(r["late_rows"] for r in shown),
        "recent_dead_letter_rows": sum(r["dead_letter_rows"] for r in shown),
        "recent_batches": [batch_summary(r) for r in shown],
        "alarms": alarms(records, last_error=last_error, running=running),
        **averages(shown),
    }


def shard_skew(record: ProgressRecord | None) -> dict[str, Any] | None:
    """A scaled-out batch's rows per shard, their max/mean and the hot key
    (``None`` in one process)."""
    executor: dict[str, Any] = dict(record["executor"] or {}) if record else {}
    if "shard_rows" not in executor:
        return None
    return {k: executor.get(k) for k in ("skew", "shard_rows", "hot_shard", "hot_key",
                                         "combined")}


def lag_unit(sources: Sequence[Any]) -> str:
    """What a source lag counts: ``files`` when every source is a files source,
    ``records`` otherwise (Kafka, generator, memory, mixed)."""
    units = {(s.get("lag") or {}).get("unit") for s in sources}
    return "files" if units == {"files"} else "records"


def batch_summary(r: ProgressRecord) -> dict[str, Any]:
    """The columns of the recent-batches table for one progress record."""
    return {
        "batch_id": r["batch_id"],
        "time": fmt_time(r["timestamp_ms"]),
        "input_rows": r["input_rows"],
        "output_rows": r["output_rows"],
        "input_rows_per_second": r["input_rows_per_second"],
        "processed_rows_per_second": r["processed_rows_per_second"],
        "duration_ms": r["duration_ms"].get("total"),
        "recovered": r["recovered"],
        "late_rows": r["late_rows"],
        "dead_letter_rows": r["dead_letter_rows"],
        "source_lag_records": r["source_lag_records"],
        "watermark_lag_ms": r["watermark_lag_ms"],
        "state_rows": r["state_rows"],
        "falling_behind": r["falling_behind"],
    }


def averages(records: Sequence[ProgressRecord]) -> dict[str, float | None]:
    """Input rate over the wall-clock span of ``records``; processing rate over their time."""
    busy_s = sum(r["duration_ms"].get("total", 0) for r in records) / 1000
    rows = sum(r["input_rows"] for r in records)
    span_s = (records[-1]["timestamp_ms"] - records[0]["timestamp_ms"]) / 1000 if records else 0
    arrived = rows - records[0]["input_rows"] if records else 0
    return {
        "avg_input_rows_per_second": round(arrived / span_s, 1) if span_s > 0 else None,
        "avg_processed_rows_per_second": round(rows / busy_s, 1) if busy_s > 0 else None,
    }


# ------------------------------------------------------------------ alarms


def _alarm(code: str, severity: str, message: str) -> dict[str, str]:
    return {"code": code, "severity": severity, "message": message}


def alarms(records: Sequence[ProgressRecord],
    *,
    last_error: dict[str, Any] | None = None,
    running: bool | None = None,
) -> list[dict[str, str]]:
    """The alarms that ``records`` (oldest first) and the last error raise."""
    found: list[dict[str, str]] = []
    if last_error and not running:
        found.append(_alarm(
            "failed", "error",
            f"the last run failed in batch {last_error.get('batch_id')} at "
            f"{last_error.get('failed_at')}: {last_error.get('type')}: "
            f"{last_error.get('message')}. The batch was not committed; the next start "
            "runs it again.",
        ))
    run = [r for r in records if r["run_id"] == records[-1]["run_id"]] if records else []
    for check in (_falling_behind, _backlog_growing, _watermark_stalled, _late_rows_rising,
                  _dead_letters, _schema_mismatch, _shard_skew):
        alarm = check(run)
        if alarm:
            found.append(alarm)
    found.extend(_state_growing(run))
    return found


def _falling_behind(run: Sequence[ProgressRecord]) -> dict[str, str] | None:
    window = [r for r in run if r["trigger_interval_ms"]][-FALLING_BEHIND_WINDOW:]
    late = [r for r in window if r["falling_behind"]]
    if len(window) < 2 or len(late) * 2 <= len(window):
        return None
    avg = sum(r["duration_ms"].get("total", 0) for r in window) / len(window)
    interval_ms = window[-1]["trigger_interval_ms"] or 0
    return _alarm(
        "falling_behind", "warning",
        f"falling behind: {len(late)} of the last {len(window)} batches took longer than "
        f"the {interval_ms / 1000:g} s trigger interval (average "
        f"{avg:.0f} ms). Cap batches (max_records_per_batch), lengthen the trigger, or "
        "speed up the job.",
    )


def _backlog_growing(run: Sequence[ProgressRecord]) -> dict[str, str] | None:
    found = [r["source_lag_records"] for r in run][-BACKLOG_WINDOW:]
    lags = [v for v in found if v is not None]
    if len(lags) < BACKLOG_WINDOW:  # too few batches, or one without a known lag
        return None
    if not all(b > a for a, b in pairwise(lags)):
        return None
    return _alarm(
        "backlog_growing", "warning",
        f"backlog growing: the sources' lag rose from {lags[0]:,} to {lags[-1]:,} records "
        f"over the last {len(lags)} batches; the query reads less than arrives.",
    )


def _watermark_stalled(run: Sequence[ProgressRecord]) -> dict[str, str] | None:
    window = list(run[-STALL_BATCHES:])
    if len(window) < STALL_BATCHES or not all(r["input_rows"] for r in window):
        return None
    marks = {r["next_watermark_ms"] for r in window}
    if len(marks) != 1:
        return None
    since = window[0]["timestamp_ms"]
    stuck = [
        p for p in window[-1]["watermark_partitions"]
        if p["holding"] and p.get("last_rows_at_ms", since) < since
    ]
    if not stuck:
        return None
    p = stuck[0]
    mark = marks.pop()
    return _alarm(
        "watermark_stalled", "warning",
        f"watermark stalled at {fmt_time(mark) or 'none'} for {len(window)} batches with "
        f"data: partition {p['partition']} of {p['column']!r} has had no rows for "
        f"{p['idle_ms'] / 1000:.1f} s and holds it back. Set "
        f"with_watermark({p['column']!r}, ..., idle_timeout=...) so that an idle partition "
        "stops holding the watermark.",
    )


def _shard_skew(run: Sequence[ProgressRecord]) -> dict[str, str] | None:
    executor: dict[str, Any] = dict(run[-1]["executor"] or {}) if run else {}
    message = executor.get("skew_alarm")
    if not message:
        return None
    return _alarm("shard_skew", "warning", f"batch {run[-1]['batch_id']}: {message}.")


def _state_growing(run: Sequence[ProgressRecord]) -> list[dict[str, str]]:
    window = list(run[-STATE_WINDOW:])
    if len(window) < STATE_WINDOW:
        return []
    found = []
    watermark_moved = len({r["next_watermark_ms"] for r in window}) > 1
    for op_id, newest in window[-1]["state"].items():
        figures: list[StateProgress] = [r["state"].get(op_id) or {} for r in window]
        known = [f.get("rows") for f in figures]
        rows = [v for v in known if v is not None]
        if len(rows) < len(known) or rows[-1] <= rows[0]:
            continue
        if not all(b >= a for a, b in pairwise(rows)):
            continue
        if sum(f.get("deleted") or 0 for f in figures):
            continue
        if newest.get("eviction") != "none" and watermark_moved:
            continue  # e.g. windows still open early in a query's life
        why = (
            "it has no eviction (a group_by without a window, complete mode, or no watermark)"
            if newest.get("eviction") == "none"
            else "the watermark did not advance"
            if newest.get("eviction") == "watermark"
            else "no key has been idle for its ttl yet"
        )
        found.append(_alarm(
            "state_growing", "warning",
            f"state of {op_id} grew from {rows[0]:,} to {rows[-1]:,} rows over "
            f"{len(window)} batches and nothing was evicted: {why}. State without TTL or "
            f"eviction grows with every new key{_ttl_advice(op_id, newest.get('eviction'))}",
        ))
    return found


def _ttl_advice(op_id: str, eviction: str | None) -> str:
    """How to bound the state of operator ``op_id`` (its id names its kind)."""
    if eviction != "none":
        return "."
    kind = op_id.rsplit("-", 1)[0]
    how = {
        "agg": "group_by(..., ttl=\"1d\") to forget keys idle that long (or a window with "
               "a watermark)",
        "dedupe": "drop_duplicates(..., ttl=\"1d\") (or within= with a watermark)",
        "transform": "transform_with_state(..., ttl=\"1d\"), or delete state in fn",
    }.get(kind)
    return f": set {how}." if how else "."


def _late_rows_rising(run: Sequence[ProgressRecord]) -> dict[str, str] | None:
    window = list(run[-2 * LATE_WINDOW:])
    if len(window) < 2 * LATE_WINDOW:
        return None
    before = sum(r["late_rows"] for r in window[:LATE_WINDOW])
    after = sum(r["late_rows"] for r in window[LATE_WINDOW:])
    if after <= 2 * before or after < LATE_WINDOW:
        return None
    rows = sum(r["input_rows"] for r in window[LATE_WINDOW:])
    share = f" ({after / rows:.1%} of their input)" if rows else ""
    return _alarm(
        "late_rows_rising", "warning",
        f"late rows rising: {after:,} in the last {LATE_WINDOW} batches{share} against "
        f"{before:,} in the {LATE_WINDOW} before. The data is more out of order than the "
        "watermark delay allows, or a source is replaying old data.",
    )


def _dead_letters(run: Sequence[ProgressRecord]) -> dict[str, str] | None:
    window = list(run[-ALARM_WINDOW:])
    bad = sum(r["dead_letter_rows"] for r in window)
    if not bad:
        return None
    return _alarm(
        "dead_letters", "warning",
        f"{bad:,} malformed input records in the last {len(window)} batches went to the "
        "dead-letter output (chk/dead_letter unless the job sets one).",
    )


def _schema_mismatch(run: Sequence[ProgressRecord]) -> dict[str, str] | None:
    window = list(run[-ALARM_WINDOW:])
    files = sum(r.get("schema_mismatch", 0) for r in window)
    if not files:
        return None
    return _alarm(
        "schema_mismatch", "warning",
        f"schema mismatch: {files:,} input file{'s' if files != 1 else ''} in the last "
        f"{len(window)} batches did not fit the schema (a column missing, or of a type that "
        "does not convert) and went whole to the dead-letter output, reason 'schema "
        "mismatch: ...'. The files are left in place: fix them and drop them in again under "
        "a new name, or declare read_files(..., on_missing_columns=\"null\") to read missing "
        "columns as null.",
    )
