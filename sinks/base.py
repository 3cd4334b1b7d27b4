"""The protocol every sink implements.

The engine calls ``open`` once per run, then ``add_batch(batch_id, df)`` for
each batch, in increasing batch id order, possibly repeating the last batch
id after a crash. A sink must make a repeated call with an id it already
stored a no-op: that is what turns at-least-once replays into exactly-once
output.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import polars as pl

OutputMode = Literal["append", "update", "complete"]


@dataclass(frozen=True)
class SinkContext:
    """What the engine tells a sink when a run starts."""

    query_id: str
    """Stable across restarts of the same checkpoint: the idempotency key."""
    output_mode: OutputMode = "append"
    checkpoint_dir: Path | None = None
    """The query's checkpoint directory, or ``None`` without a checkpoint."""
    key_columns: tuple[str, ...] = ()
    """Columns that identify a result row (``update`` mode upserts by them)."""
    fault_point: Callable[[str, int], None] | None = None
    """Called as ``fault_point(name, batch_id)`` at named points inside a
    sink's commit protocol (e.g. ``"sink.after_data"``), so crash tests can
    kill the process there. ``None`` outside tests."""

    def at(self, name: str, batch_id: int) -> None:
        """Signal that the sink reached point ``name`` while writing ``batch_id``."""
        if self.fault_point is not None:
            self.fault_point(name, batch_id)


class Sink(ABC):
    """Receives each batch's result rows; idempotent per batch id."""

    supported_modes: tuple[OutputMode, ...] = ("append", "update", "complete")

    def open(self, ctx: SinkContext) -> None:  # noqa: B027 - optional hook
        """Bind to a query before the first ``add_batch`` of a run."""

    @abstractmethod
    def add_batch(self, batch_id: int, df: pl.DataFrame) -> None:
        """Store ``df`` as the output of ``batch_id``; a no-op if already stored."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Flush and release resources."""

    def describe(self) -> dict[str, Any]:
        """A JSON description for plans, status and fingerprints."""
        return {"kind": type(self).__name__}
