"""Helpers shared by the Iceberg tests: data factories and snapshot writers
(PyIceberg directly, as an upstream writer would), and reading tables back with
PyIceberg and with DuckDB."""

from __future__ import annotations

import importlib.util
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
from pyiceberg.table import Table

from sinks.iceberg_catalog import CatalogSpec, load_iceberg_table, resolve_catalog

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



def duckdb_extensions() -> Path:
    """The pinned DuckDB extension wheels' directory (no download)."""
    spec = importlib.util.find_spec("duckdb_ext")
    assert spec is not None
    assert spec.submodule_search_locations is not None
    root = Path(next(iter(spec.submodule_search_locations)))
    return root / "extensions" / f"v{duckdb.__version__}" / "linux_amd64"


def table_of(catalog: CatalogSpec, name: str, **options: str) -> Table:
    """The table ``name`` of ``catalog`` (it must exist)."""
    table = load_iceberg_table(resolve_catalog(catalog, storage_options=options or None), name)
    assert table is not None, f"no table {name} in {catalog}"
    return table


def scan(table: Table) -> pl.DataFrame:
    """Every row, as PyIceberg reads them."""
    frame = pl.from_arrow(table.scan().to_arrow())
    assert isinstance(frame, pl.DataFrame)
    return frame


def duckdb_scan(table: Table | Path) -> pl.DataFrame:
    """Every row, as DuckDB's ``iceberg_scan`` reads the table's current metadata
    file, or (a directory) the one its ``metadata/version-hint.text`` names."""
    where = str(table) if isinstance(table, Path) else table.metadata_location
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    try:
        for ext in ("avro", "iceberg"):  # NOTE: avro first: iceberg needs it loaded
            con.execute(f"LOAD '{duckdb_extensions() / f'{ext}.duckdb_extension'}'")
        con.execute("SET TimeZone = 'UTC'")
        return con.execute("SELECT * FROM iceberg_scan(?)", [where]).pl()
    finally:
        con.close()


def summaries(table: Table) -> list[dict[str, str]]:
    """The snapshot summaries of the current snapshot's ancestry, oldest first."""
    out = []
    snapshot = table.current_snapshot()
    while snapshot is not None:
        assert snapshot.summary is not None
        out.append(dict(snapshot.summary.additional_properties)
                   | {"operation": snapshot.summary.operation.value})
        parent = snapshot.parent_snapshot_id
        snapshot = None if parent is None else table.metadata.snapshot_by_id(parent)
    return out[::-1]
