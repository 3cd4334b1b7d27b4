"""Entry points of the user API: ``mb.read_*``, ``mb.generate``, ``mb.table``."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

import polars as pl

from microbatch.plan import SourceNode
from microbatch.sources.memory import MemorySource
from microbatch.stream import Stream, stream_of


class MemoryStream(Stream):
    """A stream over a :class:`MemorySource`; ``add`` appends rows to it."""

    def __init__(self, source: MemorySource) -> None:
        super().__init__(SourceNode(source))
        self.source = source

    def add(self, rows: pl.DataFrame | Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]]) -> int:
        """Append rows; returns the source's new end offset."""
        return self.source.add(rows)


def read_memory(
    data: pl.DataFrame | Sequence[pl.DataFrame] | None = None,
    *,
    schema: pl.Schema | Mapping[str, Any] | None = None,
    max_records_per_batch: int | None = None,
    name: str | None = None,
    partition_column: str | None = None,
) -> MemoryStream:
    """A stream of rows held in this process; add more with ``.add(rows)``.

    Examples
    --------
    >>> import polars as pl, microbatch as mb
    >>> src = mb.read_memory(schema={"x": pl.Int64})
    >>> q = src.filter(pl.col("x") > 1).write_memory("demo_doc").start()
    >>> _ = src.add({"x": [1, 2, 3]}); q.process_all_available(); q.stop()
    >>> mb.table("demo_doc")["x"].to_list()
    [2, 3]
    """
    return MemoryStream(
        MemorySource(data, schema=schema, max_records_per_batch=max_records_per_batch, name=name,
                     partition_column=partition_column)
    )


def read_files(
    path: str | os.PathLike[str],
    *,
    format: Literal["parquet", "json", "csv"] = "parquet",  # noqa: A002 - Spark's name
    schema: pl.Schema | Mapping[str, Any] | None = None,
    max_files_per_batch: int | None = None,
    glob: str | None = None,
) -> Stream:
    """A stream over the files of a directory, taken in (mtime, name) order.

    New files are picked up on later batches; a file is never read twice.
    Malformed records go to the dead-letter output with file and reason.
    """
    from microbatch.sources.files import FileSource

    return stream_of(
        FileSource(path, format=format, schema=schema, max_files_per_batch=max_files_per_batch,
                   glob=glob)
    )


def generate(
    *,
    rows_per_second: float | None = 1000,
    total_rows: int | None = None,
    cards: int = 10_000,
    zipf: float = 1.1,
    partitions: int = 1,
    max_delay: str = "5s",
    late_fraction: float = 0.0,
    late_by: tuple[str, str] = ("1m", "1h"),
    start: datetime | str | None = None,
    seed: int = 0,
    max_records_per_batch: int | None = None,
) -> Stream:
    """A deterministic stream of card transactions (the demo and benchmark workload).

    Columns: ``event_id``, ``card_id`` (Zipf-skewed over ``cards`` keys),
    ``merchant``, ``amount``, ``event_time`` (disordered by up to
    ``max_delay``; a ``late_fraction`` of rows arrive ``late_by`` late).
    Row *i* depends only on ``seed``, *i* and the parameters, so replays and
    any batch split give the same rows.
    """
    from microbatch.sources.generator import GeneratorSource

    return stream_of(
        GeneratorSource(
            rows_per_second=rows_per_second, total_rows=total_rows, cards=cards, zipf=zipf,
            partitions=partitions, max_delay=max_delay, late_fraction=late_fraction,
            late_by=late_by, start=start, seed=seed, max_records_per_batch=max_records_per_batch,
        )
    )


def table(name: str) -> pl.DataFrame:
    """The current contents of the memory sink ``name`` (``write_memory(name)``)."""
    from sinks.memory import memory_table

    return memory_table(name)


def read_parquet_output(path: str | os.PathLike[str]) -> pl.DataFrame:
    """The rows of every committed batch of a ``write_parquet`` output."""
    from sinks.parquet import read_parquet_output as read

    return read(path)
