"""What the stream-stream joins share: late-row splitting and per-input state files.

Each input of a join keeps its own state directory with the input's column
types (``schema.arrow``) and ``meta.json``: the batch id at which the input
was first seen (``base``). Store versions count from there (batch N loads
version ``N - base``, commits ``N - base + 1``), because an input whose source
declares no schema may show its columns only in a later batch, when the other
input's stores are already at a higher version. The version rule of every
operator is stated once in :mod:`statestore.contract`.
"""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path

import polars as pl

from microbatch.exceptions import IncompatibleCheckpointError, PlanError
from microbatch.operators.base import (
    OperatorContext,
    StatefulOperator,
    split_late_by_time,
)
from microbatch.operators.state_schema import StateSchemaFile

T = "__t"
"""Transient column: a row's join time in epoch milliseconds."""
JOIN_SIDE = "join_side"
"""Column of the late output naming the input a late row came from."""


def split_late(
    df: pl.DataFrame, time_column: str, watermark_ms: int | None, side: str
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Rows that are not late (with ``__t``), and the late rows (with reason and side).

    A row is late when its time is null or at or before the watermark in force
    (:func:`microbatch.operators.base.split_late_by_time`).
    """
    kept, late = split_late_by_time(df, time_column, watermark_ms, label=side)
    return kept, late.with_columns(pl.lit(side).alias(JOIN_SIDE))


def require_columns(schema: pl.Schema, columns: list[str], *, side: str, what: str) -> None:
    """PlanError naming the columns a join needs that an input lacks."""
    missing = [c for c in columns if c not in schema]
    if missing:
        raise PlanError(
            f"{what}: the {side} input has no column(s) {missing}; its columns are {list(schema)}"
        )


def require_same_key_types(
    left: pl.Schema, right: pl.Schema, on: list[str], *, sides: tuple[str, str], what: str
) -> None:
    """PlanError when a join key has different types on the two inputs."""
    differ = [f"{k!r}: {left[k]} vs {right[k]}" for k in on if left[k] != right[k]]
    if differ:
        raise PlanError(
            f"{what}: the join keys have different types on the {sides[0]} and {sides[1]} "
            f"inputs ({'; '.join(differ)}); cast one side with .with_columns(pl.col(...).cast(...))"
        )


class InputState:
    """The recorded column types and version base of one join input."""

    def __init__(self, side: str) -> None:
        self.side = side
        self.directory: Path | None = None
        self.schema: pl.Schema | None = None
        self.base = 0

    def open(self, directory: Path | None) -> bool:
        """Bind to ``directory``; True when the input's schema was recorded before."""
        self.directory = directory
        if directory is None or not _schema_file(directory).committed():
            return False
        self.schema, meta = _schema_file(directory).read()
        self.base = int(meta["base"])
        return True

    def define(self, schema: pl.Schema, batch_id: int) -> None:
        """Record the input's columns, first seen in ``batch_id``."""
        if self.directory is None:
            raise AssertionError("stream joins need a checkpoint directory")
        # NOTE: meta.json is the commit point: its presence says schema.arrow is complete
        _schema_file(self.directory).write(schema, {"base": batch_id, "columns": list(schema)})
        self.schema = schema
        self.base = batch_id

    def check(self, schema: pl.Schema, batch_id: int) -> None:
        """Refuse a batch whose columns changed type since the state was created."""
        assert self.schema is not None
        if schema == self.schema:
            return
        changed = [
            f"{c!r} is {schema.get(c)} in batch {batch_id}, {self.schema.get(c)} in the state"
            for c in dict.fromkeys([*self.schema, *schema])
            if schema.get(c) != self.schema.get(c)
        ]
        raise IncompatibleCheckpointError(
            f"the {self.side} input of the join whose state is in {self.directory} changed its "
            f"columns: {'; '.join(changed)}. Declare the input's schema (or cast with "
            ".with_columns) as the state has it, or start the changed job on a new checkpoint."
        )

    def version(self, batch_id: int) -> int:
        """The store version that holds the state before ``batch_id``."""
        return batch_id - self.base


def _schema_file(directory: Path) -> StateSchemaFile:
    """A join input's column types (``schema.arrow``) and ``meta.json``."""
    return StateSchemaFile(directory / "schema.arrow", directory / "meta.json", "join-input")


class BinaryOperator(StatefulOperator):
    """A stateful operator with two inputs (the executor calls :meth:`process_pair`)."""

    def process(self, df: pl.DataFrame, ctx: OperatorContext) -> pl.DataFrame:
        raise TypeError(
            f"{type(self).__name__} has two inputs: call process_pair(left, right, ctx)"
        )

    @abstractmethod
    def process_pair(
        self, left: pl.DataFrame, right: pl.DataFrame, ctx: OperatorContext
    ) -> pl.DataFrame:
        """Rows to emit for this batch, given both inputs' rows of the batch."""
