"""The Delta sink and source against a local S3-compatible server (moto, real HTTP)."""

from __future__ import annotations

import threading
from pathlib import Path

import polars as pl
import pytest
from delta_helpers import append_versions, operations, transactions
from deltalake import DeltaTable
from polars.testing import assert_frame_equal
from s3_server import S3Server

import microbatch as mb
from microbatch.engine.faults import InjectedFault
from sinks.base import SinkContext
from sinks.delta import DeltaSink

pytestmark = pytest.mark.delta

PARAMS = {"total_rows": 6_000, "rows_per_second": None, "seed": 3, "cards": 20,
          "max_records_per_batch": 1_500, "start": "2026-01-01T00:00:00+00:00"}


def test_append_sink_on_s3_survives_a_crash_after_the_commit(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = s3_server.options()
    uri = f"s3://{s3_server.bucket()}/tables/tx"
    chk = tmp_path / "chk"

    def start() -> mb.StreamingQuery:
        return (mb.generate(**PARAMS).select("event_id", "card_id", "amount")
                .write_delta(uri, storage_options=options, partition_by=["card_id"])
                .start(chk, trigger="available-now"))

    monkeypatch.setenv("MICROBATCH_FAULT", "sink.after_commit@1")
    monkeypatch.setenv("MICROBATCH_FAULT_ACTION", "raise")
    query = start()
    with pytest.raises(mb.QueryTerminatedError):
        query.await_termination(60)
    assert isinstance(query.exception, InjectedFault)
    monkeypatch.delenv("MICROBATCH_FAULT")
    assert start().await_termination(60)

    got = pl.read_delta(uri, storage_options=options).sort("event_id")
    assert got["event_id"].to_list() == list(range(PARAMS["total_rows"]))
    assert operations(uri, options).count("WRITE") == 4

    # the source reads it back over S3, partition values included
    out = tmp_path / "out"
    back = (mb.read_delta(uri, storage_options=options, max_files_per_batch=7)
            .write_parquet(out).start(tmp_path / "chk2", trigger="available-now"))
    assert back.await_termination(60)
    assert_frame_equal(mb.parquet_table(out).sort("event_id"), got, check_column_order=False)


def test_source_on_s3_picks_up_new_versions(s3_server: S3Server, tmp_path: Path,
                                            table_name: str) -> None:
    options = s3_server.options()
    uri = f"s3://{s3_server.bucket()}/t"
    append_versions(uri, [transactions(0, 20), transactions(20, 20)], storage_options=options)
    query = mb.read_delta(uri, storage_options=options).write_memory(table_name).start(
        tmp_path / "chk")
    try:
        query.process_all_available()
        assert mb.table(table_name).height == 40
        append_versions(uri, [transactions(40, 10)], storage_options=options)
        query.process_all_available()
        assert sorted(mb.table(table_name)["event_id"].to_list()) == list(range(50))
    finally:
        query.stop()


@pytest.mark.parametrize("unsafe_rename", [True, False])
def test_racing_writers_on_s3_land_one_copy(s3_server: S3Server, unsafe_rename: bool) -> None:
    """delta-rs 1.x commits with conditional PUTs, so the race is safe on S3
    with or without AWS_S3_ALLOW_UNSAFE_RENAME."""
    options = s3_server.options()
    if not unsafe_rename:
        del options["AWS_S3_ALLOW_UNSAFE_RENAME"]
    uri = f"s3://{s3_server.bucket()}/t"
    barrier = threading.Barrier(2, timeout=30)

    def meet(name: str, batch_id: int) -> None:
        if name == "sink.before_commit" and batch_id == 1:
            barrier.wait()

    def sink() -> DeltaSink:
        s = DeltaSink(uri, storage_options=options)
        s.open(SinkContext(query_id="q", fault_point=meet))
        return s

    sink().add_batch(0, pl.DataFrame({"id": [0]}))
    sinks = [sink() for _ in range(2)]
    threads = [threading.Thread(target=s.add_batch, args=(1, pl.DataFrame({"id": [1]})))
               for s in sinks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(pl.read_delta(uri, storage_options=options)["id"].to_list()) == [0, 1]
    assert sorted(s.last_commit["skipped"] for s in sinks) == [False, True]
    assert DeltaTable(uri, storage_options=options).transaction_version("q") == 1
