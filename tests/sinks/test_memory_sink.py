"""MemorySink: batch-id idempotency, output modes, the process-global registry."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from sinks.base import OutputMode, SinkContext
from sinks.exceptions import SinkConfigError, SinkError
from sinks.memory import (
    MemorySink,
    UnknownTableError,
    drop_memory_table,
    memory_batches,
    memory_table,
)


@pytest.fixture
def name(table_name: str) -> Iterator[str]:
    yield table_name
    drop_memory_table(table_name)


def opened(
    name: str, mode: OutputMode = "append", keys: tuple[str, ...] = (), query_id: str = "q1"
) -> MemorySink:
    sink = MemorySink(name)
    sink.open(SinkContext(query_id=query_id, output_mode=mode, key_columns=keys))
    return sink


def test_append_concatenates_batches_in_batch_order(name):
    sink = opened(name)
    sink.add_batch(0, pl.DataFrame({"a": [1, 2]}))
    sink.add_batch(1, pl.DataFrame({"a": [3]}))
    sink.add_batch(2, pl.DataFrame({"a": [4, 5]}))
    assert memory_table(name)["a"].to_list() == [1, 2, 3, 4, 5]
    assert list(memory_batches(name)) == [0, 1, 2]


def test_repeated_batch_id_is_a_noop(name):
    sink = opened(name)
    sink.add_batch(0, pl.DataFrame({"a": [1, 2]}))
    sink.add_batch(1, pl.DataFrame({"a": [3]}))
    before = memory_table(name)
    sink.add_batch(1, pl.DataFrame({"a": [3]}))
    sink.add_batch(1, pl.DataFrame({"a": [99, 98]}))  # even with other content
    sink.add_batch(0, pl.DataFrame({"a": [97]}))
    assert_frame_equal(memory_table(name), before)
    assert memory_batches(name)[1]["a"].to_list() == [3]


def test_restart_of_the_same_query_keeps_batches_so_the_replay_is_a_noop(name):
    opened(name).add_batch(0, pl.DataFrame({"a": [1]}))
    restarted = opened(name)  # a new sink object, same query id
    restarted.add_batch(0, pl.DataFrame({"a": [1]}))
    restarted.add_batch(1, pl.DataFrame({"a": [2]}))
    assert memory_table(name)["a"].to_list() == [1, 2]


def test_another_query_on_the_same_name_starts_afresh(name):
    first = opened(name, query_id="q1")
    first.add_batch(0, pl.DataFrame({"a": [1]}))
    opened(name, query_id="q2").add_batch(0, pl.DataFrame({"a": [2]}))
    assert memory_table(name)["a"].to_list() == [2]
    with pytest.raises(SinkError, match="belongs to query q2"):
        first.add_batch(1, pl.DataFrame({"a": [3]}))


def test_complete_mode_is_the_last_batch(name):
    sink = opened(name, mode="complete")
    sink.add_batch(0, pl.DataFrame({"k": ["a"], "n": [1]}))
    sink.add_batch(1, pl.DataFrame({"k": ["a", "b"], "n": [2, 1]}))
    assert_frame_equal(memory_table(name), pl.DataFrame({"k": ["a", "b"], "n": [2, 1]}))
    sink.add_batch(1, pl.DataFrame({"k": ["z"], "n": [0]}))  # replay: ignored
    assert memory_table(name)["k"].to_list() == ["a", "b"]
    assert len(memory_batches(name)) == 2


def test_update_mode_upserts_by_key_latest_row_wins(name):
    sink = opened(name, mode="update", keys=("k", "w"))
    sink.add_batch(0, pl.DataFrame({"k": ["a", "b", None], "w": [1, 1, 1], "n": [1, 1, 1]}))
    # "a" updated twice in one batch (the last row wins), "c" is new, null key updated
    sink.add_batch(
        1, pl.DataFrame({"k": ["a", "c", "a", None], "w": [1, 1, 1, 1], "n": [2, 1, 3, 5]})
    )
    sink.add_batch(2, pl.DataFrame({"k": ["b", "a"], "w": [1, 2], "n": [4, 1]}))
    expected = pl.DataFrame(
        {"k": ["a", "b", None, "c", "a"], "w": [1, 1, 1, 1, 2], "n": [3, 4, 5, 1, 1]}
    )
    # rows stay where their key first appeared
    assert_frame_equal(memory_table(name), expected)


def test_update_mode_without_keys_behaves_like_append(name):
    sink = opened(name, mode="update")
    sink.add_batch(0, pl.DataFrame({"a": [1, 1]}))
    sink.add_batch(1, pl.DataFrame({"a": [1]}))
    assert memory_table(name)["a"].to_list() == [1, 1, 1]


def test_update_mode_batch_without_the_key_column_is_an_error(name):
    sink = opened(name, mode="update", keys=("k",))
    with pytest.raises(SinkError, match=r"batch 3 .* lacks the key column\(s\) \['k'\]"):
        sink.add_batch(3, pl.DataFrame({"a": [1]}))


def test_unknown_table_error_lists_known_names(name):
    opened(name)
    with pytest.raises(UnknownTableError, match=f"no memory table named 'nope'.*'{name}'"):
        memory_table("nope")
    with pytest.raises(SinkError):
        memory_batches("nope")


def test_drop_forgets_the_table_and_is_idempotent(name):
    opened(name).add_batch(0, pl.DataFrame({"a": [1]}))
    drop_memory_table(name)
    with pytest.raises(UnknownTableError):
        memory_table(name)
    drop_memory_table(name)


def test_schema_is_kept_with_zero_batches(name):
    schema = {"k": pl.String, "n": pl.Int64}
    sink = MemorySink(name, schema=schema)
    sink.open(SinkContext(query_id="q1"))
    table = memory_table(name)
    assert table.height == 0
    assert table.schema == pl.Schema(schema)


def test_empty_batches_keep_their_schema_and_add_no_rows(name):
    sink = opened(name)
    sink.add_batch(0, pl.DataFrame(schema={"a": pl.Int32}))
    assert memory_table(name).schema == pl.Schema({"a": pl.Int32})
    sink.add_batch(1, pl.DataFrame({"a": [1]}, schema={"a": pl.Int32}))
    sink.add_batch(2, pl.DataFrame({"a": []}))  # a loosely typed no-data batch
    assert_frame_equal(memory_table(name), pl.DataFrame({"a": [1]}, schema={"a": pl.Int32}))


def test_opened_table_without_batches_is_empty(name):
    opened(name)
    assert memory_table(name).shape == (0, 0)
    assert memory_batches(name) == {}


def test_concurrent_writers_store_each_batch_exactly_once(name):
    sink = opened(name)
    barrier = threading.Barrier(8)

    def write(worker: int) -> None:
        barrier.wait()
        for batch_id in range(50):
            sink.add_batch(batch_id, pl.DataFrame({"batch": [batch_id], "worker": [worker]}))

    threads = [threading.Thread(target=write, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert memory_table(name)["batch"].to_list() == list(range(50))


def test_add_batch_before_open_is_an_error(name):
    with pytest.raises(SinkError, match="before open"):
        MemorySink(name).add_batch(0, pl.DataFrame({"a": [1]}))


def test_empty_name_is_a_config_error():
    with pytest.raises(SinkConfigError, match="non-empty name"):
        MemorySink("")


def test_describe(name):
    assert MemorySink(name).describe() == {"kind": "MemorySink", "name": name}


def test_stored_batches_cannot_be_changed_through_the_frames_returned(name):
    sink = opened(name)
    df = pl.DataFrame({"a": [1]})
    sink.add_batch(0, df)
    df[0, "a"] = 100
    memory_table(name)[0, "a"] = 200
    memory_batches(name)[0][0, "a"] = 300
    assert memory_table(name)["a"].to_list() == [1]
