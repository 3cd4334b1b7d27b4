"""Parquet files in a directory, exactly once per batch through a manifest.

Layout of an output directory::

    out/
      part-0000000007-00000.parquet       # batch 7, file 0
      country=FR/part-0000000008-00000.parquet   # with partition_by=["country"]
      _manifest/7.json                    # the commit record of batch 7

Protocol for batch ``N`` (NOTE: the order is what makes it exactly-once):

1. If ``_manifest/N.json`` exists, batch ``N`` is committed: return.
2. Write each data file under a hidden temp name, fsync it, rename it to its
   deterministic name ``part-{N:010d}-{i:05d}.parquet``, fsync the directories.
   Each file is encoded in memory first and written with one ``write``.
3. ``ctx.at("sink.after_data", N)``.
4. Write ``_manifest/N.json`` atomically (temp, fsync, rename, fsync dir):
   the files, their row counts and sizes, inside a checksummed envelope.

The manifest entry is the commit point. Readers (:func:`read_parquet_output`,
:func:`committed_files`) read only listed files, so they never see a batch
that is half written. A crash before step 4 leaves unlisted files that are
invisible, and the replay of ``N`` overwrites them under the same names.

On Ray workers (:meth:`ParquetSink.distributed_writer`), each worker writes
its shards' files itself in step 2, named
``part-{N:010d}-{shard:05d}-{uuid}-{i:05d}.parquet`` (new names for every
attempt: a re-run never touches a committed file), and the driver writes the
manifest entry (steps 1, 3 and 4) from their descriptions. Files of an attempt
that is never committed stay unlisted.

One output directory belongs to one query: :meth:`ParquetSink.open` refuses a
directory whose manifest was written by another query id, since that query's
batch ids would silently turn this query's batches into no-ops.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import quote

import polars as pl

from sinks.base import (
    BatchContext,
    OutputMode,
    Sink,
    SinkContext,
    WriteTask,
    WrittenBatch,
    WrittenFile,
)
from sinks.changes import changelog_rows
from sinks.exceptions import SinkConfigError, SinkError
from statestore.durable import fsync_dir, make_dirs, write_atomic

ParquetCompression = Literal["lz4", "uncompressed", "snappy", "gzip", "brotli", "zstd"]

MANIFEST_DIR = "_manifest"
FORMAT_VERSION = 1
_KIND = "parquet-sink-manifest"
_ENTRY_NAME = re.compile(r"^(\d+)\.json$")
_FILE_COL = "__microbatch_file__"
_KEY_PREFIX = "__microbatch_part_"
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_COMPRESSIONS = frozenset(get_args(ParquetCompression))


class ParquetSink(Sink):
    """Appends each batch as Parquet files under ``path``, exactly once per batch id.

    Only the ``append`` and ``changelog`` output modes are supported: files
    cannot be updated in place. ``changelog`` appends the change rows,
    ``_change_type`` included (a batch without it: see
    :func:`sinks.changes.changelog_rows`). Use the memory sink, or a Delta
    sink (merge), for ``update`` and ``complete``. All batches keep the
    columns and types of the first batch with rows: a batch that differs
    (schema drift) is refused with a :class:`SinkError` naming the change,
    before anything is written.

    Parameters
    ----------
    path
        The output directory; created when missing.
    compression
        The Parquet compression codec of the data files.
    partition_by
        Column(s) to lay out hive-style (``col=value/`` directories). The
        columns are stored in the paths, not in the files, as Hive and Spark
        do; :func:`read_parquet_output` restores them with their exact types.
    """

    supported_modes: tuple[OutputMode, ...] = ("append", "changelog")
    mode_advice = (
        "Parquet files cannot be updated in place: use write_memory for update/complete "
        "results, write_delta (merge) to keep an upserted table, or output_mode='changelog' "
        "to append the result's changes."
    )

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        compression: ParquetCompression = "zstd",
        partition_by: str | Sequence[str] | None = None,
    ) -> None:
        if compression not in _COMPRESSIONS:
            raise SinkConfigError(
                f"unknown Parquet compression {compression!r}; use one of {sorted(_COMPRESSIONS)}"
            )
        columns = (partition_by,) if isinstance(partition_by, str) else tuple(partition_by or ())
        if len(set(columns)) != len(columns):
            raise SinkConfigError(f"partition_by names a column twice: {list(columns)}")
        self.path = Path(path)
        self.compression: ParquetCompression = compression
        self.partition_by: tuple[str, ...] = columns
        self._root = self.path.absolute()
        self._schema: dict[str, pl.DataType] | None = None
        """Columns of the last committed batch with rows: every batch keeps them."""
        self._schema_cache: tuple[tuple[tuple[str, pl.DataType], ...], str] | None = None

    @property
    def label(self) -> str:
        return f"ParquetSink({str(self.path)!r})"

    def on_open(self, ctx: SinkContext) -> None:
        """Check that the directory belongs to this query; learn its schema."""
        if self._root.exists() and not self._root.is_dir():
            raise SinkConfigError(f"Parquet output path {self._root} exists and is not a directory")
        make_dirs(self._root / MANIFEST_DIR)
        fsync_dir(self._root.parent)  # make the directories themselves durable
        fsync_dir(self._root)
        entries = _entry_paths(self._root)
        if entries:
            latest = _read_entry(entries[-1][1], entries[-1][0])
            if latest["query_id"] != ctx.query_id:
                raise SinkConfigError(
                    f"Parquet output directory {self._root} holds batches up to "
                    f"{entries[-1][0]} written by query {latest['query_id']}, and this is "
                    f"query {ctx.query_id}. One output directory belongs to one query: resume "
                    "with that query's checkpoint, or write to a new directory."
                )
            if tuple(latest["partition_by"]) != self.partition_by:
                raise SinkConfigError(
                    f"Parquet output directory {self._root} is partitioned by "
                    f"{latest['partition_by']}, not {list(self.partition_by)}; keep the "
                    "partitioning of an existing output, or write to a new directory."
                )
        self._schema = _data_schema(entries)

    def is_written(self, batch: BatchContext) -> bool:
        """The manifest has the batch's entry (a valid one: a corrupt commit record
        must not pass silently)."""
        entry = _entry_path(self._root, batch.batch_id)
        if not entry.exists():
            return False
        _read_entry(entry, batch.batch_id)
        return True

    def write(self, batch: BatchContext, df: pl.DataFrame) -> None:
        """Write the batch's data files, then commit them in the manifest."""
        batch_id = batch.batch_id
        if batch.output_mode == "changelog":
            df = changelog_rows(df, batch.key_columns, f"{self.label} batch {batch_id}")
        if df.height and self._schema is not None and dict(df.schema) != self._schema:
            raise SinkError(
                f"batch {batch_id} does not fit the Parquet output {self._root}: "
                f"{_schema_change(self._schema, dict(df.schema))}. The files of one output "
                "share one schema, or they cannot be read together; nothing was written. "
                "Pin the stream's columns and types (read_files(..., schema=...), select, "
                "cast), or write to a new directory."
            )
        try:
            files, partitions = self._write_data(batch_id, df)
        except (OSError, pl.exceptions.PolarsError) as exc:
            raise SinkError(
                f"cannot write the data files of batch {batch_id} under {self._root}: {exc}"
            ) from exc
        batch.at("sink.after_data")
        self._commit_manifest(batch, files, partitions, df.clear(), df.height)

    def distributed_writer(self, batch_id: int) -> WriteTask | None:
        """Workers write the batch's data files, the driver the manifest entry
        (:meth:`commit_written`); every mode this sink supports."""
        ctx = self.context
        return ParquetWriteTask(
            batch_id=batch_id, root=str(self._root), compression=self.compression,
            partition_by=self.partition_by, output_mode=ctx.output_mode,
            key_columns=ctx.key_columns, schema=self._schema,
        )

    def commit_files(self, batch_id: int, written: WrittenBatch) -> None:
        """Commit the workers' files of ``batch_id`` once (:meth:`Sink.commit_files`),
        then delete the files earlier attempts of the batch left (a lost worker's,
        a crashed driver's): the directory holds only listed files again, as with
        the driver's own writes, whose replay overwrites the same names."""
        super().commit_files(batch_id, written)
        self._sweep_attempts(batch_id, written)

    def _sweep_attempts(self, batch_id: int, written: WrittenBatch) -> None:
        """Unlink worker-named files of ``batch_id`` that its manifest entry does
        not list, in the directories the batch's files went to (a re-run writes
        the same rows, so an earlier attempt wrote to the same partitions)."""
        listed = {str(f["path"]) for f in _read_entry(
            _entry_path(self._root, batch_id), batch_id)["files"]}
        dirs = {self._root} | {(self._root / f.path).parent for f in written.files}
        dirs |= {(self._root / path).parent for path in listed}
        pattern = re.compile(rf"part-{batch_id:010d}-\d{{5}}-[0-9a-f]{{32}}-")
        for directory in dirs:
            try:
                names = os.listdir(directory)
            except FileNotFoundError:
                continue
            for name in names:
                path = directory / name
                if pattern.match(name) and str(path.relative_to(self._root)) not in listed:
                    path.unlink(missing_ok=True)

    def commit_written(self, batch: BatchContext, written: WrittenBatch) -> None:
        """Step 4 for files workers wrote: the manifest entry listing them (the
        schema checked again: the workers checked the one known when the batch
        started)."""
        schema = dict(written.schema or {})
        if written.rows and self._schema is not None and schema != self._schema:
            raise SinkError(
                f"batch {batch.batch_id} does not fit the Parquet output {self._root}: "
                f"{_schema_change(self._schema, schema)}. Nothing was committed (the "
                "workers' files are left unlisted). Pin the stream's columns and types."
            )
        files = [{"path": f.path, "rows": f.rows, "bytes": f.size} for f in written.files]
        values = [_frame_from_text(f.extra["partitions"]) for f in written.files
                  if f.extra.get("partitions") is not None]
        partitions = pl.concat(values, how="vertical") if values else None
        batch.at("sink.after_data")
        self._commit_manifest(batch, files, partitions, pl.DataFrame(schema=schema),
                              written.rows)

    def _commit_manifest(
        self, batch: BatchContext, files: list[dict[str, Any]],
        partitions: pl.DataFrame | None, empty: pl.DataFrame, rows: int,
    ) -> None:
        """Step 4: the manifest entry of ``batch`` (the commit point)."""
        batch_id = batch.batch_id
        entry = _entry_path(self._root, batch_id)
        body: dict[str, Any] = {
            "batch_id": batch_id,
            "query_id": batch.query_id,
            "rows": rows,
            "files": files,
            "partition_by": list(self.partition_by),
            "partitions": _frame_to_text(partitions) if partitions is not None else None,
            "schema": self._schema_text(empty),
        }
        try:
            write_atomic(entry, _encode(body))
        except OSError as exc:
            raise SinkError(
                f"cannot write manifest entry {entry} of batch {batch_id}: {exc}"
            ) from exc
        if rows:
            self._schema = dict(empty.schema)

    def describe(self) -> dict[str, Any]:
        """The sink kind, directory, compression and partition columns."""
        return {
            "kind": type(self).__name__,
            "path": str(self.path),
            "compression": self.compression,
            "partition_by": list(self.partition_by),
        }

    def _schema_text(self, df: pl.DataFrame) -> str:
        """The manifest's encoding of ``df``'s schema, encoded once per schema."""
        schema = tuple(df.schema.items())
        if self._schema_cache is None or self._schema_cache[0] != schema:
            self._schema_cache = (schema, _frame_to_text(df.clear()))
        return self._schema_cache[1]

    def _write_data(
        self, batch_id: int, df: pl.DataFrame, tag: str = ""
    ) -> tuple[list[dict[str, Any]], pl.DataFrame | None]:
        """Write the batch's files; return their manifest records and partition values."""
        encoded, files, partitions = self._encode_data(batch_id, df, tag)
        self._write_files(encoded)
        return files, partitions

    def _encode_data(
        self, batch_id: int, df: pl.DataFrame, tag: str = ""
    ) -> tuple[list[tuple[Path, memoryview]], list[dict[str, Any]], pl.DataFrame | None]:
        """The batch's files encoded in memory (target, bytes), their manifest
        records and partition values."""
        if df.height == 0:
            return [], [], None
        groups, partitions = self._split(batch_id, df, tag)
        encoded = []
        files = []
        for rel, part in groups:
            # NOTE: encoded in memory, then written once: Polars' own file writer
            # costs ~0.5 ms more per file, and the bytes are the same
            buffer = io.BytesIO()
            part.write_parquet(buffer, compression=self.compression, statistics=True)
            data = buffer.getbuffer()
            encoded.append((self._root / rel, data))
            files.append({"path": rel, "rows": part.height, "bytes": len(data)})
        return encoded, files, partitions

    def _write_files(self, encoded: list[tuple[Path, memoryview]]) -> None:
        """Write each file (temp, fsync, rename), then fsync their directories."""
        dirs: set[Path] = set()
        for final, data in encoded:
            if final.parent != self._root:
                make_dirs(final.parent)
            write_atomic(final, data, sync_dir=False)
            dirs.update(p for p in final.parents if p == self._root or self._root in p.parents)
        for directory in sorted(dirs, reverse=True):
            fsync_dir(directory)

    def _split(
        self, batch_id: int, df: pl.DataFrame, tag: str = ""
    ) -> tuple[list[tuple[str, pl.DataFrame]], pl.DataFrame | None]:
        """Relative file names and frames for the batch, plus a frame of the typed
        partition values of each file (``None`` without ``partition_by``)."""
        cols = list(self.partition_by)
        if not cols:
            return [(_file_name(batch_id, 0, tag), df)], None
        missing = [c for c in cols if c not in df.columns]
        if missing:
            raise SinkError(
                f"batch {batch_id} lacks the partition column(s) {missing}; "
                f"its columns are {df.columns}"
            )
        if len(cols) == len(df.columns):
            raise SinkError(f"partition_by {cols} leaves no data columns to write in the files")
        keys = [f"{_KEY_PREFIX}{i}" for i in range(len(cols))]
        try:
            keyed = df.with_columns(
                pl.col(c).cast(pl.String).alias(k) for c, k in zip(cols, keys, strict=True)
            )
        except pl.exceptions.PolarsError as exc:
            raise SinkError(
                f"cannot partition batch {batch_id} by {cols}: the values have no text form ({exc})"
            ) from exc
        parts = keyed.partition_by(keys, as_dict=True, maintain_order=True)
        dirs = {
            key: "/".join(
                f"{quote(c, safe='')}={_hive_value(v)}" for c, v in zip(cols, key, strict=True)
            )
            for key in parts
        }
        # Sorted by path, so the replay of a batch reuses the same file names.
        by_dir = sorted(((dirs[key], part) for key, part in parts.items()), key=lambda x: x[0])
        groups = []
        values = []
        for i, (directory, part) in enumerate(by_dir):
            rel = f"{directory}/{_file_name(batch_id, i, tag)}"
            groups.append((rel, part.drop(keys + cols)))
            values.append(part.select(cols).head(1).with_columns(pl.lit(rel).alias(_FILE_COL)))
        return groups, pl.concat(values, how="vertical")


@dataclass(frozen=True)
class ParquetWriteTask(WriteTask):
    """Writes a share of one batch's rows as Parquet files in a :class:`ParquetSink`
    directory, as the sink's step 2 does (durable, unlisted until the manifest
    entry); commits nothing."""

    batch_id: int
    root: str
    compression: ParquetCompression
    partition_by: tuple[str, ...]
    output_mode: OutputMode
    key_columns: tuple[str, ...]
    schema: dict[str, pl.DataType] | None
    """The output's columns when the batch started (``None``: no batch with rows yet)."""

    def write(self, df: pl.DataFrame, part: int) -> list[WrittenFile]:
        """``df``'s files (one per partition) under names no other attempt uses."""
        sink = ParquetSink(self.root, compression=self.compression,
                           partition_by=self.partition_by)
        where = f"{sink.label} batch {self.batch_id}"
        if self.output_mode == "changelog":
            df = changelog_rows(df, self.key_columns, where)
        if df.height == 0:
            return []
        if self.schema is not None and dict(df.schema) != self.schema:
            raise SinkError(
                f"batch {self.batch_id} does not fit the Parquet output {self.root}: "
                f"{_schema_change(self.schema, dict(df.schema))}. Nothing was committed. "
                "Pin the stream's columns and types (select, cast), or write to a new directory."
            )
        tag = f"{part:05d}-{uuid.uuid4().hex}-"
        try:
            files, partitions = sink._write_data(self.batch_id, df, tag)
        except (OSError, pl.exceptions.PolarsError) as exc:
            raise SinkError(
                f"cannot write the data files of batch {self.batch_id} under {self.root}: {exc}"
            ) from exc
        out = []
        for record in files:
            values = None
            if partitions is not None:
                values = _frame_to_text(partitions.filter(pl.col(_FILE_COL) == record["path"]))
            out.append(WrittenFile(path=record["path"], size=record["bytes"],
                                   rows=record["rows"], schema=dict(df.schema),
                                   extra={"partitions": values}))
        return out


def committed_files(path: str | os.PathLike[str]) -> list[Path]:
    """The data files of every committed batch, in batch order.

    Files left by a crashed, uncommitted attempt are never listed. Raises
    :class:`SinkError` when a manifest entry is corrupt.
    """
    root = Path(path).absolute()
    return [root / f["path"] for _, body in _entries(root) for f in body["files"]]


def read_parquet_output(path: str | os.PathLike[str]) -> pl.DataFrame:
    """Read every committed batch of a :class:`ParquetSink` directory, in batch order.

    Only files listed in the manifest are read, so a half-written batch is
    never visible. An output without batches gives an empty frame (with the
    schema when a batch, even empty, was committed). Raises :class:`SinkError`
    when a manifest entry is corrupt or a listed file is missing or changed.
    """
    root = Path(path).absolute()
    if not root.is_dir():
        raise SinkError(f"Parquet output directory {root} does not exist")
    entries = _entries(root)
    if not entries:
        return pl.DataFrame()
    latest = entries[-1][1]
    schema = _frame_from_text(latest["schema"]).schema
    files: list[str] = []
    for batch_id, body in entries:
        for record in body["files"]:
            file = root / record["path"]
            size = file.stat().st_size if file.is_file() else None
            if size != record["bytes"]:
                state = "missing" if size is None else f"{size} bytes, not {record['bytes']}"
                raise SinkError(
                    f"data file {file} of committed batch {batch_id} is {state}; "
                    "the output directory was changed outside the sink"
                )
            files.append(str(file))
    if not files:
        return pl.DataFrame(schema=schema)
    if not latest["partition_by"]:
        return pl.read_parquet(files, hive_partitioning=False, glob=False)
    mapping = pl.concat(
        [_frame_from_text(body["partitions"]) for _, body in entries if body["files"]],
        how="vertical_relaxed",
    ).with_columns((pl.lit(str(root) + os.sep) + pl.col(_FILE_COL)).alias(_FILE_COL))
    return (
        pl.scan_parquet(files, hive_partitioning=False, glob=False, include_file_paths=_FILE_COL)
        .join(mapping.lazy(), on=_FILE_COL, how="left", maintain_order="left")
        .select(list(schema))
        .collect(engine="in-memory")  # the engine's choice everywhere: see microbatch.frames
    )


# -- manifest entries -------------------------------------------------------------------------


def _file_name(batch_id: int, index: int, tag: str = "") -> str:
    return f"part-{batch_id:010d}-{tag}{index:05d}.parquet"


def _hive_value(value: str | None) -> str:
    # Hive's convention: null (and the empty string, which no path can hold) go to
    # the default partition. The manifest keeps each file's exact values apart.
    return _HIVE_NULL if value is None or value == "" else quote(value, safe="")


def _entry_path(root: Path, batch_id: int) -> Path:
    return root / MANIFEST_DIR / f"{batch_id}.json"


def _entry_paths(root: Path) -> list[tuple[int, Path]]:
    """Committed batch ids and their entry files, ascending (temp files ignored)."""
    directory = root / MANIFEST_DIR
    if not directory.is_dir():
        return []
    found = []
    for name in os.listdir(directory):
        match = _ENTRY_NAME.match(name)
        if match:
            found.append((int(match.group(1)), directory / name))
    return sorted(found)


def _data_schema(entries: list[tuple[int, Path]]) -> dict[str, pl.DataType] | None:
    """The columns of the newest committed batch that has rows (``None``: no such batch)."""
    for batch_id, path in reversed(entries):
        body = _read_entry(path, batch_id)
        if body["rows"]:
            return dict(_frame_from_text(body["schema"]).schema)
    return None


def _schema_change(old: dict[str, pl.DataType], new: dict[str, pl.DataType]) -> str:
    """What differs between two schemas, in words."""
    changes = [f"new column {c!r} ({t})" for c, t in new.items() if c not in old]
    changes += [f"column {c!r} is missing" for c in old if c not in new]
    changes += [
        f"column {c!r} changed type from {old[c]} to {new[c]}"
        for c in old
        if c in new and old[c] != new[c]
    ]
    return "; ".join(changes)


def _entries(root: Path) -> list[tuple[int, dict[str, Any]]]:
    return [(batch_id, _read_entry(file, batch_id)) for batch_id, file in _entry_paths(root)]


def _canonical(body: Any) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _encode(body: dict[str, Any]) -> bytes:
    payload = _canonical(body)
    digest = hashlib.sha256(payload).hexdigest()
    head = f'{{"format":{FORMAT_VERSION},"kind":"{_KIND}","sha256":"{digest}","body":'
    return head.encode() + payload + b"}\n"


def _read_entry(path: Path, batch_id: int) -> dict[str, Any]:
    """Read and verify one manifest entry; :class:`SinkError` naming the file if bad."""
    fix = "Restore it from a backup, or write the output to a new directory."
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise SinkError(f"manifest entry {path} cannot be read as JSON ({exc}). {fix}") from exc
    if not isinstance(doc, dict) or not {"format", "kind", "sha256", "body"} <= doc.keys():
        raise SinkError(f"manifest entry {path} is not a microbatch Parquet manifest entry. {fix}")
    if doc["kind"] != _KIND:
        raise SinkError(f"manifest entry {path} holds a {doc['kind']!r} record. {fix}")
    if not isinstance(doc["format"], int) or doc["format"] > FORMAT_VERSION:
        raise SinkError(
            f"manifest entry {path} has format {doc['format']!r}, newer than the format "
            f"{FORMAT_VERSION} this version reads; upgrade microbatch."
        )
    body = doc["body"]
    if hashlib.sha256(_canonical(body)).hexdigest() != doc["sha256"]:
        raise SinkError(f"manifest entry {path} fails its checksum: it was changed. {fix}")
    if not isinstance(body, dict) or body.get("batch_id") != batch_id:
        raise SinkError(f"manifest entry {path} does not describe batch {batch_id}. {fix}")
    return body


def _frame_to_text(df: pl.DataFrame) -> str:
    """A small frame (a schema, partition values) as base64 Arrow IPC: exact types."""
    buffer = io.BytesIO()
    df.write_ipc(buffer, compression="uncompressed")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _frame_from_text(text: str) -> pl.DataFrame:
    return pl.read_ipc(io.BytesIO(base64.b64decode(text)))


# -- durable file operations ------------------------------------------------------------------


