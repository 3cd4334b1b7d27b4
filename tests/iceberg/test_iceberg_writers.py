"""The Iceberg sink's writer registry (``sinks/writers.py``, shared with Delta), on a
real SQLite catalog: a second checkpoint is refused at start and writes when it
opts in, a restart is not refused, the late table registers with its role, two
queries racing for one table land exactly one's rows, a retired writer stops."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import polars as pl
import pytest
from iceberg_helpers import scan, table_of

import microbatch as mb
from sinks.base import SinkContext
from sinks.exceptions import OtherWriterError, RetiredWriterError
from sinks.iceberg import IcebergSink
from sinks.iceberg_catalog import resolve_catalog
from sinks.writers import WriterEntry, promote_properties, writers_of

ROWS = pl.DataFrame({"x": [1, 2, 3]})
TIMES = [(0, 5), (2, 0), (0, 40), (3, 0), (0, 10)]
"""Minute and second of each event: 00:00:40 and 00:00:10 arrive after the watermark
closed their window, so the query has late rows."""
EVENTS = pl.DataFrame({"ts": [datetime(2026, 1, 1, 0, m, s) for m, s in TIMES],
                       "v": range(len(TIMES))})


def run(catalog: str, chk: Path, table: str = "db.out", late: str = "db.late",
        **options: bool) -> None:
    """One available-now run of a windowed count into ``table``, late rows to ``late``."""
    query = (
        mb.read_memory(EVENTS, max_records_per_batch=2)
        .with_watermark("ts", "10s")
        .group_by(mb.window("ts", "1m"))
        .agg(pl.len().alias("n"))
        .on_late(IcebergSink(late, catalog=catalog))
        .write_iceberg(table, catalog=catalog, output_mode="update", **options)
        .start(str(chk), trigger="available-now")
    )
    assert query.await_termination()


def on_time_and_late() -> tuple[pl.DataFrame, pl.DataFrame]:
    """The oracle: the per-minute counts of the rows on time, and the late rows
    (those whose window ended at or before the watermark in force: the largest
    event time of the earlier batches minus 10 s)."""
    rows = EVENTS.with_columns(batch=pl.int_range(pl.len()) // 2)
    marks = (rows.group_by("batch").agg(pl.col("ts").max()).sort("batch")
             .select("batch", mark=pl.col("ts").cum_max().shift(1) - pl.duration(seconds=10)))
    start = pl.col("ts").dt.truncate("1m")
    late = rows.join(marks, on="batch").select(
        "ts", late=(start + pl.duration(minutes=1) <= pl.col("mark")).fill_null(False))
    counts = (late.filter(~pl.col("late")).group_by(start.alias("window_start"))
              .agg(pl.len().cast(pl.UInt32).alias("n")).sort("window_start"))
    return counts, late.filter("late").select("ts")


def writers(catalog: str, table: str) -> dict[str, WriterEntry]:
    return writers_of(table_of(catalog, table).properties)


def test_a_second_checkpoint_is_refused_at_start_unless_it_opts_in(
    catalog_uri: str, tmp_path: Path
) -> None:
    first, second = tmp_path / "chk-1", tmp_path / "chk-2"
    run(catalog_uri, first)
    counts, late_rows = on_time_and_late()
    out = scan(table_of(catalog_uri, "db.out")).sort("window_start")
    assert out.select("window_start", "n").rows() == counts.rows()
    (owner,) = writers(catalog_uri, "db.out").values()
    assert (owner.checkpoint, owner.role) == (str(first), "output")
    late = writers(catalog_uri, "db.late")
    assert [(e.query_id, e.role) for e in late.values()] == [(owner.query_id, "late")]
    assert sorted(scan(table_of(catalog_uri, "db.late"))["ts"]) == sorted(late_rows["ts"])

    run(catalog_uri, first)  # the same checkpoint again: its own entry, not refused
    snapshots = len(table_of(catalog_uri, "db.out").snapshots())
    with pytest.raises(OtherWriterError) as refused:
        run(catalog_uri, second)
    message = str(refused.value)
    assert f"query {owner.query_id} (checkpoint {first}, its output since" in message
    assert "write this query to a new table (a new version of the output)" in message
    assert "allow_other_writers=True to write_iceberg (IcebergSink)" in message
    assert len(table_of(catalog_uri, "db.out").snapshots()) == snapshots  # nothing written

    with pytest.raises(OtherWriterError, match=f"its late since .*checkpoint {second}"):
        run(catalog_uri, second, table="db.late")  # another query's late table

    run(catalog_uri, second, late="db.late2", allow_other_writers=True)  # opted in: writes
    both = writers(catalog_uri, "db.out")
    assert len(both) == 2
    assert both[owner.query_id] == owner
    (shared,) = (e for q, e in both.items() if q != owner.query_id)
    assert (shared.checkpoint, shared.allow_other_writers) == (str(second), True)
    assert len(table_of(catalog_uri, "db.out").snapshots()) > snapshots
    out = scan(table_of(catalog_uri, "db.out")).sort("window_start")
    assert out.select("window_start", "n").rows() == counts.rows()  # update: keys replaced


@pytest.mark.parametrize("exists", [False, True], ids=["new table", "table without writers"])
def test_of_two_queries_racing_for_a_table_exactly_one_lands_rows(
    catalog_uri: str, exists: bool
) -> None:
    """Both open while nobody is registered; ``a`` commits its first batch between
    ``b``'s read and ``b``'s commit: ``b``'s commit conflicts, the reload finds
    ``a``'s entry, ``b`` is refused and none of its rows land."""
    if exists:  # created by someone else, with rows, before any streaming query
        resolve_catalog(catalog_uri).create_table(
            "db.t", schema=ROWS.to_arrow().schema).append(ROWS.to_arrow())
    a, b = IcebergSink("db.t", catalog=catalog_uri), IcebergSink("db.t", catalog=catalog_uri)

    def race(name: str, batch_id: int) -> None:
        if name == "sink.before_commit":
            a.add_batch(0, ROWS.with_columns(x=pl.col("x") * 10))

    a.open(SinkContext(query_id="a", checkpoint_dir=Path("/chk/a")))
    b.open(SinkContext(query_id="b", checkpoint_dir=Path("/chk/b"), fault_point=race))
    with pytest.raises(OtherWriterError, match="query a \\(checkpoint /chk/a"):
        b.add_batch(0, ROWS)
    assert set(writers(catalog_uri, "db.t")) == {"a"}
    expected = [1, 2, 3] * exists + [10, 20, 30]
    assert sorted(scan(table_of(catalog_uri, "db.t"))["x"].to_list()) == sorted(expected)


def test_a_commit_adding_no_snapshot_does_not_register(catalog_uri: str) -> None:
    """An ``update`` batch whose deletes match nothing commits only properties,
    which carry no requirement: two such commits both land. So neither
    registers its query; the first commit of rows does, and the other query's
    next commit is refused."""
    keyed = pl.DataFrame({"k": [1, 2], "v": [0, 0]})
    resolve_catalog(catalog_uri).create_table(
        "db.t", schema=keyed.to_arrow().schema).append(keyed.to_arrow())
    a, b = (IcebergSink("db.t", catalog=catalog_uri, merge_keys="k") for _ in "ab")
    gone = pl.DataFrame({"k": [99], "v": [0], "_change_type": ["delete"]})

    def race(name: str, batch_id: int) -> None:
        if name == "sink.before_commit" and batch_id == 0:
            a.add_batch(0, gone)

    a.open(SinkContext(query_id="a", output_mode="update", key_columns=("k",)))
    b.open(SinkContext(query_id="b", output_mode="update", key_columns=("k",),
                       fault_point=race))
    b.add_batch(0, gone)
    assert writers(catalog_uri, "db.t") == {}
    a.add_batch(1, pl.DataFrame({"k": [1], "v": [10]}))
    with pytest.raises(OtherWriterError, match="already written by query a"):
        b.add_batch(1, pl.DataFrame({"k": [2], "v": [20]}))
    assert set(writers(catalog_uri, "db.t")) == {"a"}
    assert scan(table_of(catalog_uri, "db.t")).sort("k").rows() == [(1, 10), (2, 0)]


def test_a_writer_retired_while_running_is_refused_at_its_next_commit(
    catalog_uri: str,
) -> None:
    sink = IcebergSink("db.t", catalog=catalog_uri)
    sink.open(SinkContext(query_id="old", checkpoint_dir=Path("/chk/old")))
    sink.add_batch(0, ROWS)
    live = table_of(catalog_uri, "db.t")
    live.transaction().set_properties(promote_properties(
        live.properties, new=WriterEntry("new", "/chk/new"), rebuild="db.r", batch=0,
    )).commit_transaction()
    with pytest.raises(RetiredWriterError, match=r"retired as its writer.*a new table"):
        sink.add_batch(1, ROWS)
    assert scan(table_of(catalog_uri, "db.t")).height == ROWS.height  # nothing more written
