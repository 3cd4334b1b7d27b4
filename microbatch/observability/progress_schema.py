"""The schema of the progress record: one typed record per batch, versioned.

A progress record is a plain JSON object (``json.dumps`` needs no
``default``): the same dict is kept in ``query.recent_progress``, written to
``chk/progress/N`` and logged as one JSON line. Its shape is given here once,
as a family of :class:`~typing.TypedDict` classes, so that every reader is
type-checked against it (``record["batch_id"]`` keeps working for users, and a
misspelt key is a mypy error inside the project):

- :class:`ProgressRecord`: the batch (ids, times, rows, rates, watermarks,
  totals) and its parts:
- :class:`StepDurations` (``duration_ms``), :class:`WatermarkPartition`
  (``watermark_partitions``), :class:`SourceProgress` and :class:`SourceLag`
  (``sources``), :class:`StateProgress` (``state``), :class:`SinkProgress` and
  :class:`Latency` (``sink``, ``latency_ms``), :class:`ExecutorProgress`
  (``executor``).

Versioning: every record carries ``progress_version`` (:data:`PROGRESS_VERSION`).
The version changes only when a field is removed or changes meaning; adding a
field does not change it (readers use ``.get`` for fields a record may lack,
and :func:`read_progress` fills the fields added since version 1, listed in
``_ADDED``, with the value that is true of a record written before them:
``schema_mismatch`` is 0, as no engine that lacked it refused a file for it).
:func:`read_progress` reads a stored record: one written before the field
existed is version 0 (the same fields: it is upgraded in place, a field it
lacks reads as ``None``/0/empty); one of a newer version raises
:class:`ProgressVersionError` (its fields may mean something else, so reading
it as this version would mislead alarms), which
:func:`~microbatch.observability.progress.load_progress` turns into a warning
and a skipped record, since progress is informational.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict, cast

from microbatch.exceptions import CheckpointCorruptError, CheckpointFormatError
from microbatch.sources.base import PartitionLag

__all__ = [
    "PROGRESS_VERSION",
    "ExecutorProgress",
    "Latency",
    "ProgressRecord",
    "ProgressVersionError",
    "SinkProgress",
    "SourceLag",
    "SourceProgress",
    "StateProgress",
    "StepDurations",
    "WatermarkPartition",
    "read_progress",
    "step_durations",
]

PROGRESS_VERSION = 1
"""The version of the progress record this engine writes and reads."""


class StepDurations(TypedDict, total=False):
    """``duration_ms``: milliseconds per lifecycle step of the batch, and ``total``
    (their sum). A step that did not run (``write_ahead`` of a recovered batch)
    is absent."""

    plan: float
    write_ahead: float
    read: float
    execute: float
    sink: float
    commit: float
    total: float


class WatermarkPartition(TypedDict):
    """One entry of ``watermark_partitions``: what a partition of a watermark node
    has seen and whether it holds the watermark back."""

    node: str
    column: str
    partition: str
    max_event_time_ms: int
    last_rows_at_ms: int
    idle_ms: int
    idle: bool
    holding: bool


class SourceLag(TypedDict):
    """``sources[i].lag``: not yet read, in total and per partition (see
    :mod:`microbatch.observability.source_lag`)."""

    unit: str
    """``"records"``, or ``"files"`` for a files source."""
    records: int | None
    seconds: float | None
    """The age of the oldest unread record; ``None`` when the source cannot tell."""
    partitions: dict[str, PartitionLag]
    partitions_not_listed: NotRequired[int]
    """Partitions beyond the listed ones (the totals still cover them)."""


class SourceProgress(TypedDict):
    """One entry of ``sources``: what the batch read from one source."""

    id: str
    description: dict[str, Any]
    start_offset: Any
    end_offset: Any
    input_rows: int
    lag: SourceLag | None
    metrics: NotRequired[dict[str, Any]]
    """The source's own figures (``Source.metrics()``), when it has any."""


class StateProgress(TypedDict, total=False):
    """``state[operator_id]``: one stateful operator's figures. The keys below are
    the ones every view reads; an operator may add figures of its own (a join's
    ``left_rows``, a dedupe's ``expired_rows``...), kept as they are."""

    rows: int
    bytes: int
    bytes_per_row: float
    version: int
    """The state version committed by the batch."""
    commit_ms: float
    changelog_bytes: int
    snapshot_written: bool
    upserted: int
    deleted: int
    late_rows: int
    expired_rows: int
    """Rows removed by TTL in this batch."""
    eviction: str
    """``"watermark"``, ``"ttl"`` or ``"none"`` (its state only grows)."""


class Latency(TypedDict):
    """``latency_ms``: now minus the event time of the rows the sink took."""

    column: str
    rows: int
    max_ms: float
    median_ms: float


class SinkProgress(TypedDict):
    """``sink``: what the sink took and how long it took."""

    description: dict[str, Any]
    output_rows: int
    write_ms: float | None
    latency_ms: Latency | None
    metrics: dict[str, Any]
    """The sink's own figures (a webhook's posts, retries...)."""


class ExecutorProgress(TypedDict, total=False):
    """``executor``: where a scaled-out batch ran (``None`` in one process)."""

    kind: str
    workers: int
    shards: int
    shard_mode: str
    nodes: int
    restarts: int
    map_ms: float
    reduce_ms: float
    commit_ms: float
    """``map_ms``/``reduce_ms``/``commit_ms``: the three round trips of records
    written before one exchange per batch (``exchange_ms`` since)."""
    exchange_ms: float
    """The driver's wall time of the batch's one exchange (map, reduce, state commit)."""
    barrier_ms: float
    """``exchange_ms`` minus the busiest worker's busy time: dispatch, transfer, waiting."""
    map_busy_ms: list[float]
    """Each worker's busy time in the map phase."""
    reduce_busy_ms: list[float]
    """Each worker's busy time in the reduce phase (its shards')."""
    shard_busy_ms: list[float]
    """Each shard's busy time in the reduce phase."""
    commit_busy_ms: list[float]
    """Each worker's time committing its shards' state (inside the reduce)."""
    exchanged_rows: int
    exchanged_bytes: int
    combined: bool
    """Whether the map side pre-aggregated (``RayExecutor(combine=...)``; false
    for a batch that had to run again with rows)."""
    shard_rows: list[int]
    """Rows that entered each shard's operators (partial rows where pre-aggregated)."""
    routed_rows: list[int]
    """Rows routed to each shard before pre-aggregation."""
    skew: float | None
    """Max over mean of ``shard_rows``."""
    hot_shard: int
    hot_key: dict[str, Any] | None
    """The hottest shard's most frequent shard key (from a sample of its rows), or
    ``None`` below ``RayExecutor(skew_min_rows=...)``."""
    skew_alarm: str | None
    """Set when ``skew`` exceeded ``RayExecutor(skew_alarm=...)``: what and why."""


class ProgressRecord(TypedDict):
    """The progress record of one batch (the fields are described in
    docs/observability.md and :mod:`microbatch.observability.record`)."""

    progress_version: int
    query_id: str
    run_id: str
    name: str | None
    batch_id: int
    timestamp_ms: int
    reported_at_ms: int
    recovered: bool
    trigger: str
    trigger_interval_ms: int | None
    input_rows: int
    input_rows_per_second: float | None
    processed_rows_per_second: float | None
    output_rows: int
    dead_letter_rows: int
    schema_mismatch: int
    """Of the dead letters, input files that did not fit the declared schema
    (added in version 1 without a version change: a stored record without it
    reads as 0)."""
    late_rows: int
    watermark_ms: int | None
    next_watermark_ms: int | None
    watermark_lag_ms: int | None
    watermark_partitions: list[WatermarkPartition]
    duration_ms: StepDurations
    falling_behind: bool
    sources: list[SourceProgress]
    source_lag_records: int | None
    source_lag_seconds: float | None
    state: dict[str, StateProgress]
    state_rows: int
    state_bytes: int
    state_expired_rows: int
    sink: SinkProgress
    latency_ms: Latency | None
    executor: ExecutorProgress | None


class ProgressVersionError(CheckpointFormatError):
    """A stored progress record has a newer ``progress_version`` than this engine reads."""


_DEFAULTS: dict[str, Any] = {
    "name": None,
    "reported_at_ms": None,
    "recovered": False,
    "trigger": None,
    "trigger_interval_ms": None,
    "input_rows": 0,
    "input_rows_per_second": None,
    "processed_rows_per_second": None,
    "output_rows": 0,
    "dead_letter_rows": 0,
    "schema_mismatch": 0,
    "late_rows": 0,
    "watermark_ms": None,
    "next_watermark_ms": None,
    "watermark_lag_ms": None,
    "falling_behind": False,
    "source_lag_records": None,
    "source_lag_seconds": None,
    "state_rows": 0,
    "state_bytes": 0,
    "state_expired_rows": 0,
    "latency_ms": None,
    "executor": None,
}
"""What a version-0 record that lacks a field reads as (older engines wrote fewer)."""

_EMPTY: dict[str, type] = {
    "watermark_partitions": list,
    "duration_ms": dict,
    "sources": list,
    "state": dict,
}
"""Fields that read as an empty container when a version-0 record lacks them."""

_ADDED: dict[str, Any] = {"schema_mismatch": 0}
"""Fields added to version 1 after it was first written (adding a field keeps the
version), and what a stored record without one reads as."""


def read_progress(doc: Any, *, where: str) -> ProgressRecord:
    """``doc`` (a stored record's JSON body) as a :class:`ProgressRecord`.

    A record without ``progress_version`` (written before records carried it) is
    version 0 and read compatibly: the fields it has are the same, those it
    lacks read as ``None``, 0 or empty. Raises :class:`ProgressVersionError`
    for a newer version and :class:`CheckpointCorruptError` for a body that is
    not a record (``where`` names the file in the message).
    """
    if not isinstance(doc, dict):
        raise CheckpointCorruptError(f"{where} is not a progress record (a JSON object)")
    version = doc.get("progress_version", 0)
    if isinstance(version, bool) or not isinstance(version, int):
        raise CheckpointCorruptError(
            f"{where}: 'progress_version' is {version!r}, not an integer; the file was edited"
        )
    if version > PROGRESS_VERSION:
        raise ProgressVersionError(
            f"{where} is a progress record of version {version}, newer than the version "
            f"{PROGRESS_VERSION} this version of microbatch reads; upgrade microbatch to read it"
        )
    batch_id = doc.get("batch_id")
    if isinstance(batch_id, bool) or not isinstance(batch_id, int):
        raise CheckpointCorruptError(f"{where}: a progress record without an integer 'batch_id'")
    if version == 0:
        sink: dict[str, Any] = {"description": {}, "output_rows": doc.get("output_rows") or 0,
                "write_ms": None, "latency_ms": doc.get("latency_ms"), "metrics": {}}
        doc = {**_DEFAULTS, **{k: t() for k, t in _EMPTY.items()}, "sink": sink, **doc,
               "progress_version": 0}
    if any(name not in doc for name in _ADDED):
        doc = {**_ADDED, **doc}
    return cast(ProgressRecord, doc)


def step_durations(record: ProgressRecord) -> dict[str, float]:
    """The record's ``duration_ms`` as step name -> milliseconds (``total`` included)."""
    durations: Mapping[str, object] = record["duration_ms"]
    return {step: float(ms) for step, ms in durations.items() if isinstance(ms, int | float)}
