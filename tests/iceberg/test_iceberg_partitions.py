"""write_iceberg(partition_by=[...]) with Iceberg's transforms (hidden partitioning):
streamed tables equal one-shot Polars, read back by PyIceberg, DuckDB and
read_iceberg, in every output mode; files are laid out by partition and filters
prune them; bad terms and mismatching specs are refused. Real SQLite catalogs."""

from __future__ import annotations

import re
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from change_oracle import KEYS, change_batches, cuts, operations, oracle
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from iceberg_helpers import duckdb_scan, events, scan, summaries, table_of
from polars.testing import assert_frame_equal
from pyiceberg.table import Table
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import LongType

import microbatch as mb
from sinks.base import OutputMode, SinkContext
from sinks.exceptions import SinkConfigError
from sinks.iceberg import IcebergSink
from sinks.iceberg_catalog import IcebergUnavailableError, load_iceberg_table, resolve_catalog
from sinks.iceberg_partitions import parse_partition_term, partition_terms

SPEC = ["day(event_time)", "bucket(4, card_id)"]
EPOCH = date(1970, 1, 1)
# PyIceberg's pure-Python Murmur3 bucket (mmh3): an oracle independent of the
# pyiceberg-core (Rust) transform the writer uses
BUCKET = BucketTransform(4).transform(LongType())


def source(n: int = 60) -> pl.DataFrame:
    """Card events ~1.6 h apart: ``n=60`` spans five days and all seven cards."""
    frame = pl.from_arrow(events(0, n, minutes_per_row=97))
    assert isinstance(frame, pl.DataFrame)
    return frame


def opened(catalog: str, table: str, mode: OutputMode = "append",
           partition_by: list[str] | None = SPEC, **options: object) -> IcebergSink:
    sink = IcebergSink(table, catalog=catalog, partition_by=partition_by,
                       **options)  # type: ignore[arg-type]
    sink.open(SinkContext(query_id="q-parts", output_mode=mode, key_columns=KEYS))
    return sink


def spec_of(table: Table) -> list[tuple[str, str, str | None]]:
    schema = table.schema()
    return [(f.name, str(f.transform), schema.find_column_name(f.source_id))
            for f in table.spec().fields]


def assert_laid_out(table: Table, day_column: str, bucket_column: str) -> set[tuple[int, int]]:
    """Every data file holds one (day, bucket) partition: its manifest entry's
    partition values are its rows' day and Murmur3 bucket, and its path is
    ``<day field>=YYYY-MM-DD/<bucket field>=B/``. The partitions, as a set."""
    day_field, bucket_field = (f.name for f in table.spec().fields)
    seen = set()
    for task in table.scan().plan_files():
        assert not task.delete_files, "copy-on-write: no delete files"
        path = task.file.file_path
        rows = pl.read_parquet(path.removeprefix("file://"))
        day, bucket = task.file.partition[0], task.file.partition[1]
        days = rows[day_column].dt.date().unique().to_list()
        assert days == [EPOCH + timedelta(days=day)], path
        assert {BUCKET(c) for c in rows[bucket_column].unique()} == {bucket}, path
        assert f"/{day_field}={days[0]}/{bucket_field}={bucket}/" in path
        seen.add((day, bucket))
    return seen


def partitions_of(frame: pl.DataFrame, day_column: str, bucket_column: str
                  ) -> set[tuple[int, int]]:
    """The (day, bucket) partitions ``frame``'s rows belong to (the oracle's)."""
    pairs = frame.select((pl.col(day_column).dt.date() - EPOCH).dt.total_days(),
                         bucket_column).unique().rows()
    return {(day, BUCKET(card)) for day, card in pairs}


@settings(max_examples=2, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cap=st.integers(5, 60))
def test_a_stream_into_day_and_bucket_partitions_equals_one_shot(
    tmp_path_factory: pytest.TempPathFactory, cap: int
) -> None:
    work = tmp_path_factory.mktemp("parts")
    catalog = f"sqlite:///{work}/catalog.db"
    rows = source()
    query = (mb.read_memory(rows, max_records_per_batch=cap).filter(pl.col("amount") > 20)
             .write_iceberg("db.t", catalog=catalog, partition_by=SPEC)
             .start(work / "chk", trigger="available-now"))
    assert query.await_termination(60)

    want = rows.filter(pl.col("amount") > 20)
    table = table_of(catalog, "db.t")
    assert spec_of(table) == [("event_time_day", "day", "event_time"),
                              ("card_id_bucket_4", "bucket[4]", "card_id")]
    assert_frame_equal(scan(table).sort("event_id"), want)
    assert_frame_equal(duckdb_scan(table).sort("event_id"), want)
    assert assert_laid_out(table, "event_time", "card_id") == partitions_of(
        want, "event_time", "card_id")


@settings(max_examples=2, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cap=st.integers(8, 30))
@example(cap=7)
def test_update_windows_over_a_transformed_spec_equal_one_shot(
    tmp_path_factory: pytest.TempPathFactory, cap: int
) -> None:
    """Each batch replaces the windows it updates (a delete by key across day and
    bucket partitions, then an append, copy-on-write, in one commit)."""
    work = tmp_path_factory.mktemp("parts-update")
    catalog = f"sqlite:///{work}/catalog.db"
    rows = source(40)
    query = (mb.read_memory(rows, max_records_per_batch=cap)
             .with_watermark("event_time", "3h")
             .group_by(mb.window("event_time", "6h"), "card_id")
             .agg(pl.len().alias("n"), pl.col("amount").sum().alias("total"))
             .write_iceberg("db.w", catalog=catalog, output_mode="update",
                            partition_by=["day(window_start)", "bucket(4, card_id)"])
             .start(work / "chk", trigger="available-now"))
    assert query.await_termination(60)

    want = (rows.group_by(pl.col("event_time").dt.truncate("6h").alias("window_start"),
                          "card_id")
            .agg(pl.len().cast(pl.Int64).alias("n"), pl.col("amount").sum().alias("total"))
            .sort("window_start", "card_id"))
    table = table_of(catalog, "db.w")
    for read in (scan(table), duckdb_scan(table)):
        got = read.sort("window_start", "card_id").select(want.columns)
        assert_frame_equal(got, want, check_dtypes=False)
    assert assert_laid_out(table, "window_start", "card_id") == partitions_of(
        want, "window_start", "card_id")
    history = summaries(table)
    added = sum(int(s.get("added-records", 0)) for s in history)
    deleted = sum(int(s.get("deleted-records", 0)) for s in history)
    assert added - deleted == want.height, "every replaced window's old row was deleted"
    windows = rows.with_row_index().group_by(pl.col("event_time").dt.truncate("6h"), "card_id")
    if windows.agg((pl.col("index") // cap).n_unique() > 1).get_column("index").any():
        assert deleted > 0, "a window updated by two batches was replaced"


@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations, cut_at=cuts)
def test_changelog_deletes_in_update_mode_over_bucket_and_truncate_partitions(
    tmp_path_factory: pytest.TempPathFactory, ops, cut_at
) -> None:
    """Random upserts and deletes of keys (g, k): after every batch the table is
    the oracle's, with k bucketed and g truncated."""
    catalog = f"sqlite:///{tmp_path_factory.mktemp('parts-cl')}/catalog.db"
    batches = change_batches(ops, cut_at)
    sink = opened(catalog, "db.t", "update", ["bucket(2, k)", "truncate(1, note)"])
    for batch_id, frame in enumerate(batches):
        sink.add_batch(batch_id, frame)
        table = load_iceberg_table(resolve_catalog(catalog), "db.t")
        if table is None:  # only empty batches so far
            continue
        assert_frame_equal(scan(table).sort(list(KEYS)), oracle(batches[: batch_id + 1]))
        assert not any(task.delete_files for task in table.scan().plan_files())
    if load_iceberg_table(resolve_catalog(catalog), "db.t") is not None:
        table = table_of(catalog, "db.t")
        assert spec_of(table) == [("k_bucket_2", "bucket[2]", "k"),
                                  ("note_trunc_1", "truncate[1]", "note")]


def test_complete_and_changelog_modes_over_a_transformed_spec(catalog_uri: str) -> None:
    rows = source(30)
    sink = opened(catalog_uri, "db.full", "complete")
    sink.add_batch(0, rows)
    sink.add_batch(1, rows.tail(9))
    table = table_of(catalog_uri, "db.full")
    assert_frame_equal(scan(table).sort("event_id"), rows.tail(9))
    assert assert_laid_out(table, "event_time", "card_id") == partitions_of(
        rows.tail(9), "event_time", "card_id")

    sink = opened(catalog_uri, "db.cl", "changelog")
    changes = rows.with_columns(_change_type=pl.lit("insert"))
    sink.add_batch(0, changes.head(12))
    sink.add_batch(1, changes.tail(18))
    sink.add_batch(1, changes.tail(18))  # a replay: skipped
    table = table_of(catalog_uri, "db.cl")
    assert_frame_equal(scan(table).sort("event_id"), changes)
    assert_laid_out(table, "event_time", "card_id")


def test_partition_filters_prune_files_and_read_iceberg_streams_the_table(
    catalog_uri: str, tmp_path: Path
) -> None:
    rows = source()
    sink = opened(catalog_uri, "db.t")
    sink.add_batch(0, rows.head(25))
    sink.add_batch(1, rows.tail(35))
    table = table_of(catalog_uri, "db.t")
    total = len(table.scan().plan_files())

    day, end = datetime(2026, 1, 2, tzinfo=UTC), datetime(2026, 1, 3, tzinfo=UTC)
    one_day = f"event_time >= '{day.isoformat()}' and event_time < '{end.isoformat()}'"
    planned = table.scan(row_filter=one_day).plan_files()
    assert 0 < len(planned) < total
    assert {t.file.partition[0] for t in planned} == {(day.date() - EPOCH).days}
    want = rows.filter(pl.col("event_time").dt.date() == day.date())
    got = pl.from_arrow(table.scan(row_filter=one_day).to_arrow())
    assert isinstance(got, pl.DataFrame)
    assert_frame_equal(got.sort("event_id"), want)

    planned = table.scan(row_filter="card_id == 3").plan_files()
    assert 0 < len(planned) < total
    assert {t.file.partition[1] for t in planned} == {BUCKET(3)}

    out, chk = tmp_path / "out", tmp_path / "chk"
    query = (mb.read_iceberg("db.t", catalog=catalog_uri, max_files_per_batch=4)
             .write_parquet(out).start(chk, trigger="available-now"))
    assert query.await_termination(60)
    assert_frame_equal(mb.parquet_table(out).sort("event_id"), rows)
    assert len(list((chk / "commits").glob("[0-9]*"))) == -(-total // 4)


@pytest.mark.parametrize(("text", "canonical", "field"), [
    ("card_id", "card_id", "card_id"),
    ("DAY( ts )", "day(ts)", "ts_day"),
    ("days(ts)", "day(ts)", "ts_day"),
    ("Year(ts)", "year(ts)", "ts_year"),
    ("months(ts)", "month(ts)", "ts_month"),
    ("hour(ts)", "hour(ts)", "ts_hour"),
    ("Bucket(16,card_id)", "bucket(16, card_id)", "card_id_bucket_16"),
    (" truncate( 4 , name ) ", "truncate(4, name)", "name_trunc_4"),
])
def test_accepted_terms(text: str, canonical: str, field: str) -> None:
    term = parse_partition_term(text)
    assert (str(term), term.field_name) == (canonical, field)


@pytest.mark.parametrize("text", ["bucket(0, id)", "bucket(id)", "truncate(x, name)", "day()",
                                  "day(ts", "identity(ts)", "zorder(a, b)", "day(a, b)",
                                  "bucket(16, a b)", " "])
def test_bad_terms_are_refused_naming_the_accepted_forms(text: str) -> None:
    with pytest.raises(SinkConfigError, match=r"bucket\(N, col\), truncate\(W, col\)"):
        partition_terms([text])


def test_mismatching_specs_and_bad_sources_are_refused(
    catalog_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SinkConfigError, match="twice"):
        partition_terms(["day(ts)", "DAYS(ts)"])
    opened(catalog_uri, "db.t").add_batch(0, source(10))
    shown = re.escape("partition spec ['day(event_time)', 'bucket(4, card_id)'], not")
    for other in (["day(event_time)"], ["hour(event_time)", "bucket(4, card_id)"],
                  ["day(event_time)", "bucket(8, card_id)"],
                  ["bucket(4, card_id)", "day(event_time)"], ["event_time", "card_id"]):
        with pytest.raises(SinkConfigError, match=shown):
            opened(catalog_uri, "db.t", partition_by=other)
    for same in (["DAYS(event_time)", "bucket(4,card_id)"], None):
        opened(catalog_uri, "db.t", partition_by=same).add_batch(1, source(10))
    assert scan(table_of(catalog_uri, "db.t")).height == 20

    with pytest.raises(SinkConfigError, match=r"'day\(card_id\)'.*cannot transform"):
        opened(catalog_uri, "db.bad", partition_by=["day(card_id)"]).add_batch(0, source(3))
    assert load_iceberg_table(resolve_catalog(catalog_uri), "db.bad") is None

    monkeypatch.setitem(sys.modules, "pyiceberg_core", None)  # a missing package
    with pytest.raises(IcebergUnavailableError, match=r"pyiceberg-core.*microbatch\[iceberg\]"):
        IcebergSink("db.t", catalog=catalog_uri, partition_by=SPEC)
    IcebergSink("db.t", catalog=catalog_uri, partition_by="card_id")  # identity needs none
