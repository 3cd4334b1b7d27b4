"""The Iceberg sink with its warehouse on S3 (the suite's moto server, real HTTP) and a
SQLite catalog; delta-rs storage options accepted."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from iceberg_helpers import scan, summaries, table_of
from s3_server import S3Server

import microbatch as mb
from tests.fault_points import raise_at

PARAMS = {"total_rows": 3_000, "rows_per_second": None, "seed": 3, "cards": 5,
          "max_records_per_batch": 1_000, "start": "2026-01-01T00:00:00+00:00"}


def test_s3_warehouse_round_trip_survives_a_crash_after_the_commit(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = s3_server.bucket()
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
               "warehouse": f"s3://{bucket}/wh"}
    options = s3_server.options()  # the Delta sink's keys, as they are
    chk = tmp_path / "chk"

    def start() -> mb.StreamingQuery:
        return (mb.generate(**PARAMS).select("event_id", "card_id", "amount")
                .write_iceberg("lake.tx", catalog=catalog, storage_options=options,
                               partition_by="card_id")
                .start(chk, trigger="available-now"))

    raise_at(monkeypatch, "sink.after_commit@1", start)
    assert start().await_termination(60)

    table = table_of(catalog, "lake.tx", **options)
    got = scan(table).sort("event_id")
    assert got["event_id"].to_list() == list(range(PARAMS["total_rows"]))
    assert [s["microbatch.batch-id"] for s in summaries(table)] == ["0", "1", "2"]
    assert table.metadata_location.startswith(f"s3://{bucket}/wh/lake/tx/metadata/")
    paths = [task.file.file_path for task in table.scan().plan_files()]
    assert paths
    assert all(p.startswith(f"s3://{bucket}/wh/lake/tx/data/card_id=") for p in paths)
    assert got.schema["card_id"] == pl.Int64
