"""The Delta sink's writer registry (``sinks/delta_writers.py``) in one process, on
real tables: the race of two new writers, the opt-in, a retirement mid-run."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from deltalake import DeltaTable

from sinks.base import SinkContext
from sinks.delta import DeltaSink
from sinks.delta_writers import WriterEntry, promote_entries, register_writer, table_writers
from sinks.exceptions import OtherWriterError, RetiredWriterError

ROWS = pl.DataFrame({"x": [1, 2, 3]})


def opened(path: Path, query_id: str, **options: bool) -> DeltaSink:
    sink = DeltaSink(path, **options)
    sink.open(SinkContext(query_id=query_id, checkpoint_dir=path.parent / f"chk-{query_id}"))
    return sink


def test_of_two_writers_registering_at_once_one_is_refused(tmp_path: Path) -> None:
    table = tmp_path / "t"
    ROWS.write_delta(str(table))  # a table no streaming query wrote yet
    seen_by_a, seen_by_b = DeltaTable(str(table)), DeltaTable(str(table))  # both see no writer
    register_writer(seen_by_a, uri=str(table), me=WriterEntry("a", "/chk/a"),
                    reload=lambda: DeltaTable(str(table)))
    with pytest.raises(OtherWriterError, match="query a \\(checkpoint /chk/a"):
        register_writer(seen_by_b, uri=str(table), me=WriterEntry("b", "/chk/b"),
                        reload=lambda: DeltaTable(str(table)))
    assert set(table_writers(DeltaTable(str(table)))) == {"a"}


def test_the_same_query_reopens_and_opted_in_writers_share_the_table(tmp_path: Path) -> None:
    table = tmp_path / "t"
    first = opened(table, "q1")
    first.add_batch(0, ROWS)
    again = opened(table, "q1")  # a restart of the same query
    again.add_batch(0, ROWS)  # its replay: skipped
    with pytest.raises(OtherWriterError, match="allow_other_writers=True"):
        opened(table, "q2")
    shared = opened(table, "q2", allow_other_writers=True)
    shared.add_batch(0, ROWS)
    assert pl.read_delta(str(table)).height == 2 * ROWS.height  # each query's own rows, once
    assert table_writers(DeltaTable(str(table)))["q2"].allow_other_writers


def test_a_writer_retired_while_running_is_refused_at_its_next_commit(tmp_path: Path) -> None:
    table = tmp_path / "t"
    sink = opened(table, "old")
    sink.add_batch(0, ROWS)
    live = DeltaTable(str(table))
    live.alter.set_table_properties(
        promote_entries(live, new=WriterEntry("new", "/chk/new"), rebuild="/r", batch=0),
        raise_if_not_exists=False,
    )
    with pytest.raises(RetiredWriterError, match="retired as its writer"):
        sink.add_batch(1, ROWS)
    assert pl.read_delta(str(table)).height == ROWS.height  # nothing more written
