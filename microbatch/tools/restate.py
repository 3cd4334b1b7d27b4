"""Restating output rows from the lakehouse: ``microbatch backfill --replace-where``.

Finance restates a day: recompute it from the source log and replace exactly
that day's rows of the output table, leaving every other row as it is. The
job's writer is run as a backfill (available-now, from the sources' start, on a
new checkpoint) into a staging memory table instead of its Delta table; its
final rows (upserted by the query's keys) that match the predicate then replace
the table's rows that match it, in one Delta commit (``replaceWhere``).

The predicate is SQL over the output's columns (``day = '2026-01-03'``): it
selects the staged rows with Polars SQL and the replaced rows with Delta's.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace

import polars as pl

from microbatch.api.writer import DataStreamWriter
from microbatch.exceptions import MicrobatchError
from sinks.delta import DeltaSink
from sinks.memory import MemorySink, drop_memory_table, memory_table

__all__ = ["Restatement"]


@dataclass(frozen=True)
class Restatement:
    """A job's writer, staged into memory, and where and what to replace."""

    staged: DataStreamWriter
    table: DeltaSink
    predicate: str
    memory_name: str

    @classmethod
    def of(cls, writer: DataStreamWriter, predicate: str) -> Restatement:
        """Stage ``writer``; refuse a job whose output is not one Delta table."""
        if not isinstance(writer.sink, DeltaSink):
            raise MicrobatchError(
                f"--replace-where restates rows of a Delta table, and this job writes to "
                f"{writer.sink.describe().get('kind')}; use it with a job whose writer is "
                "write_delta(...)"
            )
        if not predicate.strip():
            raise MicrobatchError("--replace-where needs a predicate, e.g. \"day = '2026-01-03'\"")
        name = f"restate-{uuid.uuid4().hex}"
        return cls(replace(writer, sink=MemorySink(name)), writer.sink, predicate, name)

    def rows(self) -> pl.DataFrame:
        """The staged final rows that match the predicate."""
        try:
            staged = memory_table(self.memory_name)
        finally:
            drop_memory_table(self.memory_name)
        if staged.width == 0:
            return staged
        try:
            return staged.sql(f"SELECT * FROM self WHERE {self.predicate}")
        except pl.exceptions.PolarsError as exc:
            raise MicrobatchError(
                f"--replace-where {self.predicate!r} is not a predicate over the output's "
                f"columns {staged.columns}: {str(exc).splitlines()[0]}"
            ) from None

    def commit(self, rows: pl.DataFrame) -> int:
        """Replace the table's rows matching the predicate with ``rows``; the new version."""
        return self.table.replace_where(rows, self.predicate)
