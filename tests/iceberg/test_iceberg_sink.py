"""write_iceberg / IcebergSink: streaming results equal one-shot Polars, read back by
PyIceberg and by DuckDB's iceberg_scan; replays are no-ops; schema merge, partitions,
types. Real SQLite catalogs and files."""

from __future__ import annotations

import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest
from change_oracle import KEYS, change_batches, cuts, operations, oracle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from iceberg_helpers import duckdb_scan, scan, summaries, table_of
from polars.testing import assert_frame_equal

import microbatch as mb
from sinks.base import OutputMode, SinkContext
from sinks.exceptions import SinkConfigError, SinkError
from sinks.iceberg import IcebergSink
from sinks.iceberg_batches import last_batch_property, last_committed_batch
from sinks.iceberg_catalog import load_iceberg_table, resolve_catalog
from sinks.iceberg_io import DurableFileIO, use_durable_io

START = datetime(2026, 1, 1, tzinfo=UTC)


def events(n: int = 60) -> pl.DataFrame:
    """Ordered event times (nothing late), types Iceberg lacks (UInt16, ms, a zone)."""
    return pl.DataFrame({
        "id": range(n),
        "k": [f"k{i % 3}" for i in range(n)],
        "v": pl.Series([(i * 7) % 11 - 3 for i in range(n)], dtype=pl.Int64),
        "small": pl.Series([i % 50 for i in range(n)], dtype=pl.UInt16),
        "ts": pl.datetime_range(START, START.replace(second=n - 1), "1s", eager=True,
                                time_unit="ms").dt.convert_time_zone("Europe/Paris"),
    })


def opened(catalog: str, mode: OutputMode, **options: object) -> IcebergSink:
    sink = IcebergSink("db.t", catalog=catalog, **options)  # type: ignore[arg-type]
    sink.open(SinkContext(query_id="q-ice", output_mode=mode, key_columns=KEYS))
    return sink


@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cap=st.integers(4, 60))
def test_append_stream_equals_one_shot(tmp_path_factory: pytest.TempPathFactory,
                                       cap: int) -> None:
    work = tmp_path_factory.mktemp("append")
    catalog = f"sqlite:///{work}/catalog.db"
    source = events()
    query = (mb.read_memory(source, max_records_per_batch=cap).filter(pl.col("v") > 0)
             .write_iceberg("db.t", catalog=catalog).start(work / "chk",
                                                           trigger="available-now"))
    assert query.await_termination(60)

    want = source.filter(pl.col("v") > 0).with_columns(
        pl.col("small").cast(pl.Int32),
        pl.col("ts").dt.convert_time_zone("UTC").dt.cast_time_unit("us"))
    table = table_of(catalog, "db.t")
    assert_frame_equal(scan(table).sort("id"), want)
    assert_frame_equal(duckdb_scan(table).sort("id"), want)
    assert str(table.schema().find_field("ts").field_type) == "timestamptz"
    batches = [int(s["microbatch.batch-id"]) for s in summaries(table)]
    assert batches == sorted(set(batches)), "one snapshot per batch, in batch order"
    kept = source.with_row_index().group_by(pl.col("index") // cap).agg(
        (pl.col("v") > 0).any()).get_column("v")
    assert len(batches) == kept.sum(), "a batch without kept rows commits nothing"


@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cap=st.integers(4, 60))
def test_update_windows_equal_one_shot(tmp_path_factory: pytest.TempPathFactory,
                                       cap: int) -> None:
    work = tmp_path_factory.mktemp("update")
    catalog = f"sqlite:///{work}/catalog.db"
    source = events()
    query = (mb.read_memory(source, max_records_per_batch=cap)
             .with_watermark("ts", "5s")
             .group_by(mb.window("ts", "10s"), "k")
             .agg(pl.len().alias("n"), pl.col("v").sum().alias("total"))
             .write_iceberg("db.w", catalog=catalog, output_mode="update")
             .start(work / "chk", trigger="available-now"))
    assert query.await_termination(60)

    want = (source.with_columns(pl.col("ts").dt.convert_time_zone("UTC"))
            .group_by(pl.col("ts").dt.truncate("10s").alias("window_start"), "k")
            .agg(pl.len().cast(pl.Int64).alias("n"), pl.col("v").sum().alias("total"))
            .sort("window_start", "k"))
    table = table_of(catalog, "db.w")
    for read in (scan(table), duckdb_scan(table)):
        got = read.sort("window_start", "k").with_columns(
            pl.col("window_start").dt.cast_time_unit("ms"))
        assert_frame_equal(got.select(want.columns), want, check_dtypes=False)
        assert got.select(pl.struct("window_start", "k").is_unique().all()).item()


@settings(max_examples=5, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations, cut_at=cuts)
def test_update_mode_applies_changelog_deletes_in_one_commit_per_batch(
    tmp_path_factory: pytest.TempPathFactory, ops, cut_at
) -> None:
    catalog = f"sqlite:///{tmp_path_factory.mktemp('cl')}/catalog.db"
    batches = change_batches(ops, cut_at)
    sink = opened(catalog, "update")
    commits = []
    for batch_id, frame in enumerate(batches):
        sink.add_batch(batch_id, frame)
        table = load_iceberg_table(resolve_catalog(catalog), "db.t")
        if table is None:  # only empty batches so far: nothing to commit
            assert oracle(batches[: batch_id + 1]).height == 0
            continue
        commits.append(table.metadata_location)
        assert_frame_equal(scan(table).sort(list(KEYS)), oracle(batches[: batch_id + 1]))
    sink.add_batch(len(batches) - 1, batches[-1])  # a replay of the last batch: no-op
    # a batch with change rows always commits (its record at least): its replay is skipped
    assert sink.skipped_batches == (1 if batches[-1].height else 0)
    if not commits:
        return
    table = table_of(catalog, "db.t")
    assert table.metadata_location == commits[-1]
    assert_frame_equal(duckdb_scan(table).sort(list(KEYS)), oracle(batches))
    # each snapshot belongs to one batch; a batch's snapshots are one catalog commit
    ids = [s.get("microbatch.batch-id") for s in summaries(table)]
    assert ids == sorted(ids, key=int)


def test_changelog_and_complete_modes(catalog_uri: str) -> None:
    rows = pl.DataFrame({"g": ["a", "b"], "k": [1, 2], "v": [5, 6], "note": ["x", "y"],
                         "_change_type": ["insert", "insert"]})
    sink = IcebergSink("db.cl", catalog=catalog_uri)
    sink.open(SinkContext(query_id="q", output_mode="changelog", key_columns=KEYS))
    sink.add_batch(0, rows)
    sink.add_batch(0, rows)
    assert_frame_equal(scan(table_of(catalog_uri, "db.cl")).sort("k"), rows)

    sink = IcebergSink("db.full", catalog=catalog_uri)
    sink.open(SinkContext(query_id="q", output_mode="complete"))
    sink.add_batch(0, rows.drop("_change_type"))
    sink.add_batch(1, rows.drop("_change_type").head(1))
    sink.add_batch(1, rows.drop("_change_type"))  # replayed with other rows: skipped
    sink.add_batch(2, rows.drop("_change_type").clear())  # an empty result empties it
    table = table_of(catalog_uri, "db.full")
    assert scan(table).height == 0
    assert last_committed_batch(table, "q") == 2


def test_replay_after_the_sink_committed_but_commits_n_is_missing(
    catalog_uri: str, tmp_path: Path
) -> None:
    source = events(30)
    chk = tmp_path / "chk"

    def run() -> None:
        query = (mb.read_memory(source, max_records_per_batch=10)
                 .write_iceberg("db.t", catalog=catalog_uri).start(chk, trigger="available-now"))
        assert query.await_termination(60)

    run()
    table = table_of(catalog_uri, "db.t")
    committed = table.metadata_location
    query_id = summaries(table)[-1]["microbatch.query-id"]
    assert last_committed_batch(table, query_id) == 2
    assert table.properties[last_batch_property(query_id)] == "2"
    hint = Path(committed.removeprefix("file://")).with_name("version-hint.text")
    assert hint.read_text() == Path(committed).name.removesuffix(".metadata.json")
    hint.write_text("00000-stale")  # a crash after the commit, before the hint's update
    (chk / "commits" / "2").unlink()  # the crash: the table has batch 2, the checkpoint not
    run()
    table = table_of(catalog_uri, "db.t")
    assert table.metadata_location == committed, "the replay committed nothing"
    assert hint.read_text() == Path(committed).name.removesuffix(".metadata.json"), (
        "the skipped replay points the hint at the table again")
    assert duckdb_scan(hint.parent.parent)["id"].sort().to_list() == list(range(30))
    assert scan(table)["id"].sort().to_list() == list(range(30))
    assert (chk / "commits" / "2").exists()


def test_the_property_keeps_the_record_when_snapshots_expire(catalog_uri: str) -> None:
    sink = opened(catalog_uri, "append")
    frame = pl.DataFrame({"g": ["a"], "k": [1]})
    sink.add_batch(0, frame)
    table = table_of(catalog_uri, "db.t")
    # another writer's snapshots on top, the query's own ones expired
    table.append(frame.to_arrow())
    table = table_of(catalog_uri, "db.t")
    own = [s.snapshot_id for s in table.snapshots()
           if s.summary is not None and s.summary.get("microbatch.query-id") == "q-ice"]
    table.maintenance.expire_snapshots().by_ids(own).commit()
    table = table_of(catalog_uri, "db.t")
    assert not any(s.summary and s.summary.get("microbatch.query-id") for s in table.snapshots())
    assert table.properties[last_batch_property("q-ice")] == "0"
    sink.add_batch(0, frame)  # still known: skipped
    assert scan(table_of(catalog_uri, "db.t")).height == 2
    assert sink.skipped_batches == 1


def test_a_racing_writer_of_the_same_query_commits_the_batch_once(catalog_uri: str) -> None:
    """Two processes of one query both find batch 1 missing; the one that commits
    second gets a commit conflict, reloads and finds the batch: skipped."""
    first, second = IcebergSink("db.t", catalog=catalog_uri), IcebergSink("db.t",
                                                                          catalog=catalog_uri)
    frame = pl.DataFrame({"x": [1, 2]})

    def race(name: str, batch_id: int) -> None:
        if name == "sink.before_commit" and batch_id == 1:
            second.add_batch(1, frame)

    first.open(SinkContext(query_id="q", fault_point=race))
    second.open(SinkContext(query_id="q"))
    first.add_batch(0, frame)
    first.add_batch(1, frame)
    assert first.last_commit["skipped"] is True
    assert first.last_commit["attempts"] == 2
    assert scan(table_of(catalog_uri, "db.t")).height == 4


def test_schema_merge_adds_columns_by_name_in_the_batch_commit(catalog_uri: str) -> None:
    sink = opened(catalog_uri, "append", schema_mode="merge")
    sink.add_batch(0, pl.DataFrame({"g": ["a"], "k": [1]}))
    sink.add_batch(1, pl.DataFrame({"extra": [2.5], "k": [2]}))  # new column, g missing
    table = table_of(catalog_uri, "db.t")
    assert table.schema().column_names == ["g", "k", "extra"]
    assert scan(table).sort("k").rows() == [("a", 1, None), (None, 2, 2.5)]
    assert len(summaries(table)) == 2, "the schema change is in the batch's own commit"

    strict = IcebergSink("db.t", catalog=catalog_uri, allow_other_writers=True)
    strict.open(SinkContext(query_id="q2"))
    with pytest.raises(SinkError, match=r"'new'.*schema_mode='merge'"):
        strict.add_batch(0, pl.DataFrame({"g": ["b"], "k": [3], "extra": [1.0], "new": [1]}))
    with pytest.raises(SinkError, match=r"column 'k' has type String.*cast"):
        sink.add_batch(2, pl.DataFrame({"g": ["b"], "k": ["3"], "extra": [1.0]}))
    assert scan(table_of(catalog_uri, "db.t")).height == 2, "nothing was written"


def test_partition_spec_and_files_laid_out_by_partition(catalog_uri: str) -> None:
    sink = IcebergSink("db.p", catalog=catalog_uri, partition_by=["k"])
    sink.open(SinkContext(query_id="q"))
    sink.add_batch(0, events(12).select("id", "k"))
    table = table_of(catalog_uri, "db.p")
    assert [(f.name, str(f.transform)) for f in table.spec().fields] == [("k", "identity")]
    files = [Path(t.file.file_path.removeprefix("file://")) for t in table.scan().plan_files()]
    assert sorted(f.parent.name for f in files) == ["k=k0", "k=k1", "k=k2"]
    assert all(pl.read_parquet(f)["k"].n_unique() == 1 for f in files)

    other = IcebergSink("db.p", catalog=catalog_uri, partition_by=["id"])
    with pytest.raises(SinkConfigError, match="partition spec"):
        other.open(SinkContext(query_id="q"))
    with pytest.raises(SinkConfigError, match="not an Iceberg partition"):
        IcebergSink("db.p", catalog=catalog_uri, partition_by="days_between(ts)")


def test_types_iceberg_lacks_are_cast_or_refused(catalog_uri: str) -> None:
    sink = opened(catalog_uri, "append")
    big = pl.DataFrame({"u": pl.Series([2**63], dtype=pl.UInt64)})
    with pytest.raises(SinkError, match="above 2\\*\\*63-1"):
        sink.add_batch(0, big)
    with pytest.raises(SinkError, match="column 'd' has type Duration"):
        sink.add_batch(0, pl.DataFrame({"d": pl.Series([1], dtype=pl.Duration("us"))}))
    frame = pl.DataFrame({"i8": pl.Series([1], dtype=pl.Int8), "c": pl.Series(["x"],
                          dtype=pl.Categorical), "l": [[1, 2]], "s": [{"a": 1}]})
    sink.add_batch(0, frame)
    types = {f.name: str(f.field_type) for f in table_of(catalog_uri, "db.t").schema().fields}
    assert types == {"i8": "int", "c": "string", "l": "list<long>",
                     "s": "struct<6: a: optional long>"}


def test_update_mode_needs_keys_and_unique_rows(catalog_uri: str) -> None:
    with pytest.raises(mb.PlanError, match="merge_keys"):
        mb.read_memory(events(3)).write_iceberg("db.t", catalog=catalog_uri,
                                                output_mode="update")
    sink = IcebergSink("db.t", catalog=catalog_uri, merge_keys="k")
    sink.open(SinkContext(query_id="q", output_mode="update"))
    with pytest.raises(SinkError, match="one row per key"):
        sink.add_batch(0, pl.DataFrame({"k": [1, 1], "v": [1, 2]}))


def test_a_dropped_table_is_recreated_and_not_found_twice(catalog_uri: str,
                                                          tmp_path: Path) -> None:
    sink = opened(catalog_uri, "append")
    sink.add_batch(0, pl.DataFrame({"x": [1]}))
    table = table_of(catalog_uri, "db.t")
    resolve_catalog(catalog_uri).drop_table("db.t")
    shutil.rmtree(tmp_path / "lake" / "warehouse" / "db", ignore_errors=True)
    sink.add_batch(1, pl.DataFrame({"x": [2]}))
    assert scan(table_of(catalog_uri, "db.t"))["x"].to_list() == [2]
    assert table.metadata_location != table_of(catalog_uri, "db.t").metadata_location


def test_local_warehouses_write_through_the_durable_file_io(catalog_uri: str,
                                                            tmp_path: Path) -> None:
    sink = opened(catalog_uri, "append")
    sink.add_batch(0, pl.DataFrame({"x": [1]}))
    assert isinstance(sink._table.io if sink._table else None, DurableFileIO)
    s3 = resolve_catalog({"type": "sql", "uri": f"sqlite:///{tmp_path}/s3.db",
                          "warehouse": "s3://bucket/wh"})
    assert not use_durable_io(s3)
    assert "py-io-impl" not in s3.properties


def test_without_pyiceberg_the_error_names_the_extra(catalog_uri: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyiceberg", None)  # what a missing package looks like
    with pytest.raises(SinkConfigError, match=r"pip install 'microbatch\[iceberg\]'"):
        mb.read_memory(events(3)).write_iceberg("db.t", catalog=catalog_uri)


def test_update_rewrites_only_the_files_holding_a_touched_key(catalog_uri: str) -> None:
    """A batch whose keys (null ones included) are in one of three files removes
    that file and adds its kept rows rewritten, in one overwrite snapshot; the
    other files are the same files after it."""
    from change_oracle import SCHEMA, oracle

    def rows(*items: tuple[str | None, int | None, int, str]) -> pl.DataFrame:
        return pl.DataFrame([{"g": g, "k": k, "v": v, "note": f"{g}{k}", "_change_type": kind}
                             for g, k, v, kind in items], schema=SCHEMA)

    batches = [
        rows(*[("a", k, k, "insert") for k in range(5)]),
        rows(*[("b", k, k, "insert") for k in range(5)], (None, None, 7, "insert"),
             ("b", None, 8, "insert"), (None, 2, 9, "insert")),
        rows(*[("z", k, k, "insert") for k in range(100, 105)]),
        rows((None, None, -1, "update_postimage"), ("b", 3, -3, "update_postimage"),
             ("b", None, 8, "delete"), ("b", 50, 50, "insert")),
    ]
    sink = opened(catalog_uri, "update")
    files_after = []
    for batch_id, frame in enumerate(batches):
        sink.add_batch(batch_id, frame)
        table = table_of(catalog_uri, "db.t")
        files_after.append({task.file.file_path for task in table.scan().plan_files()})
    before, after = files_after[-2], files_after[-1]
    (touched_file,) = files_after[1] - files_after[0]
    assert before - after == {touched_file}  # the a and z files are left as they were
    assert len(after - before) >= 1  # the rewritten b rows and the upserts
    assert_frame_equal(scan(table).sort(list(KEYS)), oracle(batches))
    last = summaries(table)[-1]
    assert (last["operation"], last["microbatch.batch-id"]) == ("overwrite", "3")
    assert len(summaries(table)) == len(batches)  # one snapshot per batch
