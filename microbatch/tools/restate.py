"""Restating output rows from the lakehouse: ``microbatch backfill --replace-where``.

Finance restates a day: recompute it from the source log and replace exactly
that day's rows of the output table, leaving every other row as it is. The
job's writer is run as a backfill (available-now, from the sources' start, on a
new checkpoint) into a staging memory table instead of its Delta or Iceberg
table; its final rows (upserted by the query's keys) that match the predicate
then replace the table's rows that match it, in one commit (Delta's
``replaceWhere``; an Iceberg overwrite snapshot with that row filter).

The predicate is SQL over the output's columns (``day = '2026-01-03'``): it
selects the staged rows with Polars SQL and the replaced rows with Delta's or
PyIceberg's expression parser.

The lateness rule is switched off for the whole replay: the backfill runs with
``hold_watermark=True`` (no row is late, no window closes until the input
ends, then one flush emits every window), so the restated rows equal a one-shot
computation over every source row, whatever ``max_files_per_batch`` splits the
history into. The writer's side outputs (``on_late``, ``on_dead_letters``) are
staged in memory too: a restatement never adds a row to the live job's late or
dead-letter tables; the CLI reports how many rows they caught.

Nothing reaches the table before the one final commit, so an interrupted or
killed restatement is re-run on a new checkpoint directory (the staging lived
in the killed process); a restatement killed after its commit, re-run, replaces
the same rows with the same rows.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, fields, replace
from typing import Any

import polars as pl

from microbatch.api.writer import DataStreamWriter
from microbatch.exceptions import MicrobatchError
from sinks.base import Sink
from sinks.delta import DeltaSink
from sinks.iceberg import IcebergSink
from sinks.memory import MemorySink, UnknownTableError, drop_memory_table, memory_table

__all__ = ["Restatement"]


@dataclass(frozen=True)
class Restatement:
    """A job's writer, staged into memory, and where and what to replace.

    ``staged`` writes its output and every side output to memory tables, never
    to the job's tables; start it with ``hold_watermark=True`` so that no row
    is late in the replay (``microbatch backfill --replace-where`` does).
    """

    staged: DataStreamWriter
    table: DeltaSink | IcebergSink
    predicate: str
    memory_name: str
    side_names: tuple[tuple[str, str], ...] = ()
    """(writer field, memory table) of each staged side output."""

    @classmethod
    def of(cls, writer: DataStreamWriter, predicate: str) -> Restatement:
        """Stage ``writer``; refuse a job whose output is not one Delta or Iceberg table."""
        if not isinstance(writer.sink, DeltaSink | IcebergSink):
            raise MicrobatchError(
                f"--replace-where restates rows of a Delta or Iceberg table, and this job "
                f"writes to {writer.sink.describe().get('kind')}; use it with a job whose "
                "writer is write_delta(...) or write_iceberg(...)"
            )
        if not predicate.strip():
            raise MicrobatchError("--replace-where needs a predicate, e.g. \"day = '2026-01-03'\"")
        name = f"restate-{uuid.uuid4().hex}"
        # NOTE: side sinks are the writer's Sink fields besides ``sink``
        # (late rows, dead letters); each is swapped for a memory table
        sides = {
            f.name: f"{name}-{f.name}"
            for f in fields(writer)
            if f.name != "sink" and isinstance(getattr(writer, f.name), Sink)
        }
        sinks: dict[str, Any] = {side: MemorySink(table) for side, table in sides.items()}
        staged = replace(writer, sink=MemorySink(name), **sinks)
        return cls(staged, writer.sink, predicate, name, tuple(sides.items()))

    def side_rows(self) -> dict[str, int]:
        """Rows each side output caught in the replay (kept out of the job's
        side tables), by writer field (``late_sink``, ``dead_letter``)."""
        counts: dict[str, int] = {}
        for side, table in self.side_names:
            try:
                counts[side] = memory_table(table).height
            except UnknownTableError:  # never written to
                counts[side] = 0
            finally:
                drop_memory_table(table)
        return counts

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
        """Replace the table's rows matching the predicate with ``rows``; the new Delta
        version or Iceberg snapshot id."""
        return self.table.replace_where(rows, self.predicate)
