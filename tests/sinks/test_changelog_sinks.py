"""Sinks take changelogs: update mode applies deletes, changelog mode appends the changes.

Memory and Parquet sinks here (Delta in tests/delta, Kafka in tests/kafka),
driven directly with hypothesis-drawn change sequences cut into random
batches, against the dict oracle of ``tests/change_oracle.py``.
"""

from __future__ import annotations

import itertools

import polars as pl
import pytest
from change_oracle import KEYS, change_batches, cuts, operations, oracle
from hypothesis import HealthCheck, given, settings
from polars.testing import assert_frame_equal

from sinks.base import SinkContext
from sinks.changes import changelog_rows, last_changes, table_changes
from sinks.exceptions import SinkConfigError, SinkError
from sinks.memory import MemorySink, drop_memory_table, memory_batches, memory_table
from sinks.parquet import ParquetSink, read_parquet_output

_names = itertools.count()


def _memory(mode: str, keys: tuple[str, ...] = KEYS) -> tuple[MemorySink, str]:
    name = f"changes-{next(_names)}"
    sink = MemorySink(name)
    sink.open(SinkContext(query_id="q", output_mode=mode, key_columns=keys))  # type: ignore[arg-type]
    return sink, name


@settings(max_examples=60, deadline=None)
@given(ops=operations, cut_at=cuts)
def test_memory_update_mode_applies_changes_like_the_oracle(ops, cut_at) -> None:
    batches = change_batches(ops, cut_at)
    sink, name = _memory("update")
    try:
        for batch_id, frame in enumerate(batches):
            sink.add_batch(batch_id, frame)
            expected = oracle(batches[: batch_id + 1])
            assert_frame_equal(memory_table(name).sort(list(KEYS)), expected)
        before = memory_table(name)
        sink.add_batch(len(batches) - 1, batches[-1])  # a replay of the last batch: no-op
        assert sink.skipped_batches == 1
        assert_frame_equal(memory_table(name), before)
    finally:
        drop_memory_table(name)


@settings(max_examples=30, deadline=None)
@given(ops=operations, cut_at=cuts)
def test_memory_changelog_mode_appends_every_change_row(ops, cut_at) -> None:
    batches = change_batches(ops, cut_at)
    sink, name = _memory("changelog")
    try:
        for batch_id, frame in enumerate(batches):
            sink.add_batch(batch_id, frame)
        sink.add_batch(len(batches) - 1, batches[-1])
        everything = pl.concat(batches)
        assert_frame_equal(memory_table(name), everything)
        # the appended changes, applied in order, are the result table
        assert_frame_equal(oracle([memory_table(name)]), oracle(batches))
    finally:
        drop_memory_table(name)


def test_memory_update_keeps_plain_upsert_batches_among_changelog_batches() -> None:
    sink, name = _memory("update", ("k",))
    try:
        sink.add_batch(0, pl.DataFrame({"k": [1, 2], "v": [1, 2]}))  # no _change_type: upserts
        sink.add_batch(1, pl.DataFrame({"k": [1, 3], "v": [1, 3],
                                        "_change_type": ["delete", "insert"]}))
        sink.add_batch(2, pl.DataFrame({"k": [2, 1], "v": [20, 10]}))
        assert memory_table(name).rows() == [(2, 20), (3, 3), (1, 10)]  # 1 re-inserted last
        # the stored batches are the frames as received
        assert memory_batches(name)[1].columns == ["k", "v", "_change_type"]
    finally:
        drop_memory_table(name)


def test_memory_update_without_change_type_is_unchanged() -> None:
    sink, name = _memory("update", ("k",))
    try:
        sink.add_batch(0, pl.DataFrame({"k": [1, 2, 1], "v": [1, 2, 3]}))
        sink.add_batch(1, pl.DataFrame({"k": [2], "v": [9]}))
        assert memory_table(name).rows() == [(1, 3), (2, 9)]
    finally:
        drop_memory_table(name)


def test_memory_update_refuses_a_changelog_without_key_columns() -> None:
    sink, name = _memory("update", ())
    try:
        with pytest.raises(SinkConfigError, match=r"applies the deletes .* by key"):
            sink.add_batch(0, pl.DataFrame({"v": [1], "_change_type": ["delete"]}))
        assert memory_batches(name) == {}
    finally:
        drop_memory_table(name)


def test_an_unknown_change_type_is_refused_before_anything_is_stored() -> None:
    sink, name = _memory("update", ("k",))
    try:
        with pytest.raises(SinkError, match=r"'upsert'.*use one of"):
            sink.add_batch(0, pl.DataFrame({"k": [1, 2], "_change_type": ["insert", "upsert"]}))
        with pytest.raises(SinkError, match="has type Int64"):
            sink.add_batch(0, pl.DataFrame({"k": [1], "_change_type": [1]}))
        assert memory_batches(name) == {}
    finally:
        drop_memory_table(name)


def test_changelog_rows_rule_for_a_frame_without_change_type() -> None:
    plain = pl.DataFrame({"k": [1, 2]})
    # an append-only result: every row is an insert
    assert changelog_rows(plain, (), "s")["_change_type"].to_list() == ["insert", "insert"]
    # a keyed result: insert or update cannot be told apart
    with pytest.raises(SinkConfigError, match="could be an insert or an update"):
        changelog_rows(plain, ("k",), "s")
    # a no-data batch gains the column, whatever the keys
    empty = changelog_rows(plain.clear(), ("k",), "s")
    assert empty.schema == pl.Schema({"k": pl.Int64, "_change_type": pl.String})


def test_table_changes_and_last_changes_agree_on_the_last_change_per_key() -> None:
    frame = pl.DataFrame({
        "k": [1, 1, 2, 3, 2, 1],
        "v": [0, 5, 7, 3, 7, 5],
        "_change_type": ["update_preimage", "update_postimage", "insert", "insert", "delete",
                         "delete"],
    })
    upserts, deletes = table_changes(frame, ("k",), "s")
    assert upserts.rows() == [(3, 3)]
    assert sorted(deletes.rows()) == [(1, 5), (2, 7)]
    assert last_changes(frame, ("k",), "s").rows() == [
        (3, 3, "insert"), (2, 7, "delete"), (1, 5, "delete")
    ]


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations, cut_at=cuts)
def test_parquet_changelog_mode_appends_the_changes_exactly_once(
    tmp_path_factory, ops, cut_at
) -> None:
    out = tmp_path_factory.mktemp("cl")
    batches = change_batches(ops, cut_at)
    sink = ParquetSink(out)
    sink.open(SinkContext(query_id="q", output_mode="changelog", key_columns=KEYS))
    for batch_id, frame in enumerate(batches):
        sink.add_batch(batch_id, frame)
    sink.add_batch(len(batches) - 1, batches[-1])
    stored = read_parquet_output(out)
    assert_frame_equal(stored, pl.concat(batches), check_row_order=False)
    # the files of each batch (named by batch id), applied in order, give the table
    by_batch = [pl.read_parquet(f) for f in sorted(out.glob("part-*.parquet"))]
    assert_frame_equal(oracle(by_batch), oracle(batches))


def test_parquet_refuses_update_mode_and_names_changelog() -> None:
    with pytest.raises(SinkConfigError, match="output_mode='changelog'"):
        ParquetSink("unused").open(SinkContext(query_id="q", output_mode="update"))


def test_kafka_raw_format_is_refused_in_changelog_mode() -> None:
    from sinks.kafka import KafkaSink

    sink = KafkaSink("t", bootstrap="127.0.0.1:1", format="raw")
    with pytest.raises(SinkConfigError, match="use format='json'"):  # before any connection
        sink.open(SinkContext(query_id="q", output_mode="changelog"))
