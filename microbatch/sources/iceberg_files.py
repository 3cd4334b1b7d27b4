"""The pieces of an Iceberg table's log that any process can use by itself:
positions in the snapshot lineage (the source's offsets), the data files a
snapshot added, and reading them by field id.

See :mod:`microbatch.sources.iceberg` for the source built on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from microbatch.exceptions import SourceError
from microbatch.sources.base import ReadSplit, SourceBatch

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.table.snapshots import Snapshot


# --------------------------------------------------------------------------- positions


@dataclass(frozen=True, order=False)
class Position:
    """A parsed offset (see the module docstring)."""

    snapshot_id: int | None
    sequence_number: int
    timestamp_ms: int
    index: int | None = None

    def to_offset(self) -> dict[str, Any]:
        """The JSON offset recorded in ``offsets/N``."""
        return {"snapshot_id": self.snapshot_id, "sequence_number": self.sequence_number,
                "timestamp_ms": self.timestamp_ms, "index": self.index}

    @property
    def key(self) -> tuple[int, int, float]:
        """Order along one lineage: sequence number (timestamp for format v1
        tables, whose snapshots all have sequence number 0), then files read."""
        return (self.sequence_number, self.timestamp_ms,
                float("inf") if self.index is None else self.index)


BEFORE_FIRST = Position(None, -1, -1)
"""Before the table's first snapshot: nothing read yet."""


def after(snapshot: Snapshot) -> Position:
    """Everything ``snapshot`` and its ancestors added has been read."""
    return Position(snapshot.snapshot_id, snapshot.sequence_number or 0, snapshot.timestamp_ms)


def before(snapshot: Snapshot) -> Position:
    """Its ancestors have been read, none of the files ``snapshot`` added."""
    return Position(snapshot.snapshot_id, snapshot.sequence_number or 0, snapshot.timestamp_ms,
                    0)


def parse_position(offset: Any, where: str) -> Position:
    """The :class:`Position` of a recorded offset; :class:`SourceError` when it is
    not one this source writes."""
    if isinstance(offset, dict) and {"snapshot_id", "sequence_number", "timestamp_ms",
                                     "index"} <= offset.keys():
        sid, seq, ts, index = (offset["snapshot_id"], offset["sequence_number"],
                               offset["timestamp_ms"], offset["index"])
        if (sid is None or isinstance(sid, int)) and isinstance(seq, int) \
                and isinstance(ts, int) and (index is None or (isinstance(index, int)
                                                               and index >= 0)):
            return Position(sid, seq, ts, index)
    raise SourceError(
        f"Iceberg source {where}: offset {offset!r} is not a {{'snapshot_id', "
        "'sequence_number', 'timestamp_ms', 'index'}} position; was the checkpoint written "
        "by another kind of source?"
    )


# --------------------------------------------------------------------------- files


@dataclass(frozen=True)
class IcebergFile:
    """One data file added by a snapshot."""

    data_file: DataFile
    """PyIceberg's manifest record of the file (path, format, partition, counts)."""

    @property
    def path(self) -> str:
        return str(self.data_file.file_path)

    @property
    def size(self) -> int:
        return int(self.data_file.file_size_in_bytes or 0)

    @property
    def rows(self) -> int:
        """``record_count`` from the manifest (always written by Iceberg writers)."""
        return int(self.data_file.record_count or 0)


def added_files(snapshot: Snapshot, io: FileIO) -> tuple[IcebergFile, ...]:
    """The data files ``snapshot`` added, in manifest order (a function of the
    snapshot's immutable manifest list: the same tuple on every call)."""
    from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntryStatus

    out: list[IcebergFile] = []
    sid = snapshot.snapshot_id
    for manifest in snapshot.manifests(io):
        # NOTE: only the manifests this snapshot wrote can hold its ADDED entries
        if manifest.content != ManifestContent.DATA or manifest.added_snapshot_id != sid:
            continue
        for entry in manifest.fetch_manifest_entry(io, discard_deleted=True):
            if (entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == sid
                    and entry.data_file.content == DataFileContent.DATA):
                out.append(IcebergFile(entry.data_file))
    return tuple(out)


def read_data_files(
    metadata: TableMetadata, io: FileIO, files: Sequence[IcebergFile], schema_id: int | None,
    schema: pl.Schema,
) -> pl.DataFrame:
    """The rows of ``files``, in order, projected by field id on the table schema
    ``schema_id`` and cast to ``schema`` (its Polars form). One Arrow read of all
    files, no per-row Python."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.table import FileScanTask

    if not files:
        return schema.to_frame()
    iceberg_schema = metadata.schema_by_id(schema_id) if schema_id is not None else None
    arrow = ArrowScan(metadata, io, iceberg_schema or metadata.schema(), AlwaysTrue()).to_table(
        [FileScanTask(f.data_file) for f in files])
    frame = pl.from_arrow(arrow)
    assert isinstance(frame, pl.DataFrame)
    return frame.select([pl.col(n).cast(t) for n, t in schema.items()])


def polars_schema(metadata: TableMetadata, schema_id: int | None) -> pl.Schema:
    """The Polars schema of the table schema ``schema_id`` (the current one when
    ``None`` or unknown)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    iceberg_schema = metadata.schema_by_id(schema_id) if schema_id is not None else None
    arrow = schema_to_pyarrow(iceberg_schema or metadata.schema(), include_field_ids=False)
    return pl.DataFrame(arrow.empty_table()).schema


@dataclass(frozen=True)
class IcebergSplit(ReadSplit):
    """A contiguous run of a batch's data files, read where it is sent from the
    table's metadata file as the driver saw it (metadata files are never
    rewritten): the same rows and columns as the driver's read of them."""

    metadata_location: str
    io_properties: dict[str, str]
    files: tuple[IcebergFile, ...]
    schema_id: int | None
    schema: pl.Schema

    def read(self) -> SourceBatch:
        from pyiceberg.table import StaticTable

        static = StaticTable.from_metadata(self.metadata_location, self.io_properties)
        return SourceBatch(read_data_files(static.metadata, static.io, self.files,
                                           self.schema_id, self.schema))

    @property
    def size_hint(self) -> int:
        return sum(f.size for f in self.files)
