"""Update mode's copy-on-write, vectorized: a batch's keys replaced in one snapshot.

For a batch that upserts rows and deletes keys (``touched``: every key it
upserts or deletes), staged in the caller's transaction:

1. candidate files: PyIceberg's scan planning on the transaction's view with
   :func:`sinks.iceberg_filters.candidate_filter` (a few range terms; it
   cannot miss a file holding a touched key);
2. each candidate is read (PyIceberg's Arrow reader: columns by field id, the
   transaction's schema, positional deletes applied) and anti-joined with the
   touched keys in Polars (null keys match nulls). A file without a touched
   row is left alone; otherwise it is removed and its kept rows are written
   as new data files (the table's partition spec puts them back in their
   partitions);
3. one snapshot with the batch's summary properties: an ``overwrite``
   removing those files and adding the rewritten ones plus the upserts, or an
   ``append`` when no file was touched. Nothing at all when there is nothing
   to remove or add.

Files are written through the table's FileIO (the durable one on a local
warehouse: :mod:`sinks.iceberg_io`); nothing is visible until the caller
commits the transaction.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import polars as pl

from sinks.iceberg_filters import candidate_filter
from sinks.iceberg_internals import check_arrow_schema, write_data_files

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.io import FileIO
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import FileScanTask, Transaction
    from pyiceberg.table.metadata import TableMetadata

__all__ = ["stage_upsert"]


def stage_upsert(
    tx: Transaction, io: FileIO, upserts: pa.Table, touched: pl.DataFrame, *,
    keys: Sequence[str], summary: dict[str, str],
) -> None:
    """Stage in ``tx`` one snapshot (with ``summary``) in which no row of a
    ``touched`` key is left from before and ``upserts`` are added; files are
    written through ``io``, nothing is committed."""
    import pyarrow as pa

    metadata = tx.table_metadata  # NOTE: once: each access copies the whole metadata
    if upserts.num_rows:
        check_arrow_schema(metadata, upserts.schema)
    touched = touched.select(keys).unique()
    removed: list[DataFile] = []
    kept: list[pa.Table] = []
    reader = _reader(metadata, io)
    for task in _candidates(metadata, io, touched, keys):
        left = _without_keys(reader.to_table(tasks=[task]), touched, keys)
        if left is not None:
            removed.append(task.file)
            kept.append(left)
    if not removed and not upserts.num_rows:
        return
    producer = tx.update_snapshot(snapshot_properties=summary)
    with (producer.overwrite() if removed else producer.fast_append()) as snapshot:
        counter = itertools.count(0)
        for data_file in removed:
            snapshot.delete_data_file(data_file)
        # NOTE: the kept rows of all files in one write: files and partitioning
        # are paid per write, not per removed file. The reader gives every file
        # the table's schema; "permissive" unifies string/large_string and the
        # like when files were written by different writers
        rows_of = [pa.concat_tables(kept, promote_options="permissive")] if kept else []
        for rows in (*rows_of, upserts):
            if rows.num_rows:
                for data_file in write_data_files(metadata, io, rows, snapshot.commit_uuid,
                                                  counter):
                    snapshot.append_data_file(data_file)


def _candidates(
    metadata: TableMetadata, io: FileIO, touched: pl.DataFrame, keys: Sequence[str]
) -> list[FileScanTask]:
    """The data files of the current snapshot that may hold a touched key."""
    from pyiceberg.table import DataScan

    if touched.height == 0 or metadata.current_snapshot() is None:
        return []
    scan = DataScan(table_metadata=metadata, io=io, row_filter=candidate_filter(touched, keys))
    return list(scan.plan_files())


def _reader(metadata: TableMetadata, io: FileIO) -> ArrowScan:
    """A reader of all rows of a file in the current schema (columns by field id,
    positional deletes applied)."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan

    return ArrowScan(table_metadata=metadata, io=io, projected_schema=metadata.schema(),
                     row_filter=AlwaysTrue())


def _without_keys(rows: pa.Table, touched: pl.DataFrame, keys: Sequence[str]) -> pa.Table | None:
    """``rows`` without those of a touched key (null matching null), or ``None``
    when no row has a touched key (the file stays as it is)."""
    frame = pl.from_arrow(rows.select(list(keys)))
    assert isinstance(frame, pl.DataFrame)
    probe = touched.cast({k: frame.schema[k] for k in keys})
    kept = (frame.with_row_index("__row").join(probe, on=list(keys), how="anti", nulls_equal=True)
            .get_column("__row"))
    if kept.len() == rows.num_rows:
        return None
    return rows.take(kept.to_arrow())
