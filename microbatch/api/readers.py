"""Entry points of the user API: ``mb.read_*``, ``mb.generate``, ``mb.table``."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

import polars as pl

from microbatch.api.stream import Stream, stream_of
from microbatch.plan.nodes import SourceNode
from microbatch.sources.memory import MemorySource


class MemoryStream(Stream):
    """A stream over a :class:`MemorySource`; ``add`` appends rows to it."""

    def __init__(self, source: MemorySource) -> None:
        super().__init__(SourceNode(source))
        self.source = source

    def add(
        self, rows: pl.DataFrame | Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]]
    ) -> int:
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
        MemorySource(
            data,
            schema=schema,
            max_records_per_batch=max_records_per_batch,
            name=name,
            partition_column=partition_column,
        )
    )


def read_files(
    path: str | os.PathLike[str],
    *,
    format: Literal["parquet", "json", "csv"] = "parquet",
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
        FileSource(
            path, format=format, schema=schema, max_files_per_batch=max_files_per_batch, glob=glob
        )
    )


def read_kafka(
    topics: str | Sequence[str],
    *,
    bootstrap: str,
    format: Literal["json", "csv", "raw"] = "json",
    schema: pl.Schema | Mapping[str, Any] | None = None,
    starting_offsets: Literal["earliest", "latest"] | int | Mapping[Any, int] = "earliest",
    max_records_per_batch: int | None = None,
    config: Mapping[str, Any] | None = None,
    on_data_loss: Literal["fail", "skip"] = "fail",
    commit_group: str | None = None,
    metadata_columns: str | Sequence[str] = ("key", "topic", "partition", "offset", "timestamp"),
    broker_timeout: str | int = "2m",
) -> Stream:
    """A stream over Kafka topics; offsets ``{"topic:partition": offset}`` live in the checkpoint.

    Each batch reads exactly its recorded offset range per partition (replays
    read the same records); values are decoded in bulk (``json``, ``csv``, or
    ``raw`` bytes) and malformed ones go to the dead-letter output with
    ``topic:partition@offset``. Columns: the schema's, then ``key, topic,
    partition, offset, timestamp``. Watermarks are per Kafka partition.
    See :class:`microbatch.sources.kafka.KafkaSource` for every option.

    Examples
    --------
    >>> tx = mb.read_kafka("payments", bootstrap="127.0.0.1:9092",
    ...                    schema={"card_id": pl.Int64})  # doctest: +SKIP
    """
    from microbatch.sources.kafka import KafkaSource

    return stream_of(
        KafkaSource(
            topics,
            bootstrap=bootstrap,
            format=format,
            schema=schema,
            starting_offsets=starting_offsets,
            max_records_per_batch=max_records_per_batch,
            config=config,
            on_data_loss=on_data_loss,
            commit_group=commit_group,
            metadata_columns=metadata_columns,
            broker_timeout=broker_timeout,
        )
    )


def read_delta(
    path: str | os.PathLike[str],
    *,
    starting_version: int | None = None,
    starting_timestamp: datetime | str | None = None,
    max_files_per_batch: int | None = None,
    ignore_changes: bool = False,
    storage_options: Mapping[str, str] | None = None,
) -> Stream:
    """A stream of the rows appended to a Delta table, version by version.

    The table's commits are the log: each batch reads the data files added
    by a recorded range of versions, so replays read the same rows. New
    commits are picked up by later batches; compaction commits are skipped.
    A version that deletes, updates, merges or overwrites stops the query
    with a :class:`~microbatch.SourceError` naming it, unless
    ``ignore_changes=True`` (then the rewritten files' rows are emitted
    again). Default start: version 0, the whole history. See
    :mod:`microbatch.sources.delta`.

    Examples
    --------
    >>> tx = mb.read_delta("lake/transactions", max_files_per_batch=100)  # doctest: +SKIP
    """
    from microbatch.sources.delta import DeltaSource

    return stream_of(
        DeltaSource(
            path,
            starting_version=starting_version,
            starting_timestamp=starting_timestamp,
            max_files_per_batch=max_files_per_batch,
            ignore_changes=ignore_changes,
            storage_options=dict(storage_options) if storage_options else None,
        )
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
            rows_per_second=rows_per_second,
            total_rows=total_rows,
            cards=cards,
            zipf=zipf,
            partitions=partitions,
            max_delay=max_delay,
            late_fraction=late_fraction,
            late_by=late_by,
            start=start,
            seed=seed,
            max_records_per_batch=max_records_per_batch,
        )
    )


def table(name: str) -> pl.DataFrame:
    """The current contents of the memory sink ``name`` (``write_memory(name)``)."""
    from sinks.memory import memory_table

    return memory_table(name)


def parquet_table(path: str | os.PathLike[str]) -> pl.DataFrame:
    """The rows of every committed batch of a ``write_parquet`` output, as a DataFrame.

    Reads the output's manifest, so files of a batch that was written but not
    committed (a crash in the middle) are never seen. Like :func:`table` (the
    memory sink), it returns rows; the ``read_*`` functions return streams.
    """
    from sinks.parquet import read_parquet_output as read

    return read(path)


def read_parquet_output(path: str | os.PathLike[str]) -> pl.DataFrame:
    """Deprecated name of :func:`parquet_table` (``read_*`` functions return streams)."""
    warnings.warn(
        "mb.read_parquet_output is deprecated and will be removed in 0.3: use "
        "mb.parquet_table (every read_* function returns a Stream; this returns rows)",
        DeprecationWarning,
        stacklevel=2,
    )
    return parquet_table(path)
