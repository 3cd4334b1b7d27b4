"""Delta data files written by workers, committed by the driver.

A query on Ray workers may let each worker write its shards' output rows as
Parquet files in the table's directory (:class:`DeltaWriteTask`, sent to the
workers by :meth:`sinks.delta.DeltaSink.distributed_writer`); the driver then
commits all of a batch's files as one table version carrying the app
transaction ``(query id, batch id)`` (:meth:`sinks.delta.DeltaSink.commit_written`,
through delta-rs's ``create_write_transaction``). Each file's add action carries
its statistics (:func:`delta_stats`), which readers use to skip files.

File names are new for every attempt (a UUID): a worker that is lost and
re-runs its shard, or a replay of a batch already committed, writes new files
and never touches a committed one. Files never committed stay in the table's
directory unreferenced, as a crashed ``write_deltalake`` leaves them: readers
never see them, and a full ``VACUUM`` removes them once older than its retention
(delta-rs: ``vacuum(..., full=True)``; its default "lite" mode only deletes files
the log removed).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import polars as pl
from polars.datatypes import DataTypeClass

from sinks.base import OutputMode, WriteTask, WrittenFile
from sinks.casts import cast_columns
from sinks.changes import changelog_rows
from sinks.exceptions import SinkError
from statestore.durable import fsync_dir, make_dirs, write_atomic

__all__ = [
    "DEFAULT_INDEXED_COLUMNS",
    "DeltaWriteTask",
    "delta_frame",
    "delta_stats",
    "partition_text",
    "partitions_supported",
]

DEFAULT_INDEXED_COLUMNS = 32
"""Delta's ``delta.dataSkippingNumIndexedCols`` default: statistics for the first 32 columns."""
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_STRING_PREFIX = 64
"""A string minimum is cut to its first 64 characters (still a lower bound, as
delta-rs writes it); a longer maximum is left out (a cut one is no upper bound)."""


_UNSIGNED: dict[type[pl.DataType], pl.DataType] = {
    pl.UInt8: pl.Int16(),
    pl.UInt16: pl.Int32(),
    pl.UInt32: pl.Int64(),
    pl.UInt64: pl.Int64(),
}
"""Delta has no unsigned integers: each is widened to the signed type that holds it."""


def delta_frame(df: pl.DataFrame, *, batch_id: int, uri: str) -> pl.DataFrame:
    """``df`` with types Delta can store.

    Unsigned integers widen to the next signed type (``UInt64`` to ``Int64``,
    refusing values above 2**63-1), categoricals become strings, datetimes
    become microseconds (Delta's precision). Types Delta has no counterpart
    for (durations, times, objects, untyped nulls) raise :class:`SinkError`
    naming the column.
    """
    casts: dict[str, pl.DataType] = {}
    for name, dtype in df.schema.items():
        target = _delta_dtype(dtype, name, batch_id, uri)
        if target != dtype:
            casts[name] = target
    return cast_columns(df, casts, where=f"Delta table {uri}: batch {batch_id}", fmt="Delta")


def _delta_dtype(
    dtype: pl.DataType | DataTypeClass, name: str, batch_id: int, uri: str
) -> pl.DataType:
    if isinstance(dtype, DataTypeClass):  # nested types may hold classes, not instances
        return _delta_dtype(dtype(), name, batch_id, uri)
    base = dtype.base_type()
    if base in _UNSIGNED:
        return _UNSIGNED[base]
    if base in (pl.Categorical, pl.Enum):
        return pl.String()
    if isinstance(dtype, pl.Datetime):
        return pl.Datetime("us", dtype.time_zone and "UTC")
    if isinstance(dtype, pl.List | pl.Array):
        return pl.List(_delta_dtype(dtype.inner, name, batch_id, uri))
    if isinstance(dtype, pl.Struct):
        return pl.Struct(
            [pl.Field(f.name, _delta_dtype(f.dtype, name, batch_id, uri)) for f in dtype.fields]
        )
    if base in (pl.Duration, pl.Time, pl.Object, pl.Null):
        raise SinkError(
            f"Delta table {uri}: batch {batch_id} column {name!r} has type {dtype}, which "
            "Delta cannot store; cast it (e.g. a duration to Int64 microseconds, a time to "
            "a string) before write_delta"
        )
    return dtype


def delta_stats(df: pl.DataFrame, *, indexed_columns: int = DEFAULT_INDEXED_COLUMNS) -> str:
    """The ``stats`` JSON of a Delta add action for a file holding ``df``.

    ``numRecords``; ``nullCount`` and, when the column has a value,
    ``minValues``/``maxValues`` for the first ``indexed_columns`` columns of
    the types readers skip on (numbers, strings, booleans, dates, timestamps);
    no statistics for nested and binary columns (allowed: a reader then reads
    the file). Every bound holds: NaN is ignored as delta-rs does, a timestamp
    minimum is floored and a maximum ceiled to milliseconds (Delta's
    precision), a float column holding an infinity gets no bounds. One
    vectorized pass over the frame."""
    columns = [c for c, t in list(df.schema.items())[:max(indexed_columns, 0)] if _kind(t)]
    if not columns or df.height == 0:
        return json.dumps({"numRecords": df.height, "minValues": {}, "maxValues": {},
                           "nullCount": dict.fromkeys(columns, 0)}, separators=(",", ":"))
    exprs: list[pl.Expr] = []
    for name in columns:
        col = pl.col(name)
        kind = _kind(df.schema[name])
        values = col.filter(col.is_not_nan()) if kind == "float" else col
        exprs += [
            col.null_count().alias(f"n:{name}"),
            values.min().alias(f"lo:{name}"),
            values.max().alias(f"hi:{name}"),
        ]
        if kind == "float":
            exprs.append(col.is_infinite().any().alias(f"inf:{name}"))
        if kind == "string":
            exprs.append(col.str.len_chars().max().alias(f"len:{name}"))
    row = df.select(exprs).row(0, named=True)
    lows: dict[str, Any] = {}
    highs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name in columns:
        dtype = df.schema[name]
        kind = _kind(dtype)
        nulls[name] = int(row[f"n:{name}"])
        low, high = row[f"lo:{name}"], row[f"hi:{name}"]
        if low is None or (kind == "float" and row[f"inf:{name}"]):
            continue
        if kind == "string":
            lows[name] = low[:_STRING_PREFIX]
            if row[f"len:{name}"] <= _STRING_PREFIX:
                highs[name] = high
        elif kind == "datetime":
            assert isinstance(dtype, pl.Datetime)
            lows[name] = _timestamp(low, dtype, ceil=False)
            highs[name] = _timestamp(high, dtype, ceil=True)
        elif kind == "date":
            lows[name], highs[name] = low.isoformat(), high.isoformat()
        elif kind == "decimal":
            lows[name], highs[name] = float(low), float(high)
        else:
            lows[name], highs[name] = low, high
    return json.dumps({"numRecords": df.height, "minValues": lows, "maxValues": highs,
                       "nullCount": nulls}, separators=(",", ":"), allow_nan=False)


def _kind(dtype: Any) -> str | None:
    if dtype.is_integer():
        return "int"
    if dtype.is_float():
        return "float"
    if isinstance(dtype, pl.Decimal):
        return "decimal"
    if dtype in (pl.String, pl.Boolean, pl.Date):
        return {pl.String: "string", pl.Boolean: "bool", pl.Date: "date"}[dtype.base_type()]
    if isinstance(dtype, pl.Datetime):
        return "datetime"
    return None


def _timestamp(value: Any, dtype: pl.Datetime, *, ceil: bool) -> str:
    """A timestamp bound at millisecond precision, as Delta's stats write it."""
    micros = value.microsecond % 1000
    if micros and ceil:
        value = value + timedelta(microseconds=1000 - micros)
    elif micros:
        value = value.replace(microsecond=value.microsecond - micros)
    millis = f".{value.microsecond // 1000:03d}" if value.microsecond else ""
    if dtype.time_zone is None:
        return f"{value:%Y-%m-%d %H:%M:%S}{millis}"
    return f"{value:%Y-%m-%dT%H:%M:%S}{millis}Z"


@dataclass(frozen=True)
class DeltaWriteTask(WriteTask):
    """Writes a share of one batch's rows as Parquet files in a local Delta table's
    directory, each with its add action's statistics; commits nothing."""

    batch_id: int
    root: str
    """The table's directory (a local path: workers and driver see the same one)."""
    output_mode: OutputMode
    key_columns: tuple[str, ...]
    indexed_columns: int = DEFAULT_INDEXED_COLUMNS
    compression: str = "snappy"
    partition_by: tuple[str, ...] = ()

    def write(self, df: pl.DataFrame, part: int) -> list[WrittenFile]:
        """``df`` as files ``[col=value/...]part-<batch>-<part>-<uuid>.<codec>.parquet``
        (one per partition of a partitioned table, none without rows), written
        and fsynced (their directories too) before it returns."""
        if self.output_mode == "changelog":
            df = changelog_rows(df, self.key_columns,
                                f"Delta table {self.root} batch {self.batch_id}")
        data = delta_frame(df, batch_id=self.batch_id, uri=self.root)
        if data.height == 0:
            return []
        stem = f"part-{self.batch_id:010d}-{part:05d}-{uuid.uuid4().hex}"
        cols = list(self.partition_by)
        groups: list[tuple[str, dict[str, str | None], pl.DataFrame]]
        if not cols:
            groups = [("", {}, data)]
        else:
            groups = []
            # NOTE: one group per partition value, not per row
            for key, rows in data.partition_by(cols, as_dict=True, maintain_order=True).items():
                values = {c: partition_text(v) for c, v in zip(cols, key, strict=True)}
                directory = "/".join(
                    f"{c}={_HIVE_NULL if t is None else quote(t, safe='')}"
                    for c, t in values.items()
                )
                groups.append((directory + "/", values, rows.drop(cols)))
        root = Path(self.root)
        out = []
        try:
            dirs: set[Path] = {root}
            for i, (directory, values, rows) in enumerate(groups):
                rel = f"{directory}{stem}-{i:05d}.{self.compression}.parquet"
                target = root / rel
                make_dirs(target.parent)
                buffer = _encode(rows, self.compression)
                write_atomic(target, buffer, sync_dir=False)
                dirs.update(p for p in target.parents if p == root or root in p.parents)
                out.append(WrittenFile(
                    # NOTE: as on disk: delta-rs escapes it into the log's URI form itself
                    path=rel, size=len(buffer), rows=rows.height,
                    partition_values=values,
                    stats=delta_stats(rows, indexed_columns=self.indexed_columns),
                    schema=dict(data.schema),
                    extra={"modification_time": int(time.time() * 1000)},
                ))
            for directory_path in sorted(dirs, key=lambda d: -len(d.parts)):
                fsync_dir(directory_path)
        except (OSError, pl.exceptions.PolarsError) as exc:
            raise SinkError(
                f"cannot write a data file of batch {self.batch_id} in Delta table "
                f"{self.root}: {exc}. Nothing was committed; the batch is re-run."
            ) from exc
        return out


PARTITION_TYPES = ("string", "int", "bool", "date", "datetime")
"""Partition column kinds whose Delta text workers write (others: the driver writes)."""


def partition_text(value: Any) -> str | None:
    """A partition value as Delta's ``partitionValues`` hold it (delta-rs's form:
    ``true``, ``2026-01-01``, ``2026-01-01 01:02:03.004000`` in UTC)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        utc = value if value.tzinfo is None else value.astimezone(UTC).replace(tzinfo=None)
        return f"{utc:%Y-%m-%d %H:%M:%S.%f}"
    if isinstance(value, date):
        return value.isoformat()
    return str(value)


def partitions_supported(schema: Mapping[str, Any], columns: Sequence[str]) -> bool:
    """Every partition column is of a kind :func:`partition_text` writes."""
    return all(_kind(schema[c]) in PARTITION_TYPES for c in columns if c in schema) and all(
        c in schema for c in columns)


def _encode(data: pl.DataFrame, compression: str) -> memoryview:
    import io

    buffer = io.BytesIO()
    data.write_parquet(buffer, compression=compression, statistics=True)  # type: ignore[arg-type]
    return buffer.getbuffer()


def indexed_columns_of(configuration: dict[str, str | None]) -> int | None:
    """The table's ``delta.dataSkippingNumIndexedCols`` (``None``: a setting this
    writer does not follow, ``delta.dataSkippingStatsColumns``: the driver writes)."""
    if configuration.get("delta.dataSkippingStatsColumns"):
        return None
    text = configuration.get("delta.dataSkippingNumIndexedCols")
    if text is None:
        return DEFAULT_INDEXED_COLUMNS
    try:
        value = int(text)
    except ValueError:
        return None
    if value == -1:  # Delta's "every column"
        return 2**31 - 1
    return value if value >= 0 else None


def add_actions(files: Sequence[WrittenFile]) -> list[Any]:
    """delta-rs add actions for ``files`` (data changes, with their statistics)."""
    from deltalake.transaction import AddAction

    return [
        AddAction(
            path=f.path, size=f.size, partition_values=dict(f.partition_values),
            modification_time=int(f.extra.get("modification_time", 0)), data_change=True,
            stats=f.stats or json.dumps({"numRecords": f.rows}),
        )
        for f in files
    ]

