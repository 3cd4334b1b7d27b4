"""Reading the sink's Iceberg tables back, with PyIceberg and with DuckDB."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import duckdb
import polars as pl
from pyiceberg.table import Table

from sinks.iceberg_catalog import CatalogSpec, load_iceberg_table, resolve_catalog


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


def duckdb_scan(table: Table) -> pl.DataFrame:
    """Every row, as DuckDB's ``iceberg_scan`` reads the table's current metadata file."""
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    try:
        for ext in ("avro", "iceberg"):  # NOTE: avro first: iceberg needs it loaded
            con.execute(f"LOAD '{duckdb_extensions() / f'{ext}.duckdb_extension'}'")
        con.execute("SET TimeZone = 'UTC'")
        return con.execute("SELECT * FROM iceberg_scan(?)", [table.metadata_location]).pl()
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
