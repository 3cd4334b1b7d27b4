"""An in-process source fed by the caller: notebooks and tests.

``partition_column`` names a column whose value is the row's partition, for
per-partition watermarks (as Kafka partitions would be).

Offsets are row counts. Rows added with :meth:`MemorySource.add` are kept
until a batch that read them is committed, so a batch re-run in the same
process reads the same rows. The data lives in memory only: after the
process exits, a checkpoint of a memory source cannot be resumed with the
same data unless the caller adds it again (as Spark's ``MemoryStream``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from microbatch.exceptions import PlanError, SourceError
from microbatch.sources.base import Source, SourceBatch
from microbatch.types import Offset


def _as_schema(schema: pl.Schema | Mapping[str, Any] | None) -> pl.Schema | None:
    return None if schema is None else pl.Schema(schema)


class MemorySource(Source):
    """Rows appended by the program; each ``add`` call is one or more records."""

    kind = "memory"

    def __init__(
        self,
        data: pl.DataFrame | Sequence[pl.DataFrame] | None = None,
        *,
        schema: pl.Schema | Mapping[str, Any] | None = None,
        max_records_per_batch: int | None = None,
        name: str | None = None,
        partition_column: str | None = None,
    ) -> None:
        if max_records_per_batch is not None and max_records_per_batch < 1:
            raise PlanError(f"max_records_per_batch must be >= 1, got {max_records_per_batch}")
        self.name = name or f"memory-{id(self):x}"
        self.max_records_per_batch = max_records_per_batch
        self.partition_column = partition_column
        self._schema = _as_schema(schema)
        self._lock = threading.Lock()
        self._chunks: list[pl.DataFrame] = []
        self._base = 0  # offset of the first row still held in _chunks
        self._total = 0
        frames = [data] if isinstance(data, pl.DataFrame) else list(data or [])
        for frame in frames:
            self.add(frame)

    @property
    def schema(self) -> pl.Schema | None:
        return self._schema

    def add(
        self, rows: pl.DataFrame | Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]]
    ) -> int:
        """Append rows (a frame, a dict of columns, or a list of dicts); return the new end offset.

        Rows are cast to the source's schema (set by the first frame when
        none was given); a frame that cannot be cast raises ``SourceError``.
        """
        frame = rows if isinstance(rows, pl.DataFrame) else pl.DataFrame(rows, schema=self._schema)
        with self._lock:
            if self._schema is None:
                self._schema = frame.schema
            try:
                frame = frame.select(
                    [
                        pl.col(n).cast(t) if n in frame.columns else pl.lit(None, t).alias(n)
                        for n, t in self._schema.items()
                    ]
                )
            except pl.exceptions.PolarsError as exc:
                raise SourceError(
                    f"rows added to memory source {self.name!r} do not fit its schema "
                    f"{dict(self._schema)}: {exc}"
                ) from exc
            if frame.height:
                self._chunks.append(frame)
                self._total += frame.height
            return self._total

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "max_records_per_batch": self.max_records_per_batch,
        }

    def identity(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def initial_offset(self) -> Offset:
        return 0

    def latest_offset(self, start: Offset, *, capped: bool = True) -> Offset:
        with self._lock:
            end = self._total
        if capped and self.max_records_per_batch is not None:
            end = min(end, int(start) + self.max_records_per_batch)
        return max(end, int(start))

    def compare(self, a: Offset, b: Offset) -> int:
        return (int(a) > int(b)) - (int(a) < int(b))

    def read(self, start: Offset, end: Offset) -> SourceBatch:
        start, end = int(start), int(end)
        with self._lock:
            if start < self._base or end > self._total:
                raise SourceError(
                    f"memory source {self.name!r} no longer holds rows [{start}, {end}) "
                    f"(it holds [{self._base}, {self._total})): a memory source cannot be "
                    "replayed after a restart; add the rows again or use a durable source"
                )
            data = pl.concat(self._chunks, how="vertical") if self._chunks else None
            base = self._base
        if data is None:
            return SourceBatch(self._schema.to_frame() if self._schema else pl.DataFrame())
        rows = data.slice(start - base, end - start)
        if self.partition_column is not None:
            return SourceBatch(rows, partitions=rows[self.partition_column])
        return SourceBatch(rows)

    def commit(self, end: Offset) -> None:
        """Forget whole chunks that end at or before ``end``."""
        end = int(end)
        with self._lock:
            while self._chunks and self._base + self._chunks[0].height <= end:
                self._base += self._chunks.pop(0).height
