"""The Iceberg source against a local S3-compatible server (moto, real HTTP)."""

from __future__ import annotations

from pathlib import Path

from iceberg_helpers import SCHEMA, append_snapshots, whole_table
from polars.testing import assert_frame_equal
from s3_server import S3Server

import microbatch as mb
from sinks.iceberg_catalog import resolve_catalog


def test_source_on_s3_reads_new_snapshots_with_delta_rs_options(
    s3_server: S3Server, tmp_path: Path, table_name: str
) -> None:
    options = s3_server.options()  # delta-rs keys, as read_delta takes them
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/iceberg.db",
               "warehouse": f"s3://{s3_server.bucket()}/warehouse"}
    writer = resolve_catalog(catalog, storage_options=options)
    writer.create_namespace("db")
    table = writer.create_table("db.events", schema=SCHEMA)
    assert table.location().startswith("s3://")
    nxt = append_snapshots(table, [20, 15])
    query = (mb.read_iceberg("db.events", catalog=catalog, storage_options=options,
                             max_files_per_batch=1)
             .write_memory(table_name).start(tmp_path / "chk"))
    try:
        query.process_all_available()
        assert mb.table(table_name).height == 35
        append_snapshots(table.refresh(), [6], start_id=nxt)
        query.process_all_available()
    finally:
        query.stop()
    assert_frame_equal(mb.table(table_name).sort("event_id"),
                       whole_table(table).sort("event_id"))
    assert [p["input_rows"] for p in query.recent_progress if p["input_rows"]] == [20, 15, 6]
