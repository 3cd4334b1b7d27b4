"""KafkaSink takes changelogs, against a real broker: update mode writes a record
per changed key with a tombstone for a delete, so that compacting the topic by
key gives the result table; changelog mode writes every change row."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import polars as pl
import pytest
from change_oracle import KEYS, as_frame, change_batches, cuts, operations, oracle
from hypothesis import HealthCheck, given, settings
from kafka_helpers import consume_all
from polars.testing import assert_frame_equal

from sinks.base import OutputMode, SinkContext
from sinks.exceptions import SinkConfigError
from sinks.kafka import DeliveryGuarantee, KafkaSink

pytestmark = pytest.mark.kafka


def opened(bootstrap: str, topic: str, mode: OutputMode, *, keys: tuple[str, ...] = KEYS,
           guarantee: DeliveryGuarantee = "exactly_once", **options: Any) -> KafkaSink:
    sink = KafkaSink(topic, bootstrap=bootstrap, delivery_guarantee=guarantee, **options)
    sink.open(SinkContext(query_id=f"q-{topic}", output_mode=mode, key_columns=keys))
    return sink


def compacted(messages: list[Any]) -> pl.DataFrame:
    """Log compaction, by hand: the last record per key; a tombstone removes the key."""
    table: dict[bytes, dict[str, Any]] = {}
    for m in sorted(messages, key=lambda m: (m.partition(), m.offset())):
        if m.value() is None:
            table.pop(m.key(), None)
        else:
            table[m.key()] = json.loads(m.value())
    return as_frame(table.values())


@settings(max_examples=5, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations, cut_at=cuts)
def test_update_mode_compacts_to_the_result_table(
    bootstrap: str, new_topic: Callable[..., str], ops, cut_at
) -> None:
    topic = new_topic(3)
    batches = change_batches(ops, cut_at)
    sink = opened(bootstrap, topic, "update")
    for batch_id, frame in enumerate(batches):
        sink.add_batch(batch_id, frame)
    sink.add_batch(len(batches) - 1, batches[-1])  # a replay of the last batch: no-op
    assert sink.skipped_batches == 1
    sink.close()
    messages = consume_all(bootstrap, topic)
    assert_frame_equal(compacted(messages), oracle(batches))
    # a tombstone per key whose last change in its batch is a delete, and nothing else
    expected_deletes = sum(
        1 for frame in batches
        for kind in frame.filter(pl.col("_change_type") != "update_preimage")
        .unique(subset=list(KEYS), keep="last")["_change_type"]
        if kind == "delete"
    )
    tombstones = [m for m in messages if m.value() is None]
    assert len(tombstones) == expected_deletes
    assert all(json.loads(m.key()).keys() == set(KEYS) for m in messages)
    values = [json.loads(m.value()) for m in messages if m.value() is not None]
    assert all("_change_type" not in v for v in values)
    # the changes of one key stay on one partition, in order
    partitions: dict[bytes, set[int]] = {}
    for m in messages:
        partitions.setdefault(m.key(), set()).add(m.partition())
    assert all(len(p) == 1 for p in partitions.values())


def test_update_mode_at_least_once_writes_tombstones_with_dedupe_headers(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    sink = opened(bootstrap, topic, "update", keys=("k",), guarantee="at_least_once")
    sink.add_batch(0, pl.DataFrame({"k": [1, 2], "v": [1, 2],
                                    "_change_type": ["insert", "insert"]}))
    sink.add_batch(1, pl.DataFrame({"k": [1, 1, 2], "v": [1, 5, 2],
                                    "_change_type": ["update_preimage", "update_postimage",
                                                     "delete"]}))
    sink.close()
    messages = consume_all(bootstrap, topic)
    assert [(m.key(), m.value()) for m in messages] == [
        (b'{"k":1}', b'{"k":1,"v":1}'), (b'{"k":2}', b'{"k":2,"v":2}'),
        (b'{"k":1}', b'{"k":1,"v":5}'), (b'{"k":2}', None),
    ]
    assert [dict(m.headers())["mb_batch_id"] for m in messages] == [b"0", b"0", b"1", b"1"]


def test_update_mode_without_change_type_is_unchanged(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    sink = opened(bootstrap, topic, "update", keys=("k",))
    sink.add_batch(0, pl.DataFrame({"k": [1, 1], "v": [1, 2]}))
    sink.close()
    assert [(m.key(), m.value()) for m in consume_all(bootstrap, topic)] == [
        (None, b'{"k":1,"v":1}'), (None, b'{"k":1,"v":2}'),
    ]


def test_a_tombstone_needs_a_key(bootstrap: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(1)
    sink = opened(bootstrap, topic, "update", keys=())
    with pytest.raises(SinkConfigError, match="pass key= to write_kafka"):
        sink.add_batch(0, pl.DataFrame({"k": [1], "_change_type": ["delete"]}))
    assert sink.last_committed_batch() is None
    sink.close()


@settings(max_examples=3, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations, cut_at=cuts)
def test_changelog_mode_writes_every_change_in_order(
    bootstrap: str, new_topic: Callable[..., str], ops, cut_at
) -> None:
    topic = new_topic(3)
    batches = change_batches(ops, cut_at)
    sink = opened(bootstrap, topic, "changelog")
    for batch_id, frame in enumerate(batches):
        sink.add_batch(batch_id, frame)
    sink.add_batch(len(batches) - 1, batches[-1])
    sink.close()
    messages = consume_all(bootstrap, topic)
    rows = pl.DataFrame([json.loads(m.value()) for m in messages],
                        schema=pl.concat(batches).schema)
    assert_frame_equal(rows, pl.concat(batches), check_row_order=False)
    # per key, the records are the key's changes in order: applying them gives the table
    by_partition = sorted(messages, key=lambda m: (m.partition(), m.offset()))
    in_order = pl.DataFrame([json.loads(m.value()) for m in by_partition],
                            schema=rows.schema)
    assert_frame_equal(oracle([in_order]), oracle(batches))
