"""The protocol of stateful operators and what the engine gives them per batch."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from microbatch.checkpoint.files import make_dirs, read_json, write_json_atomic
from microbatch.exceptions import CheckpointError, IncompatibleCheckpointError, PlanError
from microbatch.plan.aggregates import AggSpec
from microbatch.plan.event_time import event_time_ms

if TYPE_CHECKING:
    from statestore import StateStore

LATE_REASON = "late_reason"
TIME = "__t"
"""Transient column: a row's event time in epoch milliseconds."""


def split_late_by_time(
    df: pl.DataFrame, time_column: str, watermark_ms: int | None, *, label: str = "event"
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Rows that are not late (with ``__t``), and the late rows (with ``late_reason``).

    The timestamp rule shared by sessions, dedupe and joins: a row is late when
    its time is null or at or before the watermark in force.
    """
    rows = df.with_columns(event_time_ms(time_column, df.schema).alias(TIME))
    late_expr = pl.col(TIME).is_null()
    closed = None
    if watermark_ms is not None:
        late_expr = late_expr | (pl.col(TIME) <= watermark_ms)
        closed = pl.format(
            "{} time {} is at or before watermark {}",
            pl.lit(label),
            iso_ms(pl.col(TIME)),
            iso_ms(pl.lit(watermark_ms)),
        )
    reason = late_reason(f"{label} time {time_column!r} is null", closed)
    marked = rows.with_columns(late_expr.alias("__late"))
    late = marked.filter("__late").with_columns(reason.alias(LATE_REASON)).drop(TIME, "__late")
    return marked.filter(~pl.col("__late")).drop("__late"), late


def iso_ms(epoch_ms: pl.Expr) -> pl.Expr:
    """Epoch milliseconds as ISO-8601 UTC text (``2026-01-01T00:01:00.000Z``), for
    messages people read."""
    return pl.from_epoch(epoch_ms, time_unit="ms").dt.to_string("%Y-%m-%dT%H:%M:%S%.3fZ")


def late_reason(null_reason: str, closed_reason: pl.Expr | None) -> pl.Expr:
    """The late output's ``late_reason``: ``null_reason`` for a null event time
    (``__t``), else ``closed_reason`` (``None``: no watermark yet, so only nulls
    are late)."""
    then = pl.when(pl.col(TIME).is_null()).then(pl.lit(null_reason))
    return then if closed_reason is None else then.otherwise(closed_reason)


@dataclass
class OperatorContext:
    """The per-batch facts a stateful operator may use (all recorded in offsets/N)."""

    batch_id: int
    watermark_ms: int | None
    timestamp_ms: int
    late_rows: list[pl.DataFrame] = field(default_factory=list)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)


class StatefulOperator(ABC):
    """Keeps keyed state across batches in a :mod:`statestore` store.

    Batch N loads state version N, stages changes, and the engine calls
    ``commit()`` (version N+1) after the sink accepted the batch, or
    ``abort()`` when the batch failed. (Stream-stream joins count each input's
    versions from its first batch: the version rule is in
    :mod:`statestore.contract`.)
    """

    operator_id: str = "op"
    state_backend: str = "memory"
    """Where keyed stores keep their rows (set by the executor before ``open``:
    :mod:`microbatch.engine.state_backend`)."""

    @abstractmethod
    def signature(self) -> dict[str, Any]:
        """What the state means (kind, keys, window, aggregations): a restart
        with a different signature on the same checkpoint is refused."""

    @abstractmethod
    def process(self, df: pl.DataFrame, ctx: OperatorContext) -> pl.DataFrame:
        """Rows to emit for this batch; late input rows go to ``ctx.late_rows``."""

    @abstractmethod
    def open(self, state_dir: Path | None, batch_id: int) -> None:
        """Bind to the checkpoint's state directory before batch ``batch_id``."""

    @abstractmethod
    def commit(self) -> None:
        """Make the staged state the next version, durably."""

    @abstractmethod
    def abort(self) -> None:
        """Forget staged changes."""

    def has_expirable_state(self, watermark_ms: int | None) -> bool:
        """True when a batch at ``watermark_ms`` would emit or evict something."""
        return False

    def due(self, now_ms: int, watermark_ms: int | None) -> bool:
        """True when a batch at processing time ``now_ms`` and watermark
        ``watermark_ms`` would fire a timer (one registered at or before the
        watermark already passed, or a processing-time one) or expire state by TTL:
        the engine then runs a no-data batch even though nothing arrived and the
        watermark did not move."""
        return False

    def eviction(self, *, has_watermark: bool) -> str:
        """``"watermark"`` when the state shrinks as the watermark passes, ``"none"``
        when it only grows (what ``microbatch status`` warns about)."""
        return "watermark" if has_watermark else "none"

    def metrics(self) -> dict[str, Any]:
        """State metrics of the last batch (rows, bytes, commit time...)."""
        return {}

    def close(self) -> None:
        """Release what the state holds open (an on-disk backend's databases); a
        later ``open`` opens them again. Staged changes are discarded."""
        providers = [getattr(self, "provider", None)]
        store_set = getattr(self, "state", None)
        providers += list(getattr(store_set, "providers", {}).values())
        for provider in providers:
            close = getattr(provider, "close", None)
            if close is not None:
                close()


class SingleStoreOperator(StatefulOperator):
    """A stateful operator whose whole state is one store, ``self.store``
    (loaded per batch by the subclass)."""

    store: StateStore | None = None

    def commit(self) -> None:
        if self.store is not None:
            self.store.commit()

    def abort(self) -> None:
        if self.store is not None:
            self.store.abort()
            self.store = None

    def metrics(self) -> dict[str, Any]:
        return dict(self.store.metrics) if self.store is not None else {}


def check_signature(state_dir: Path, signature: dict[str, Any]) -> None:
    """Record the operator's signature once; refuse a different one later."""
    make_dirs(state_dir)
    path = state_dir / "operator.json"
    if not path.exists():
        write_json_atomic(path, "operator", signature)
        return
    recorded = read_json(path, "operator")
    if recorded != signature:
        changed = sorted(
            k for k in set(recorded) | set(signature) if recorded.get(k) != signature.get(k)
        )
        raise IncompatibleCheckpointError(
            f"the state in {state_dir} was written by a different operator: {changed} "
            f"changed (was {json.dumps({k: recorded.get(k) for k in changed})}, now "
            f"{json.dumps({k: signature.get(k) for k in changed})}). Reusing it would give "
            "wrong results: start the changed job on a new checkpoint directory."
        )


def check_input_types(
    state_dir: Path | None,
    batch_id: int,
    *,
    recorded: dict[str, pl.DataType],
    schema: pl.Schema,
    keys: list[str],
    aggs: list[AggSpec],
) -> None:
    """Refuse a batch (input ``schema``) whose keys or aggregated columns
    changed type since the state (``recorded``) was created.

    NOTE: the state store casts what it is given to its schema, so without
    this check a Float64 column arriving where state holds Int64 sums would
    be truncated silently (schema drift of Parquet files read without a
    declared schema).
    """
    missing = [c for c in [*keys, *(a.column for a in aggs if a.column)] if c not in schema]
    if missing:
        raise PlanError(
            f"batch {batch_id} lacks column(s) {missing} that the state in {state_dir} is "
            f"built from; the stream has {list(schema)}. Declare the input's schema "
            "(read_files(..., schema=...)) so that missing columns are null."
        )
    current = {k: schema[k] for k in keys}
    origins = {k: f"key {k!r}" for k in keys}
    for agg in aggs:
        names = agg.partial_names()
        origins.update(dict.fromkeys(names, f"{agg.kind}({agg.column!r})"))
        try:
            current.update(agg.partial_dtypes(schema))
        except pl.exceptions.PolarsError:  # e.g. sum over text: report the input's type
            current.update(dict.fromkeys(names, schema[agg.column] if agg.column else pl.Null()))
    changed = sorted(
        {
            f"{origins[name]} is {current[name]} in batch {batch_id}, {recorded[name]} in the state"
            for name in current
            if name in recorded and current[name] != recorded[name]
        }
    )
    if changed:
        raise IncompatibleCheckpointError(
            f"the input of the state in {state_dir} changed type: {'; '.join(changed)}. "
            "Casting it to the state's type could silently change values. Declare the "
            "input's types (read_files(..., schema=...), or .with_columns(pl.col(...).cast(...))) "
            "as the state has them, or start the changed job on a new checkpoint directory."
        )


def check_operator_set(state_root: Path, batch_id: int, operators: list[StatefulOperator]) -> None:
    """Refuse a job whose stateful operators are not the ones the checkpoint
    has state for: one gained after batch 0 would start from empty state, one
    lost would leave its results out, both silently."""
    have = (
        {p.name for p in state_root.iterdir() if (p / "operator.json").exists()}
        if state_root.is_dir()
        else set()
    )
    ours = {op.operator_id: op for op in operators}
    gone = sorted(have - ours.keys())
    if gone:
        recorded = {name: _recorded_kind(state_root / name) for name in gone}
        raise IncompatibleCheckpointError(
            f"the checkpoint {state_root.parent} holds the state of stateful operator(s) "
            f"{recorded} that this job does not have (its operators: "
            f"{ {k: op.signature().get('kind') for k, op in ours.items()} }): the job lost or "
            "reordered a stateful operator. Start the changed job on a new checkpoint directory."
        )
    new = sorted(ours.keys() - have)
    if new and batch_id > 0:
        raise IncompatibleCheckpointError(
            f"the checkpoint {state_root.parent} has committed batches up to {batch_id - 1} but "
            f"no state for stateful operator(s) "
            f"{ {k: ours[k].signature().get('kind') for k in new} } of this job (no "
            f"{' or '.join(str(state_root / k / 'operator.json') for k in new)}): the job gained "
            "a stateful operator (or its state directory was deleted), which would start from "
            "empty state in the middle of the stream. Start the changed job on a new checkpoint "
            "directory."
        )


def _recorded_kind(state_dir: Path) -> Any:
    try:
        return read_json(state_dir / "operator.json", "operator").get("kind")
    except (OSError, ValueError, AttributeError, CheckpointError):
        return "?"
