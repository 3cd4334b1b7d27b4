"""The protocol of stateful operators and what the engine gives them per batch."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from microbatch.checkpoint.files import read_json, write_json_atomic
from microbatch.exceptions import IncompatibleCheckpointError

LATE_REASON = "late_reason"


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
    ``abort()`` when the batch failed.
    """

    operator_id: str = "op"

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

    def metrics(self) -> dict[str, Any]:
        """State metrics of the last batch (rows, bytes, commit time...)."""
        return {}


def check_signature(state_dir: Path, signature: dict[str, Any]) -> None:
    """Record the operator's signature once; refuse a different one later."""
    state_dir.mkdir(parents=True, exist_ok=True)
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
