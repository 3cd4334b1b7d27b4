"""IcebergSource: the table's snapshot lineage as a replayable log."""

from __future__ import annotations

import pickle
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from fault_points import raise_at
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from iceberg_helpers import append_snapshots, compact, events, new_table, whole_table
from polars.testing import assert_frame_equal

import microbatch as mb
from microbatch.sources.base import SourceContext
from microbatch.sources.iceberg import IcebergSource


def replay(catalog: str, chk: Path, table: str = "db.events", **options) -> pl.DataFrame:
    """Run read_iceberg(table) to the end (available-now) into a Parquet output."""
    out = chk.parent / f"{chk.name}-out"
    query = (mb.read_iceberg(table, catalog=catalog, **options).write_parquet(out)
             .start(chk, trigger="available-now"))
    assert query.await_termination(60)
    return mb.parquet_table(out)


def opened(catalog: str, table: str = "db.events", **options) -> IcebergSource:
    source = IcebergSource(table, catalog=catalog, **options)
    source.open(SourceContext("0", None))
    return source


def batches(files: int, cap: int | None) -> int:
    """How many batches an available-now run takes for ``files`` new files."""
    return -(-files // cap) if cap else min(files, 1)


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=7),
       cut=st.integers(0, 7), cap=st.sampled_from([None, 1, 2, 3]))
def test_streaming_random_snapshots_with_a_restart_equals_the_whole_table(
    catalog_uri: str, tmp_path: Path, sizes: list[int], cut: int, cap: int | None
) -> None:
    """Snapshots of random sizes, a run, more snapshots, a run on the same
    checkpoint: every row of the table exactly once."""
    name = f"db.t{uuid.uuid4().hex[:8]}"
    table = new_table(catalog_uri, name)
    chk = tmp_path / uuid.uuid4().hex / "chk"

    def run() -> None:
        query = (mb.read_iceberg(name, catalog=catalog_uri, max_files_per_batch=cap)
                 .write_parquet(chk.parent / "out").start(chk, trigger="available-now"))
        assert query.await_termination(60)

    nxt = append_snapshots(table, sizes[:cut])
    run()
    append_snapshots(table.refresh(), sizes[cut:], start_id=nxt)
    run()
    want = whole_table(table)
    if want.height:
        got = mb.parquet_table(chk.parent / "out")
        assert_frame_equal(got.sort("event_id"), want.sort("event_id"))
    # PyIceberg writes one file per non-empty append
    files = [sum(1 for n in part if n) for part in (sizes[:cut], sizes[cut:])]
    committed = len(list((chk / "commits").glob("[0-9]*"))) if chk.exists() else 0
    assert committed == sum(batches(f, cap) for f in files)


def test_window_aggregation_over_an_iceberg_source_equals_its_oracle(
    catalog_uri: str, table_name: str
) -> None:
    table = new_table(catalog_uri)
    append_snapshots(table, [50, 13, 80, 1, 40])
    query = (mb.read_iceberg("db.events", catalog=catalog_uri, max_files_per_batch=2)
             .group_by(mb.window("event_time", "1h"), "card_id")
             .agg(pl.len().alias("n"), pl.col("amount").sum().alias("total"))
             .write_memory(table_name, output_mode="update")
             .start(trigger="available-now"))
    assert query.await_termination(60)
    rows = whole_table(table)
    want = (rows.group_by(pl.col("event_time").dt.truncate("1h").alias("window_start"),
                          "card_id")
            .agg(pl.len().cast(pl.Int64).alias("n"), pl.col("amount").sum().alias("total"))
            .with_columns((pl.col("window_start") + pl.duration(hours=1)).alias("window_end"))
            .select("window_start", "window_end", "card_id", "n", "total"))
    got = mb.table(table_name).select(want.columns)
    assert_frame_equal(got.sort("window_start", "card_id"), want.sort("window_start", "card_id"),
                       check_dtypes=False, rel_tol=1e-9)
    assert len(query.recent_progress) == 3


def test_offsets_positions_and_replays_read_the_same_rows(catalog_uri: str) -> None:
    table = new_table(catalog_uri)
    append_snapshots(table, [10, 20, 30])
    source = opened(catalog_uri, max_files_per_batch=2)
    start = source.initial_offset()
    assert start == {"snapshot_id": None, "sequence_number": -1, "timestamp_ms": -1,
                     "index": None}
    snaps = table.refresh().snapshots()
    first = source.latest_offset(start)
    assert first == {"snapshot_id": snaps[1].snapshot_id, "sequence_number": 2,
                     "timestamp_ms": snaps[1].timestamp_ms, "index": None}
    second = source.latest_offset(first)
    assert second["snapshot_id"] == snaps[2].snapshot_id
    assert source.latest_offset(second) == second  # nothing new
    again = IcebergSource("db.events", catalog=catalog_uri)  # another process replays
    assert again.read(start, first).data.equals(source.read(start, first).data)
    shipped_source = pickle.loads(pickle.dumps(source))  # reloads its table where it lands
    assert shipped_source.read(start, first).data.equals(source.read(start, first).data)
    assert source.read(first, second).data["event_id"].to_list() == list(range(30, 60))
    backlog = source.backlog(start, second)
    assert (backlog.snapshots, backlog.files, backlog.rows) == (3, 3, 60)
    assert source.compare(start, first) == -1
    assert source.compare(second, first) == 1
    splits = source.read_splits(start, second, 2)
    assert splits is not None
    assert len(splits) == 2
    shipped = pickle.loads(pickle.dumps(splits))  # as sent to workers
    assert pl.concat([s.read().data for s in shipped]).equals(source.read(start, second).data)


def test_a_large_snapshot_is_cut_into_batches_by_files(catalog_uri: str) -> None:
    table = new_table(catalog_uri, "db.parts")
    with table.update_spec() as spec:
        spec.add_identity("card_id")
    table.refresh().append(events(0, 70))  # one file per card: 7 files in one snapshot
    source = opened(catalog_uri, "db.parts", max_files_per_batch=3)
    start = source.initial_offset()
    one = source.latest_offset(start)
    assert one["index"] == 3
    two = source.latest_offset(one)
    three = source.latest_offset(two)
    assert (two["index"], three["index"]) == (6, None)
    parts = [source.read(a, b).data for a, b in ((start, one), (one, two), (two, three))]
    assert [p.height for p in parts] == [30, 30, 10]
    assert sorted(pl.concat(parts)["event_id"].to_list()) == list(range(70))


def test_resume_after_new_snapshots_reads_each_row_once(catalog_uri: str, tmp_path: Path) -> None:
    table = new_table(catalog_uri)
    nxt = append_snapshots(table, [25, 5])
    chk = tmp_path / "chk"
    assert replay(catalog_uri, chk)["event_id"].to_list() == list(range(30))
    append_snapshots(table, [7, 0, 11], start_id=nxt)
    got = replay(catalog_uri, chk)
    assert sorted(got["event_id"].to_list()) == list(range(48))


def test_a_crash_between_offsets_and_commit_replays_the_same_files(
    catalog_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = new_table(catalog_uri)
    append_snapshots(table, [10] * 8)
    out, chk = tmp_path / "out", tmp_path / "chk"

    def start() -> mb.StreamingQuery:
        return (mb.read_iceberg("db.events", catalog=catalog_uri, max_files_per_batch=3)
                .write_parquet(out).start(chk, trigger="available-now"))

    for point in ("after_read@1", "after_sink@2", "after_commit@2"):
        raise_at(monkeypatch, point, start)
    assert start().await_termination(60)
    got = mb.parquet_table(out)
    assert sorted(got["event_id"].to_list()) == list(range(80))


def test_schema_evolution_mid_stream_and_renames_by_field_id(
    catalog_uri: str, table_name: str
) -> None:
    from pyiceberg.types import StringType

    from sinks.memory import memory_batches

    table = new_table(catalog_uri)
    append_snapshots(table, [5])
    stream = mb.read_iceberg("db.events", catalog=catalog_uri)
    both = [stream.write_memory(table_name).start(),
            stream.select("event_id", "amount").write_memory(f"{table_name}_narrow").start()]
    try:
        for query in both:
            query.process_all_available()
        with table.update_schema() as update:
            update.add_column("country", StringType())
        wider = events(5, 5).append_column("country", pa.array(["FR"] * 5, pa.large_string()))
        table.refresh().append(wider)
        for query in both:
            query.process_all_available()
    finally:
        for query in both:
            query.stop()
    # a batch has the columns of its last snapshot: the new column from its snapshot on
    first, second = memory_batches(table_name).values()
    assert "country" not in first.columns
    assert second["country"].to_list() == ["FR"] * 5
    # a query naming its columns goes on across the change
    assert mb.table(f"{table_name}_narrow")["event_id"].to_list() == list(range(10))
    # a replay of both snapshots in one batch: older files have the column as null
    source = opened(catalog_uri)
    whole = source.read(source.initial_offset(), source.latest_offset(source.initial_offset()))
    assert whole.data["country"].to_list() == [None] * 5 + ["FR"] * 5

    # a rename: files written before it are read by field id under the new name
    with table.refresh().update_schema() as update:
        update.rename_column("amount", "price")
    renamed = events(10, 2).rename_columns(["event_id", "card_id", "price", "event_time"])
    table.refresh().append(renamed.append_column("country", pa.array([None, None],
                                                                     pa.large_string())))
    source = opened(catalog_uri)
    whole = source.read(source.initial_offset(), source.latest_offset(source.initial_offset()))
    assert "amount" not in whole.data.columns
    want = whole_table(table).sort("event_id")
    assert whole.data.sort("event_id")["price"].to_list() == want["price"].to_list()
    assert whole.data["price"].null_count() == 0


def test_delete_snapshots_are_refused_skipped_or_followed(catalog_uri: str, tmp_path: Path) -> None:
    table = new_table(catalog_uri)
    append_snapshots(table, [20, 20])
    table.delete("event_id < 5")  # copy-on-write: an overwrite re-adding 15 rows
    table.refresh().delete("event_id >= 30")  # drops 10 rows of one file, keeps 10
    append_snapshots(table.refresh(), [3], start_id=100)
    chk = tmp_path / "chk"
    out = tmp_path / "chk-out"  # where replay() writes
    query = (mb.read_iceberg("db.events", catalog=catalog_uri).write_parquet(out)
             .start(chk, trigger="available-now"))
    with pytest.raises(mb.QueryTerminatedError):
        query.await_termination(60)
    error = query.exception
    overwrite = table.refresh().snapshots()[2]
    assert isinstance(error, mb.SourceError)
    assert f"snapshot {overwrite.snapshot_id} (overwrite)" in str(error)
    assert "skip_change_commits=True" in str(error)
    assert "ignore_changes=True" in str(error)
    assert sorted(mb.parquet_table(out)["event_id"].to_list()) == list(range(40))

    # the failed batch is recorded: the same checkpoint goes on, skipping changes
    got = replay(catalog_uri, chk, skip_change_commits=True)
    assert sorted(got["event_id"].to_list()) == [*range(40), 100, 101, 102]
    # following them instead re-reads the rewritten files' surviving rows
    followed = replay(catalog_uri, tmp_path / "c2", ignore_changes=True)
    assert followed.height == 40 + 15 + 10 + 3


def test_compaction_snapshots_are_skipped(catalog_uri: str, tmp_path: Path) -> None:
    table = new_table(catalog_uri)
    nxt = append_snapshots(table, [10, 10, 10])
    compact(table)
    assert table.refresh().current_snapshot().summary.operation.value == "replace"
    append_snapshots(table.refresh(), [4], start_id=nxt)
    got = replay(catalog_uri, tmp_path / "chk")
    assert sorted(got["event_id"].to_list()) == list(range(34))


def test_starting_snapshot_variants_and_expired_snapshots(
    catalog_uri: str, tmp_path: Path, table_name: str
) -> None:
    table = new_table(catalog_uri)
    append_snapshots(table, [10] * 4)
    snaps = table.refresh().snapshots()
    got = replay(catalog_uri, tmp_path / "c1", starting_snapshot=snaps[2].snapshot_id)
    assert sorted(got["event_id"].to_list()) == list(range(20, 40))
    at = datetime.fromtimestamp(snaps[3].timestamp_ms / 1000, tz=UTC)
    got = replay(catalog_uri, tmp_path / "c2", starting_timestamp=at)
    assert sorted(got["event_id"].to_list()) == list(range(30, 40))
    later = opened(catalog_uri, starting_timestamp=at + timedelta(days=1))
    assert later.initial_offset()["snapshot_id"] == snaps[3].snapshot_id
    query = (mb.read_iceberg("db.events", catalog=catalog_uri, starting_snapshot="latest")
             .write_memory(table_name).start())
    try:
        query.process_all_available()
        assert mb.table(table_name).height == 0
        append_snapshots(table.refresh(), [2], start_id=40)
        query.process_all_available()
    finally:
        query.stop()
    assert mb.table(table_name)["event_id"].to_list() == [40, 41]
    with pytest.raises(mb.SourceError, match="not a snapshot of the table's current lineage"):
        opened(catalog_uri, starting_snapshot=123).initial_offset()
    with pytest.raises(mb.PlanError, match="not both"):
        mb.read_iceberg("db.events", catalog=catalog_uri, starting_snapshot=1,
                        starting_timestamp=at)
    with pytest.raises(mb.PlanError, match="namespace"):
        mb.read_iceberg("events", catalog=catalog_uri)

    # a query that lags behind expire_snapshots, and a replay of the whole history
    lagging = opened(catalog_uri, max_files_per_batch=2)
    position = lagging.latest_offset(lagging.initial_offset())  # after snapshot 1
    table.refresh().maintenance.expire_snapshots().by_ids(
        [s.snapshot_id for s in snaps[:3]]).commit()
    with pytest.raises(mb.SourceError, match=f"snapshots before {snaps[3].snapshot_id} were "
                                             "expired"):
        opened(catalog_uri).initial_offset()
    with pytest.raises(mb.SourceError, match=f"snapshot {snaps[1].snapshot_id}, where the "
                                             "query stands, is no longer an ancestor"):
        lagging.latest_offset(position)
    got = replay(catalog_uri, tmp_path / "c4", starting_snapshot=snaps[3].snapshot_id)
    assert sorted(got["event_id"].to_list()) == list(range(30, 42))


def test_missing_table_and_catalog_are_clear_errors(catalog_uri: str, tmp_path: Path) -> None:
    with pytest.raises(mb.SourceError, match=r"has no Iceberg table db\.nothing"):
        opened(catalog_uri, "db.nothing")
    # a stream can name a table created later: the query's start says it is missing
    writer = mb.read_iceberg("db.nothing", catalog=catalog_uri).write_memory("nothing")
    with pytest.raises(mb.SourceError, match="create the table first"):
        writer.start(tmp_path / "chk", trigger="available-now")
    with pytest.raises(mb.SourceError, match="cannot open Iceberg catalog nosuch"):
        opened("nosuch")
