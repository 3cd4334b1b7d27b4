"""Kafka changelog formats against a real broker: Debezium JSON envelopes and upsert
topics, read (``read_kafka(format=...)``) and written (``write_kafka(format=...)``)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka_helpers import consume_all, produce

import microbatch as mb
from microbatch.exceptions import PlanError
from microbatch.sources.base import SourceContext
from microbatch.sources.kafka import KafkaSource
from sinks.base import SinkContext
from sinks.changelog import CHANGE_TYPE, split_changes
from sinks.exceptions import SinkConfigError
from sinks.kafka import KafkaSink

pytestmark = pytest.mark.kafka

SCHEMA = {"id": pl.Int64, "name": pl.String, "amount": pl.Float64,
          "ts": pl.Datetime("ms", "UTC")}
NO_META: list[str] = []


def ts(second: int) -> datetime:
    return datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC)


def changes(rows: list[tuple[int, str | None, float | None, int, str]]) -> pl.DataFrame:
    """A changelog frame from ``(id, name, amount, second, change type)`` tuples."""
    return pl.DataFrame(
        {"id": [r[0] for r in rows], "name": [r[1] for r in rows],
         "amount": [r[2] for r in rows], "ts": [ts(r[3]) for r in rows],
         CHANGE_TYPE: [r[4] for r in rows]},
        schema={**SCHEMA, CHANGE_TYPE: pl.String},
    )


BATCHES = [
    changes([(1, "a", 1.5, 1, "insert"), (2, "b", 2.0, 2, "insert"),
             (3, "c", 3.25, 3, "insert")]),
    changes([(1, "a", 1.5, 1, "update_preimage"), (1, "aa", 10.0, 4, "update_postimage"),
             (2, "b", 2.0, 2, "delete"), (4, "d", -1.0, 5, "insert")]),
    changes([(1, "aa", 10.0, 4, "delete"), (3, "c", 3.25, 3, "update_preimage"),
             (3, "cc", 0.5, 6, "update_postimage"), (2, "b2", 7.0, 7, "insert")]),
]
"""Three batches of changes, ending with the table {2: b2, 3: cc, 4: d}."""


def applied(frame: pl.DataFrame) -> pl.DataFrame:
    """The oracle: the table that applying every change in order gives."""
    upserts, _ = split_changes(frame, ["id"])
    return upserts.sort("id")


def write_direct(bootstrap: str, topic: str, fmt: str, query_id: str, **kw: Any) -> None:
    sink = KafkaSink(topic, bootstrap=bootstrap, format=fmt, key_columns=["id"],  # type: ignore[arg-type]
                     **kw)
    sink.open(SinkContext(query_id=query_id))
    try:
        for n, frame in enumerate(BATCHES):
            sink.add_batch(n, frame)
        sink.add_batch(2, BATCHES[2])  # a replay: a no-op, as for every format
    finally:
        sink.close()


def read_all(bootstrap: str, topic: str, fmt: str, tmp_path: Path, table_name: str,
             **kw: Any) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Every row of ``topic`` through a query, and the query's dead letters."""
    chk = tmp_path / "chk"
    q = (mb.read_kafka(topic, bootstrap=bootstrap, format=fmt, schema=SCHEMA,  # type: ignore[arg-type]
                       metadata_columns=["partition", "offset"], **kw)
         .write_memory(table_name).start(checkpoint=chk, trigger="available-now"))
    assert q.await_termination(60)
    dead_dir = chk / "dead_letter"
    dead = mb.parquet_table(dead_dir) if dead_dir.exists() else pl.DataFrame()
    return mb.table(table_name).sort("partition", "offset", maintain_order=True), dead


# ---------------------------------------------------------------- debezium-json


def test_debezium_written_then_read_back_gives_the_same_changes(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path, table_name: str
) -> None:
    topic = new_topic(1)
    write_direct(bootstrap, topic, "debezium-json", "q-dbz")
    msgs = consume_all(bootstrap, topic)
    # an independent client: one envelope per change (a pre/post pair is one 'u'),
    # and a tombstone with the same key right after each 'd'
    got = [(json.loads(m.key()), None if m.value() is None else json.loads(m.value()))
           for m in msgs]
    ops = [None if v is None else v["op"] for _, v in got]
    assert ops == ["c", "c", "c", "u", "d", None, "c", "d", None, "u", "c"]
    assert [k["id"] for k, _ in got] == [1, 2, 3, 1, 2, 2, 4, 1, 1, 3, 2]
    update = got[3][1]
    assert {k: v for k, v in update["before"].items() if k != "ts"} == \
        {"id": 1, "name": "a", "amount": 1.5}
    assert {k: v for k, v in update["after"].items() if k != "ts"} == \
        {"id": 1, "name": "aa", "amount": 10.0}
    assert update["after"]["ts"].startswith("2026-01-01T00:00:04")
    assert got[4][1]["before"]["id"] == 2
    assert got[4][1]["after"] is None
    assert got[0][1]["before"] is None
    assert got[0][1]["source"] == {"connector": "microbatch", "query_id": "q-dbz", "batch_id": 0}
    rows, dead = read_all(bootstrap, topic, "debezium-json", tmp_path, table_name)
    assert dead.height == 0
    expected = pl.concat(BATCHES)
    assert rows.drop("partition", "offset").equals(expected)
    assert applied(rows.drop("partition", "offset")).equals(applied(expected))


def test_debezium_without_tombstones_and_keyed_by_an_expression(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    sink = KafkaSink(topic, bootstrap=bootstrap, format="debezium-json", key="name",
                     tombstones_on_delete=False)
    sink.open(SinkContext(query_id="q-dbz-nt"))
    sink.add_batch(0, BATCHES[1])
    sink.close()
    msgs = consume_all(bootstrap, topic)
    assert all(m.value() is not None for m in msgs)
    assert [m.key() for m in msgs] == [b"aa", b"b", b"d"]
    assert [json.loads(m.value())["op"] for m in msgs] == ["u", "d", "c"]


def envelope(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> bytes:
    return json.dumps({"before": before, "after": after, "op": op, "ts_ms": 1767225600000,
                       "source": {"connector": "postgresql", "table": "t"}}).encode()


def test_hand_written_debezium_envelopes_and_malformed_ones(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path, table_name: str
) -> None:
    topic = new_topic(1)
    a = {"id": 1, "name": "a", "amount": 1.0, "ts": "2026-01-01T00:00:01Z"}
    a2 = {"id": 1, "name": "a2", "amount": 2.0, "ts": "2026-01-01T00:00:02Z"}
    b = {"id": 2, "name": "b", "amount": None, "ts": None}
    values: list[bytes | None] = [
        envelope("r", None, a),                                        # 0 snapshot read
        json.dumps({"schema": {"type": "struct"},                      # 1 JsonConverter wrapper
                    "payload": json.loads(envelope("c", None, b))}).encode(),
        envelope("u", a, a2),                                          # 2 pre + post
        b"{not json",                                                  # 3 bad JSON
        envelope("x", None, a),                                        # 4 unknown op
        envelope("c", None, None),                                     # 5 c without after
        envelope("d", b, None),                                        # 6 delete
        None,                                                          # 7 tombstone: skipped
        envelope("u", {"id": "one"}, a2),                              # 8 image of wrong type
        envelope("u", None, {**a2, "name": "a3"}),                     # 9 u without before
        envelope("d", None, None),                                     # 10 d without before
    ]
    produce(bootstrap, topic, values, keys=[b'{"id": 1}'] * len(values))
    rows, dead = read_all(bootstrap, topic, "debezium-json", tmp_path, table_name)
    assert rows.columns == [*SCHEMA, CHANGE_TYPE, "partition", "offset"]
    assert rows.select("offset", "id", "name", CHANGE_TYPE).rows() == [
        (0, 1, "a", "insert"),
        (1, 2, "b", "insert"),
        (2, 1, "a", "update_preimage"),
        (2, 1, "a2", "update_postimage"),
        (6, 2, "b", "delete"),
        (9, 1, "a3", "update_postimage"),
    ]
    assert rows["ts"][0] == ts(1)
    reasons = {int(loc.rsplit("@", 1)[1]): r
               for loc, r in zip(dead["location"], dead["reason"], strict=True)}
    assert sorted(reasons) == [3, 4, 5, 8, 10]
    assert "invalid JSON" in reasons[3]
    assert "unknown Debezium op x" in reasons[4]
    assert "'c' without an 'after'" in reasons[5]
    assert "column 'id'" in reasons[8]
    assert "'d' without a 'before'" in reasons[10]
    raw = dict(zip(dead["location"], dead["raw"], strict=True))
    assert raw[f"{topic}:0@4"] == values[4]


BIG = 60


def big_envelopes() -> list[bytes | None]:
    """Inserts, updates (two rows from one record), deletes with tombstones, and a
    few malformed envelopes, in one partition."""
    out: list[bytes | None] = []
    for i in range(BIG):
        row = {"id": i % 9, "name": f"n{i}", "amount": float(i), "ts": None}
        prev = {**row, "name": f"n{i - 1}"}
        kind = i % 5
        if kind == 0:
            out.append(envelope("c", None, row))
        elif kind in (1, 2):
            out.append(envelope("u", prev, row))
        elif kind == 3:
            out.extend([envelope("d", row, None), None])
        else:
            out.append(b"[1]" if i % 10 == 4 else envelope("r", None, row))
    return out


@pytest.fixture(scope="module")
def big_topic(kafka_broker: Any) -> str:
    from sinks.kafka_client import create_topics

    name = "dbz-splits"
    create_topics(kafka_broker.bootstrap, [name], partitions=1, replication_factor=1)
    produce(kafka_broker.bootstrap, name, big_envelopes())
    return name


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(1, len(big_envelopes()) - 1), max_size=8, unique=True))
def test_any_split_into_batches_gives_the_same_change_sequence(
    bootstrap: str, big_topic: str, cuts: list[int]
) -> None:
    n = len(big_envelopes())
    src = KafkaSource(big_topic, bootstrap=bootstrap, format="debezium-json", schema=SCHEMA,
                      metadata_columns=["offset"])
    src.open(SourceContext("0", None))
    try:
        whole = src.read({f"{big_topic}:0": 0}, {f"{big_topic}:0": n})
        bounds = [0, *sorted(cuts), n]
        parts = [src.read({f"{big_topic}:0": a}, {f"{big_topic}:0": b})
                 for a, b in itertools.pairwise(bounds)]
    finally:
        src.close()
    assert pl.concat([p.data for p in parts]).equals(whole.data)
    assert pl.concat([p.dead_letters for p in parts]).equals(whole.dead_letters)
    # the one-shot oracle: every good envelope's rows, in record order
    expected: list[tuple[int, str]] = []
    for i in range(BIG):
        kind = i % 5
        if kind == 0 or (kind == 4 and i % 10 != 4):
            expected.append((i % 9, "insert"))
        elif kind in (1, 2):
            expected += [(i % 9, "update_preimage"), (i % 9, "update_postimage")]
        elif kind == 3:
            expected.append((i % 9, "delete"))
    assert whole.data.select("id", CHANGE_TYPE).rows() == expected
    assert whole.dead_letters.height == BIG // 10


# ---------------------------------------------------------------- upsert


def test_upsert_written_then_read_back_is_the_same_table(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path, table_name: str
) -> None:
    topic = new_topic(1)
    write_direct(bootstrap, topic, "upsert", "q-ups")
    msgs = consume_all(bootstrap, topic)
    # an independent client: key = key columns as JSON, value = the row, tombstone = delete
    assert [json.loads(m.key()) for m in msgs] == [{"id": i} for i in (1, 2, 3, 1, 2, 4, 1, 3, 2)]
    values = [None if m.value() is None else json.loads(m.value()) for m in msgs]
    assert [v is None for v in values] == [False, False, False, False, True, False, True,
                                           False, False]
    assert values[3] is not None
    assert values[3]["name"] == "aa"
    assert values[0] is not None
    assert CHANGE_TYPE not in values[0]
    rows, dead = read_all(bootstrap, topic, "upsert", tmp_path, table_name, key_columns=["id"])
    assert dead.height == 0
    expected = pl.concat(BATCHES).filter(pl.col(CHANGE_TYPE) != "update_preimage")
    got = rows.drop("partition", "offset")
    assert got[CHANGE_TYPE].to_list() == [
        "delete" if c == "delete" else "update_postimage" for c in expected[CHANGE_TYPE]
    ]
    assert got["id"].to_list() == expected["id"].to_list()
    deletes = got.filter(pl.col(CHANGE_TYPE) == "delete")
    assert deletes.select("name", "amount", "ts").null_count().row(0) == (2, 2, 2)
    assert applied(got).equals(applied(pl.concat(BATCHES)))


def test_upsert_from_a_query_in_update_mode_keyed_by_its_group_keys(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path, table_name: str
) -> None:
    topic = new_topic(3)
    source = pl.DataFrame({"k": [i % 4 for i in range(40)], "x": list(range(40))})
    stream = mb.read_memory([source.slice(i, 10) for i in range(0, 40, 10)])
    q = (stream.group_by("k").agg(pl.col("x").sum().alias("total"))
         .write_kafka(topic, bootstrap=bootstrap, format="upsert", output_mode="update")
         .start(checkpoint=tmp_path / "w", trigger="available-now"))
    assert q.await_termination(60)
    oracle = source.group_by("k").agg(pl.col("x").sum().alias("total")).sort("k")
    back = (mb.read_kafka(topic, bootstrap=bootstrap, format="upsert", key_columns=["k"],
                          schema={"k": pl.Int64, "total": pl.Int64}, metadata_columns=NO_META)
            .write_memory(table_name).start(checkpoint=tmp_path / "r", trigger="available-now"))
    assert back.await_termination(60)
    got = mb.table(table_name)
    assert set(got[CHANGE_TYPE]) == {"update_postimage"}
    # each key lives on one partition, so its last record is its current value
    last = {json.loads(m.key())["k"]: json.loads(m.value())["total"]
            for m in consume_all(bootstrap, topic)}
    assert last == dict(oracle.rows())
    assert got.group_by("k").agg(pl.col("total").max()).sort("k").equals(oracle)


def test_hand_written_upsert_records(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path, table_name: str
) -> None:
    topic = new_topic(1)
    keys: list[bytes | None] = [b'{"id": 1}', b'{"id": 2}', b'{"id": 1}', None, b"nope",
                                b'{"id": 2}']
    values: list[bytes | None] = [
        json.dumps({"id": 1, "name": "a", "amount": 1.0, "ts": None}).encode(),
        json.dumps({"id": 2, "name": "b", "amount": 2.0, "ts": None}).encode(),
        None,                      # delete of id 1
        None,                      # a tombstone without a key: a dead letter
        None,                      # a tombstone whose key is not JSON: a dead letter
        b'{"id": "two"}',          # id of the wrong type: a dead letter
    ]
    produce(bootstrap, topic, values, keys=keys)
    rows, dead = read_all(bootstrap, topic, "upsert", tmp_path, table_name, key_columns="id")
    assert rows.select("offset", "id", "name", CHANGE_TYPE).rows() == [
        (0, 1, "a", "update_postimage"), (1, 2, "b", "update_postimage"), (2, 1, None, "delete"),
    ]
    reasons = {int(loc.rsplit("@", 1)[1]): r
               for loc, r in zip(dead["location"], dead["reason"], strict=True)}
    assert sorted(reasons) == [3, 4, 5]
    assert "no key" in reasons[3]
    assert "invalid JSON" in reasons[4]
    assert "column 'id'" in reasons[5]


# ---------------------------------------------------------------- options


def test_options_are_checked_with_the_fix_in_the_message(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    with pytest.raises(PlanError, match="needs key_columns"):
        mb.read_kafka("t", bootstrap="x:1", format="upsert", schema=SCHEMA)
    with pytest.raises(PlanError, match="key_columns is for format='upsert'"):
        mb.read_kafka("t", bootstrap="x:1", format="json", schema=SCHEMA, key_columns=["id"])
    with pytest.raises(PlanError, match="must be distinct columns"):
        mb.read_kafka("t", bootstrap="x:1", format="upsert", schema=SCHEMA, key_columns=["zz"])
    with pytest.raises(PlanError, match="leave it out of the schema"):
        mb.read_kafka("t", bootstrap="x:1", format="debezium-json",
                      schema={**SCHEMA, CHANGE_TYPE: pl.String})
    with pytest.raises(SinkConfigError, match=r"key_columns=\[\.\.\.\] instead of key="):
        KafkaSink("t", bootstrap="x:1", format="upsert", key="id")
    with pytest.raises(SinkConfigError, match="not both"):
        KafkaSink("t", bootstrap="x:1", format="debezium-json", key="id", key_columns=["id"])
    topic = new_topic(1)
    sink = KafkaSink(topic, bootstrap=bootstrap, format="upsert")
    with pytest.raises(SinkConfigError, match="pass key_columns"):
        sink.open(SinkContext(query_id="q-nokeys"))
    bad = KafkaSink(topic, bootstrap=bootstrap, format="debezium-json", key_columns=["id"])
    bad.open(SinkContext(query_id="q-badct"))
    try:
        with pytest.raises(Exception, match="not one of"):
            bad.add_batch(0, BATCHES[0].with_columns(pl.lit("upsert").alias(CHANGE_TYPE)))
    finally:
        bad.close()
    assert consume_all(bootstrap, topic) == []


# ---------------------------------------------------------------- Kafka's own Java client

JVM_DUMP = Path(__file__).parent / "jvm" / "DumpTopic.java"


@pytest.fixture(scope="module")
def jvm_dump(kafka_broker: Any, tmp_path_factory: pytest.TempPathFactory
             ) -> Callable[[str, str], list[tuple[int, int, bytes | None, bytes | None]]]:
    """Reads a topic with Kafka's Java consumer (the jars the broker runs on):
    ``(partition, offset, key, value)`` per record, ``None`` for a null."""
    import base64
    import shutil
    import subprocess

    from scripts.kafka_broker import fetched_version, lib_dir

    version = fetched_version()
    javac = shutil.which("javac")
    if version is None or javac is None:
        pytest.fail("the JVM read-back needs the broker's cached jars and javac (JDK 17)",
                    pytrace=False)
    classpath = f"{lib_dir(version)}/*"
    classes = tmp_path_factory.mktemp("jvm")
    subprocess.run([javac, "-cp", classpath, "-d", str(classes), str(JVM_DUMP)],
                   check=True, capture_output=True, timeout=120)

    def nullable(field: str) -> bytes | None:
        return None if field == "-" else base64.b64decode(field)

    def dump(bootstrap: str, topic: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
        done = subprocess.run(
            ["java", "-cp", f"{classes}:{classpath}", "DumpTopic", bootstrap, topic],
            capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        records = []
        for line in done.stdout.splitlines():
            partition, offset, key, value = line.split("\t")
            records.append((int(partition), int(offset), nullable(key), nullable(value)))
        return sorted(records)

    return dump


def table_from_records(records: list[tuple[int, int, bytes | None, bytes | None]],
                       fmt: str) -> dict[int, dict[str, Any]]:
    """The table a consumer builds from the records, decoded here with ``json`` only:
    Debezium ``c``/``u`` set ``after``, ``d`` removes ``before``'s key and a tombstone
    is nothing; upsert sets the value, a tombstone removes the record key."""
    table: dict[int, dict[str, Any]] = {}
    for _, _, key, value in records:
        if fmt == "upsert":
            assert key is not None
            ident = json.loads(key)["id"]
            if value is None:
                table.pop(ident, None)
            else:
                table[ident] = json.loads(value)
        elif value is not None:
            env = json.loads(value)
            if env["op"] == "d":
                table.pop(env["before"]["id"])
            else:
                table[env["after"]["id"]] = env["after"]
    return table


@pytest.mark.parametrize("fmt", ["debezium-json", "upsert"])
def test_kafkas_java_client_reads_back_the_same_records_and_table(
    bootstrap: str, new_topic: Callable[..., str], jvm_dump: Any, fmt: str
) -> None:
    topic = new_topic(3)
    write_direct(bootstrap, topic, fmt, f"q-jvm-{fmt}")
    jvm = jvm_dump(bootstrap, topic)
    ours = sorted((m.partition(), m.offset(), m.key(), m.value())
                  for m in consume_all(bootstrap, topic))
    assert jvm == ours  # the same committed records, tombstones (null values) included
    assert any(value is None for *_, value in jvm)  # deletes reached the topic as tombstones
    want = applied(pl.concat(BATCHES))
    got = table_from_records(jvm, fmt)
    assert sorted(got) == want["id"].to_list()
    assert [got[i]["name"] for i in sorted(got)] == want["name"].to_list()
    assert [got[i]["amount"] for i in sorted(got)] == want["amount"].to_list()
