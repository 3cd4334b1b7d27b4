"""Catalog resolution shared by the Iceberg sink, source and CLI (sinks.iceberg_catalog)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from sinks.exceptions import SinkConfigError
from sinks.iceberg_catalog import (
    fileio_properties,
    load_iceberg_table,
    resolve_catalog,
    table_identifier,
)


def test_sqlite_url_makes_a_sql_catalog_with_its_warehouse_beside_it(tmp_path: Path) -> None:
    catalog = resolve_catalog(f"sqlite:///{tmp_path}/lake/iceberg.db")
    assert isinstance(catalog, SqlCatalog)
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", schema=pa.schema([("k", pa.int64())]))
    table.append(pa.table({"k": pa.array([1, 2], pa.int64())}))
    assert (tmp_path / "lake" / "warehouse" / "db").is_dir()
    again = resolve_catalog(f"sqlite:///{tmp_path}/lake/iceberg.db")
    loaded = load_iceberg_table(again, "db.t")
    assert loaded is not None
    assert loaded.scan().to_arrow().column("k").to_pylist() == [1, 2]
    assert load_iceberg_table(again, "db.missing") is None
    assert load_iceberg_table(again, ("nowhere", "t")) is None


def test_mapping_and_catalog_object_forms(tmp_path: Path) -> None:
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db",
             "warehouse": (tmp_path / "wh").as_uri(), "name": "mine"}
    catalog = resolve_catalog(props)
    assert catalog.name == "mine"
    assert resolve_catalog(catalog) is catalog


def test_storage_options_take_delta_rs_keys() -> None:
    props = fileio_properties({"AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
                               "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b",
                               "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
                               "s3.path-style-access": "true"})
    assert props == {"s3.endpoint": "http://127.0.0.1:9000", "s3.access-key-id": "a",
                     "s3.secret-access-key": "b", "s3.region": "us-east-1",
                     "s3.path-style-access": "true"}
    with pytest.raises(SinkConfigError, match="AWS_ENDPOIN"):
        fileio_properties({"AWS_ENDPOIN": "x"})


def test_bad_specs_say_what_to_write(tmp_path: Path) -> None:
    with pytest.raises(SinkConfigError, match="namespace"):
        table_identifier("alerts")
    with pytest.raises(SinkConfigError, match="warehouse"):
        resolve_catalog("postgresql://u@h/db")
    with pytest.raises(SinkConfigError, match="catalog=42"):
        resolve_catalog(42)
    with pytest.raises(SinkConfigError, match="cannot open Iceberg catalog nosuch"):
        resolve_catalog("nosuch")
