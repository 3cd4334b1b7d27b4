"""Helpers shared by the Iceberg tests: data factories and snapshot writers
(PyIceberg directly, as an upstream writer would)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl
import pyarrow as pa

SCHEMA = pa.schema([("event_id", pa.int64()), ("card_id", pa.int64()),
                    ("amount", pa.float64()), ("event_time", pa.timestamp("us", tz="UTC"))])


def events(start_id: int, n: int, *, minutes_per_row: int = 7) -> pa.Table:
    """Card transactions with increasing event times (one row every few minutes)."""
    base = datetime(2026, 1, 1, tzinfo=UTC)
    ids = list(range(start_id, start_id + n))
    return pa.table({
        "event_id": pa.array(ids, pa.int64()),
        "card_id": pa.array([i % 7 for i in ids], pa.int64()),
        "amount": pa.array([round((i * 37 % 1000) / 10, 2) for i in ids], pa.float64()),
        "event_time": pa.array([base + timedelta(minutes=minutes_per_row * i) for i in ids],
                               pa.timestamp("us", tz="UTC")),
    }, schema=SCHEMA)


def new_table(catalog_uri: str, name: str = "db.events") -> Any:
    """An empty table of :data:`SCHEMA` in the catalog."""
    from sinks.iceberg_catalog import resolve_catalog

    return resolve_catalog(catalog_uri).create_table(name, schema=SCHEMA)


def append_snapshots(table: Any, sizes: list[int], start_id: int = 0) -> int:
    """One append snapshot per size, ids consecutive from ``start_id``; the next id."""
    for n in sizes:
        table.append(events(start_id, n))
        start_id += n
    return start_id


def whole_table(table: Any) -> pl.DataFrame:
    """The table's current rows, read in one shot (the oracle)."""
    table = table.refresh()
    frame = pl.from_arrow(table.scan().to_arrow())
    assert isinstance(frame, pl.DataFrame)
    return frame


def compact(table: Any) -> None:
    """Rewrite every data file into one: a ``replace`` snapshot with the same rows
    (what ``rewrite_data_files`` commits; PyIceberg 0.12 has no compaction of its
    own, so its overwrite producer is told to record ``replace``)."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files
    from pyiceberg.table.snapshots import Operation, Summary
    from pyiceberg.table.update.snapshot import _OverwriteFiles

    class Rewrite(_OverwriteFiles):
        def _summary(self, snapshot_properties: Any = None) -> Summary:
            self._operation = Operation.OVERWRITE  # PyIceberg summarises overwrites only
            summary = super()._summary(snapshot_properties or {})
            self._operation = Operation.REPLACE
            return Summary(Operation.REPLACE, **summary.additional_properties)

    table = table.refresh()
    rows = table.scan().to_arrow()
    old = [task.file for task in table.scan().plan_files()]
    with table.transaction() as tx:
        producer = Rewrite(operation=Operation.REPLACE, transaction=tx, io=table.io)
        for data_file in old:
            producer.delete_data_file(data_file)
        for data_file in _dataframe_to_data_files(tx.table_metadata, rows, table.io):
            producer.append_data_file(data_file)
        producer.commit()
