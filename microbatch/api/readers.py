"""Entry points of the user API: ``mb.read_*``, ``mb.generate``, ``mb.table``."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

import polars as pl

from microbatch.api.stream import Stream, stream_of
from microbatch.exceptions import PlanError
from microbatch.plan.nodes import SourceNode
from microbatch.sources.memory import MemorySource
from microbatch.types import MissingColumns


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

    Rows are cast to ``schema`` (or to the schema of the first frame when none is
    given). Offsets are row counts. The rows live in memory only: a batch's rows
    are dropped once the batch commits, so a memory stream feeds one query and a
    checkpoint of it cannot be resumed after the process exits unless the rows
    are added again (as Spark's ``MemoryStream``).

    Parameters
    ----------
    data
        Initial rows: a DataFrame, or a sequence of DataFrames appended in order.
    schema
        Columns and types of the stream. ``None``: taken from the first frame.
    max_records_per_batch
        At most this many rows per batch (``None``: every available row).
    name
        The source's name in the plan and in progress records (default:
        ``memory-<hex id>``).
    partition_column
        A column whose value is the row's partition, for per-partition
        watermarks (as Kafka partitions would be).

    Returns
    -------
    MemoryStream
        A :class:`Stream` whose ``add(rows)`` appends rows (a frame, a dict of
        columns or a list of dicts) and returns the new end offset.

    Examples
    --------
    Rows given up front, read in batches of at most two rows:

    >>> stream = mb.read_memory(pl.DataFrame({"x": [1, 2, 3]}), max_records_per_batch=2)
    >>> query = stream.write_memory("doc_read_memory").start(trigger="available-now")
    >>> query.await_termination()
    True
    >>> mb.table("doc_read_memory")["x"].to_list()
    [1, 2, 3]
    >>> [p["input_rows"] for p in query.recent_progress]
    [2, 1]

    Rows added while a query runs:

    >>> src = mb.read_memory(schema={"x": pl.Int64})
    >>> q = src.filter(pl.col("x") > 1).write_memory("doc_read_memory_live").start()
    >>> src.add({"x": [1, 2, 3]})
    3
    >>> q.process_all_available()
    >>> q.stop()
    >>> mb.table("doc_read_memory_live")["x"].to_list()
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
    on_missing_columns: MissingColumns = "dead_letter",
) -> Stream:
    """A stream over the files of a directory, taken in (mtime, name) order.

    New files are picked up on later batches; a file is never read twice. Each
    time a batch is planned the directory is listed and new files are admitted
    to a durable ledger in the checkpoint, so a batch re-run after a crash reads
    the same files. Malformed records go to the dead-letter output with file and
    reason (the location is ``file`` or ``file:line``); the rest of the batch
    goes on.

    Parameters
    ----------
    path
        The directory to watch (listed non-recursively unless ``glob`` says
        ``**``).
    format
        ``"parquet"``, ``"json"`` (newline-delimited JSON) or ``"csv"`` (with a
        header line).
    schema
        Columns and types of the output, in this order. Required for ``json``
        and ``csv``; inferred from the files for ``parquet`` when ``None``. A
        value that does not convert sends its row to the dead letters. Columns
        of a file that are not in the schema are dropped.
    max_files_per_batch
        At most this many files per batch (``None``: every new file).
    glob
        File name pattern relative to ``path`` (default per format:
        ``*.parquet``; ``*.json``, ``*.jsonl``, ``*.ndjson``; ``*.csv``). Hidden
        (``.``/``_`` prefix) and temporary files are never admitted: write files
        under such a name and rename them into place.
    on_missing_columns
        Schema drift policy for a file (with records) that lacks a column of
        ``schema``: a Parquet or CSV file without it, a JSON file none of
        whose records has the key. ``"dead_letter"`` (the default, strict):
        the whole file goes to the dead letters with the reason ``schema
        mismatch: missing column 'x' (type) ...``, is counted as
        ``schema_mismatch`` in the progress record (an alarm in ``microbatch
        status``) and is left in place; the other files of the batch go on.
        ``"null"``: the column is read as null. A Parquet column whose type
        does not convert to the schema's (a list for a number, a number for a
        timestamp) is a schema mismatch under either policy.

    Returns
    -------
    Stream

    Raises
    ------
    PlanError
        For an unknown ``format``, a ``json``/``csv`` source without ``schema``,
        a bad ``max_files_per_batch`` or ``on_missing_columns``.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> landing = pathlib.Path(tempfile.mkdtemp())
    >>> pl.DataFrame({"id": [1, 2]}).write_parquet(landing / "part-1.parquet")
    >>> pl.DataFrame({"id": [3]}).write_parquet(landing / "part-2.parquet")
    >>> query = (
    ...     mb.read_files(landing, max_files_per_batch=1)
    ...     .write_memory("doc_read_files")
    ...     .start(trigger="available-now")
    ... )
    >>> query.await_termination()
    True
    >>> mb.table("doc_read_files")["id"].to_list()
    [1, 2, 3]
    >>> [p["input_rows"] for p in query.recent_progress]
    [2, 1]

    CSV and JSON need a schema; a record that does not convert is a dead letter
    and the rest of the batch goes on:

    >>> pl.DataFrame({"id": ["1", "one", "3"]}).write_csv(landing / "ids.csv")
    >>> query = (
    ...     mb.read_files(landing, format="csv", schema={"id": pl.Int64})
    ...     .write_memory("doc_read_files_csv")
    ...     .start(trigger="available-now")
    ... )
    >>> query.await_termination()
    True
    >>> mb.table("doc_read_files_csv")["id"].to_list()
    [1, 3]
    >>> query.last_progress["dead_letter_rows"]
    1

    A file that lacks a column of the schema is refused whole, by default:

    >>> pl.DataFrame({"ident": [4]}).write_csv(landing / "renamed.csv")
    >>> query = (
    ...     mb.read_files(landing, format="csv", schema={"id": pl.Int64})
    ...     .write_memory("doc_read_files_drift")
    ...     .start(trigger="available-now")
    ... )
    >>> query.await_termination()
    True
    >>> mb.table("doc_read_files_drift")["id"].to_list()
    [1, 3]
    >>> query.last_progress["schema_mismatch"]
    1
    """
    from microbatch.sources.files import FileSource

    return stream_of(
        FileSource(
            path,
            format=format,
            schema=schema,
            max_files_per_batch=max_files_per_batch,
            glob=glob,
            on_missing_columns=on_missing_columns,
        )
    )


def read_kafka(
    topics: str | Sequence[str],
    *,
    bootstrap: str,
    format: Literal["json", "csv", "raw", "debezium-json", "upsert"] = "json",
    schema: pl.Schema | Mapping[str, Any] | None = None,
    starting_offsets: Literal["earliest", "latest"] | int | Mapping[Any, int] = "earliest",
    max_records_per_batch: int | None = None,
    config: Mapping[str, Any] | None = None,
    on_data_loss: Literal["fail", "skip"] = "fail",
    commit_group: str | None = None,
    metadata_columns: str | Sequence[str] = ("key", "topic", "partition", "offset", "timestamp"),
    broker_timeout: str | int = "2m",
    key_columns: str | Sequence[str] | None = None,
) -> Stream:
    """A stream over Kafka topics; offsets ``{"topic:partition": offset}`` live in the checkpoint.

    Each batch reads exactly its recorded offset range per partition (replays
    read the same records); values are decoded in bulk (``json``, ``csv``, or
    ``raw`` bytes) and malformed ones go to the dead-letter output with
    ``topic:partition@offset``. Columns: the schema's, then ``key, topic,
    partition, offset, timestamp``. Watermarks are per Kafka partition.
    Building the stream does not contact the broker: the clients are created
    when a query starts. See :class:`microbatch.sources.kafka.KafkaSource` for
    every option.

    Parameters
    ----------
    topics
        A topic name or a list of names (no patterns).
    bootstrap
        ``host:port[,host:port...]`` of the cluster.
    format
        ``"json"`` (one JSON object per value), ``"csv"`` (one header-less
        record per value, fields in schema order), ``"raw"`` (a ``value``
        column of bytes), or a changelog whose rows carry ``_change_type``
        (``insert``/``update_preimage``/``update_postimage``/``delete``):
        ``"debezium-json"`` (Debezium envelopes, bare or in Kafka Connect's
        ``schema``/``payload`` wrapper; tombstones skipped) or ``"upsert"``
        (value = the row, an ``update_postimage``; tombstone = a ``delete`` of
        the key).
    schema
        Columns and types of the decoded value (of the row images for
        ``debezium-json``); required for every format but ``raw``.
    starting_offsets
        Where a new query starts: ``"earliest"``, ``"latest"``, a timestamp in
        epoch milliseconds, or ``{partition: offset}`` (keys ``int`` for a
        single topic or ``"topic:partition"``). Only used when the checkpoint has
        no offsets yet.
    max_records_per_batch
        Cap on records per batch, split across partitions in proportion to their
        backlog.
    config
        Extra librdkafka settings (SASL/SSL...) for every client; secrets are
        redacted wherever the source is described.
    on_data_loss
        ``"fail"`` or ``"skip"`` when recorded offsets are no longer on the
        broker.
    commit_group
        Also commit each batch's end offsets to this consumer group, for lag
        tools (informational: the checkpoint is the position).
    metadata_columns
        Which of ``key, topic, partition, offset, timestamp`` (and ``headers``)
        to add after the value's columns.
    broker_timeout
        How long an unreachable broker is retried before a batch fails.
    key_columns
        ``format="upsert"`` only, and required there: the columns of the
        record key's JSON object (the row of a tombstone's delete).

    Returns
    -------
    Stream

    Raises
    ------
    PlanError
        For invalid options, e.g. ``format="json"`` without a ``schema``.

    Examples
    --------
    >>> payments = mb.read_kafka(
    ...     "payments",
    ...     bootstrap="127.0.0.1:9092",
    ...     schema={"card_id": pl.Int64, "amount": pl.Float64},
    ...     max_records_per_batch=10_000,
    ... )
    >>> print(payments.explain())
    Source[kafka](topics=['payments'], bootstrap=127.0.0.1:9092, format=json,
        schema={'card_id': 'Int64', 'amount': 'Float64'}, starting_offsets=earliest,
        max_records_per_batch=10000, on_data_loss=fail, config={})
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
            key_columns=key_columns,
        )
    )


def read_delta(
    path: str | os.PathLike[str],
    *,
    starting_version: int | None = None,
    starting_timestamp: datetime | str | None = None,
    max_files_per_batch: int | None = None,
    ignore_changes: bool = False,
    changes: bool = False,
    storage_options: Mapping[str, str] | None = None,
) -> Stream:
    """A stream of the rows appended to a Delta table, version by version,
    or of its Change Data Feed (``changes=True``).

    The table's commits are the log: each batch reads the data files added
    by a recorded range of versions, so replays read the same rows. New
    commits are picked up by later batches; compaction commits are skipped.
    A version that deletes, updates, merges or overwrites stops the query
    with a :class:`~microbatch.SourceError` naming it, unless
    ``ignore_changes=True`` (then the rewritten files' rows are emitted
    again). Default start: version 0, the whole history. See
    :mod:`microbatch.sources.delta`.

    Parameters
    ----------
    path
        The table: a local directory, a ``file://`` or an ``s3://`` URI.
    starting_version
        The first version to read (default: 0, the whole history).
    starting_timestamp
        Start at the first version committed at or after this instant (a
        ``datetime``, naive meaning UTC, or an ISO-8601 string). Not together
        with ``starting_version``.
    max_files_per_batch
        At most this many data files per batch (``None``: every new file).
    ignore_changes
        Read the added files of versions that rewrite data instead of stopping
        (rewritten rows are emitted again).
    changes
        Read the table's Change Data Feed instead: every version's changes
        (appends, MERGE, UPDATE, DELETE, overwrite) as rows with
        ``_change_type`` (``insert``, ``update_preimage``,
        ``update_postimage``, ``delete``), ``_commit_version`` and
        ``_commit_timestamp`` after the table's columns; whole versions per
        batch. A version that removes data while the table property
        ``delta.enableChangeDataFeed`` was off raises
        :class:`~microbatch.ChangeDataFeedError`. Not with ``ignore_changes``.
        See :mod:`microbatch.sources.delta_changes`.
    storage_options
        For ``s3://``: delta-rs style options (``AWS_ENDPOINT_URL``,
        ``AWS_ACCESS_KEY_ID``, ...), used for the log and the data files.

    Returns
    -------
    Stream

    Raises
    ------
    PlanError
        When both ``starting_version`` and ``starting_timestamp`` are given,
        ``changes`` with ``ignore_changes``, or an option is out of range.

    Examples
    --------
    >>> import tempfile
    >>> lake = tempfile.mkdtemp()
    >>> pl.DataFrame({"id": [1, 2]}).write_delta(lake)  # version 0
    >>> pl.DataFrame({"id": [3]}).write_delta(lake, mode="append")  # version 1
    >>> query = (
    ...     mb.read_delta(lake, starting_version=1)
    ...     .write_memory("doc_read_delta")
    ...     .start(trigger="available-now")
    ... )
    >>> query.await_termination()
    True
    >>> mb.table("doc_read_delta")["id"].to_list()
    [3]
    """
    from microbatch.sources.delta import DeltaSource
    from microbatch.sources.delta_changes import DeltaChangesSource

    if changes:
        if ignore_changes:
            raise PlanError(
                "read_delta: changes=True reads every change, ignore_changes=True skips them: "
                "pass one of them"
            )
        return stream_of(
            DeltaChangesSource(
                path,
                starting_version=starting_version,
                starting_timestamp=starting_timestamp,
                max_files_per_batch=max_files_per_batch,
                storage_options=dict(storage_options) if storage_options else None,
            )
        )
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


def read_iceberg(
    table: str,
    *,
    catalog: Any,
    starting_snapshot: int | Literal["earliest", "latest"] | None = None,
    starting_timestamp: datetime | str | None = None,
    max_files_per_batch: int | None = None,
    ignore_changes: bool = False,
    skip_change_commits: bool = False,
    storage_options: Mapping[str, str] | None = None,
) -> Stream:
    """A stream of the rows appended to an Iceberg table, snapshot by snapshot.

    The table's snapshot lineage is the log: each batch reads the data files
    added by a recorded range of snapshots, so replays read the same rows. New
    snapshots are picked up by later batches (the table is reloaded from the
    catalog when a batch is planned); compaction (``replace``) snapshots are
    skipped. A snapshot that overwrites or deletes stops the query with a
    :class:`~microbatch.SourceError` naming it, unless ``skip_change_commits``
    or ``ignore_changes``. Rows are read by field id with the schema of the
    range's last snapshot (added columns are null in older files, renamed
    columns keep their values). See :mod:`microbatch.sources.iceberg`.

    Parameters
    ----------
    table
        ``"namespace.table"``.
    catalog
        A ``pyiceberg`` Catalog, a mapping of catalog properties, or a string:
        ``sqlite:///PATH.db``, ``http(s)://HOST`` (REST), or a configured
        catalog's name (see :mod:`sinks.iceberg_catalog`).
    starting_snapshot
        A snapshot id of the current lineage (read from it on, inclusive),
        ``"earliest"`` (default: the whole history; refused when old snapshots
        were expired) or ``"latest"`` (only snapshots committed later).
    starting_timestamp
        Start at the first snapshot committed at or after this instant (a
        ``datetime``, naive meaning UTC, or an ISO-8601 string). Not together
        with ``starting_snapshot``.
    max_files_per_batch
        At most this many data files per batch (``None``: every new file).
    ignore_changes
        Read the added files of overwrite/delete snapshots instead of stopping
        (the surviving rows of rewritten files are emitted again).
    skip_change_commits
        Skip overwrite/delete snapshots instead of stopping (rows they add are
        not read; right when they only delete). Not with ``ignore_changes``.
    storage_options
        For ``s3://`` warehouses: delta-rs style options (``AWS_ENDPOINT_URL``,
        ``AWS_ACCESS_KEY_ID``, ...) or PyIceberg ``s3.*`` FileIO properties.

    Returns
    -------
    Stream

    Raises
    ------
    PlanError
        For a table name without a namespace, both starting options, both
        change options, or an option out of range.

    Examples
    --------
    >>> import tempfile, pyarrow as pa
    >>> from sinks.iceberg_catalog import resolve_catalog
    >>> catalog = f"sqlite:///{tempfile.mkdtemp()}/iceberg.db"
    >>> iceberg = resolve_catalog(catalog)
    >>> iceberg.create_namespace("db")
    >>> tbl = iceberg.create_table("db.events", schema=pa.schema([("id", pa.int64())]))
    >>> tbl.append(pa.table({"id": [1, 2]}))
    >>> tbl.append(pa.table({"id": [3]}))
    >>> query = (
    ...     mb.read_iceberg("db.events", catalog=catalog, max_files_per_batch=1)
    ...     .write_memory("doc_read_iceberg")
    ...     .start(trigger="available-now")
    ... )
    >>> query.await_termination()
    True
    >>> mb.table("doc_read_iceberg")["id"].to_list()
    [1, 2, 3]
    >>> [p["input_rows"] for p in query.recent_progress]
    [2, 1]
    """
    from microbatch.sources.iceberg import IcebergSource

    return stream_of(
        IcebergSource(
            table,
            catalog=catalog,
            starting_snapshot=starting_snapshot,
            starting_timestamp=starting_timestamp,
            max_files_per_batch=max_files_per_batch,
            ignore_changes=ignore_changes,
            skip_change_commits=skip_change_commits,
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
    event_rate: float | None = None,
) -> Stream:
    """A deterministic stream of card transactions (the demo and benchmark workload).

    Columns: ``event_id``, ``card_id`` (Zipf-skewed over ``cards`` keys),
    ``merchant``, ``amount``, ``event_time`` (disordered by up to
    ``max_delay``; a ``late_fraction`` of rows arrive ``late_by`` late).
    Row *i* depends only on ``seed``, *i* and the parameters, so replays and
    any batch split give the same rows. Event *i* nominally happens at
    ``start + i / event_rate`` seconds and its ``event_time`` is that minus a delay, so
    the first rows are timestamped slightly before ``start``.

    Parameters
    ----------
    rows_per_second
        Rows become available at this rate of wall-clock time; ``None`` makes
        all ``total_rows`` available at once (event times still advance 1000
        events per second).
    total_rows
        Length of the log (``None``: unbounded; required when
        ``rows_per_second`` is ``None``).
    cards, zipf
        ``card_id`` is drawn from ``cards`` keys with
        ``P(k) ~ 1 / (k + 1) ** zipf`` (``0`` the most frequent).
    partitions
        Row *i* belongs to partition ``i % partitions`` (per-partition
        watermarks).
    max_delay, late_fraction, late_by
        Disorder: every event is up to ``max_delay`` behind its nominal time; a
        ``late_fraction`` of them are further behind by ``late_by[0]`` to
        ``late_by[1]``.
    start
        Event-time origin: ``None`` (or ``"now"``) for the wall clock when the
        query starts, or a fixed ``datetime`` (naive meaning UTC) or ISO-8601
        string for deterministic output.
    seed
        Seed of the whole log.
    max_records_per_batch
        At most this many rows per batch (``None``: every available row).
    event_rate
        Events per second of event time (default: ``rows_per_second``, or 1000
        when that is ``None``). ``rows_per_second=None, event_rate=1`` makes
        hours of sparse event time available at once (simulations, tests).

    Returns
    -------
    Stream

    Raises
    ------
    PlanError
        For an out-of-range option, or ``rows_per_second=None`` without
        ``total_rows``.

    Examples
    --------
    >>> stream = mb.generate(
    ...     rows_per_second=None,
    ...     total_rows=1_000,
    ...     start="2026-01-01T00:00:00+00:00",
    ...     seed=1,
    ...     max_records_per_batch=400,
    ... )
    >>> query = stream.write_memory("doc_generate").start(trigger="available-now")
    >>> query.await_termination()
    True
    >>> out = mb.table("doc_generate")
    >>> out.columns
    ['event_id', 'card_id', 'merchant', 'amount', 'event_time']
    >>> out.height, out["event_id"].is_sorted()
    (1000, True)
    >>> [p["input_rows"] for p in query.recent_progress]
    [400, 400, 200]
    >>> out.head(3).select("event_id", "card_id", "merchant", "amount").rows()
    [(0, 26, 'm-0458', 15.23), (1, 4539, 'm-0482', 41.04), (2, 0, 'm-0360', 6.6)]
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
            event_rate=event_rate,
        )
    )


def table(name: str) -> pl.DataFrame:
    """The current contents of the memory sink ``name`` (``write_memory(name)``).

    The query's output mode decides what is returned: ``append``, every batch's
    rows in batch order; ``complete``, the latest batch (the whole result);
    ``update``, one row per key, the newest version of each. A table is kept
    per process, so a query restarted on the same checkpoint finds its earlier
    batches.

    Parameters
    ----------
    name
        The name given to ``write_memory``.

    Returns
    -------
    polars.DataFrame
        A copy: later batches do not change it. Before the first batch, an
        empty frame (with the table's schema when known).

    Raises
    ------
    sinks.memory.UnknownTableError
        When no query wrote a table of that name in this process.

    Examples
    --------
    >>> stream = mb.read_memory(
    ...     pl.DataFrame({"k": ["a", "b", "a"], "x": [1, 2, 3]}), max_records_per_batch=2
    ... )
    >>> query = (
    ...     stream.group_by("k")
    ...     .agg(pl.col("x").sum())
    ...     .write_memory("doc_table", output_mode="update")
    ...     .start(trigger="available-now")
    ... )
    >>> query.await_termination()
    True
    >>> mb.table("doc_table").rows()
    [('a', 4), ('b', 2)]
    """
    from sinks.memory import memory_table

    return memory_table(name)


def parquet_table(path: str | os.PathLike[str]) -> pl.DataFrame:
    """The rows of every committed batch of a ``write_parquet`` output, as a DataFrame.

    Reads the output's manifest, so files of a batch that was written but not
    committed (a crash in the middle) are never seen. Like :func:`table` (the
    memory sink), it returns rows; the ``read_*`` functions return streams.

    Parameters
    ----------
    path
        The directory given to ``write_parquet``.

    Returns
    -------
    polars.DataFrame
        The batches' rows in batch order; hive partition columns (from
        ``partition_by``) are restored with their types.

    Examples
    --------
    >>> import tempfile
    >>> out = tempfile.mkdtemp()
    >>> query = (
    ...     mb.read_memory(pl.DataFrame({"x": [1, 2, 3]}))
    ...     .write_parquet(out)
    ...     .start(trigger="available-now")
    ... )
    >>> query.await_termination()
    True
    >>> mb.parquet_table(out)["x"].to_list()
    [1, 2, 3]
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
