"""The Kafka source against a real broker: exact ranges, replays, crashes, data loss."""

from __future__ import annotations

import itertools
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka_helpers import Broker, consume_all, produce, produce_json, run_with_kills

import microbatch as mb
from microbatch.sources.base import SourceContext
from microbatch.sources.kafka import KafkaSource

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = {"event_id": pl.Int64, "card_id": pl.Int64, "amount": pl.Float64}


def events(n: int, start: int = 0) -> list[dict[str, object]]:
    return [{"event_id": i, "card_id": i % 7, "amount": float(i % 50)}
            for i in range(start, start + n)]


def opened(src: KafkaSource) -> KafkaSource:
    src.open(SourceContext("0", None))
    return src


def test_exact_ranges_per_partition_and_replay(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(3)
    rows = events(300)
    produce_json(bootstrap, topic, rows, partitions=[r["event_id"] % 3 for r in rows])
    src = opened(KafkaSource(topic, bootstrap=bootstrap, schema=SCHEMA, max_records_per_batch=90))
    try:
        start = src.initial_offset()
        assert start == {f"{topic}:{p}": 0 for p in range(3)}
        end = src.latest_offset(start)
        assert end == {f"{topic}:{p}": 30 for p in range(3)}  # the cap split by backlog
        full = src.latest_offset(start, capped=False)
        assert full == {f"{topic}:{p}": 100 for p in range(3)}
        assert src.lag() == {f"{topic}:{p}": 100 for p in range(3)}
        middle = {f"{topic}:0": 10, f"{topic}:1": 95, f"{topic}:2": 0}
        stop = {f"{topic}:0": 20, f"{topic}:1": 100, f"{topic}:2": 3}
        first = src.read(middle, stop)
        data = first.data
        assert data["partition"].to_list() == [0] * 10 + [1] * 5 + [2] * 3
        assert data["offset"].to_list() == [*range(10, 20), *range(95, 100), *range(0, 3)]
        assert data["event_id"].to_list() == [p + 3 * o for p, o in
                                              zip(data["partition"], data["offset"], strict=True)]
        assert first.partitions is not None
        assert first.partitions.to_list() == data["partition"].to_list()
        again = src.read(middle, stop)  # a replay of the same range: same rows
        assert again.data.equals(data)
        everything = src.read(start, full)
        assert sorted(everything.data["event_id"].to_list()) == list(range(300))
        src.commit(full)
        assert src.lag() == {f"{topic}:{p}": 0 for p in range(3)}
        assert src.compare(start, full) == -1
        assert src.compare(full, full) == 0
        assert src.bound(full, stop) == {f"{topic}:0": 20, f"{topic}:1": 100, f"{topic}:2": 3}
    finally:
        src.close()


def test_a_flooding_partition_is_paused_and_resumed_without_losing_a_record(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """Partition 0 holds 20x the others: librdkafka delivers it in large chunks while a
    read waits for partitions 1 and 2, so its surplus is bounded by pausing it; resumed,
    it continues at the next undelivered offset. Every record is read once, in order."""
    topic = new_topic(3)
    sizes = {0: 60_000, 1: 3_000, 2: 3_000}
    parts = [p for p, n in sizes.items() for _ in range(n)]
    counters = dict.fromkeys(sizes, 0)
    values = []
    for p in parts:
        values.append(f"{p}:{counters[p]}".encode())
        counters[p] += 1
    produce(bootstrap, topic, values, partitions=parts)
    src = opened(KafkaSource(topic, bootstrap=bootstrap, format="raw",
                             max_records_per_batch=2_000, metadata_columns=("partition",)))
    got: dict[int, list[str]] = {p: [] for p in sizes}
    paused_seen, held_max = False, 0
    try:
        start = src.initial_offset()
        full = src.latest_offset(start, capped=False)
        while start != full:
            end = src.latest_offset(start)
            batch = src.read(start, end).data
            for p, value in zip(batch["partition"], batch["value"], strict=True):
                got[p].append(value.decode())
            paused_seen |= bool(src._paused)
            held_max = max([held_max, *map(len, src._leftover.values())])
            start = end
    finally:
        src.close()
    assert {p: len(v) for p, v in got.items()} == sizes
    assert all(v == [f"{p}:{i}" for i in range(sizes[p])] for p, v in got.items())
    assert paused_seen, "the test did not exercise pausing: partition 0 never piled up"
    assert held_max <= src._leftover_limit + 100_000  # + one consume() result at most


def test_a_paused_partition_read_again_from_an_earlier_offset_delivers(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """A re-read (a batch re-run, a read-ahead that guessed another range) moves a
    paused partition back: it must be resumed, or it never delivers again and the
    read stalls until broker_timeout."""
    topic = new_topic(3)
    sizes = {0: 60_000, 1: 3_000, 2: 3_000}
    parts = [p for p, n in sizes.items() for _ in range(n)]
    produce(bootstrap, topic, [f"{p}".encode() for p in parts], partitions=parts)
    src = opened(KafkaSource(topic, bootstrap=bootstrap, format="raw", broker_timeout="20s",
                             max_records_per_batch=2_000, metadata_columns=("partition",)))
    try:
        start = src.initial_offset()
        end = src.latest_offset(start)
        first = src.read(start, end).data
        second_end = src.latest_offset(end)
        src.read(end, second_end)
        paused = set(src._paused)
        assert f"{topic}:0" in {f"{t}:{p}" for t, p in paused}, "partition 0 was not paused"
        t0 = time.monotonic()
        again = src.read(start, end).data  # moves every partition back, the paused one too
        assert again.equals(first)
        assert time.monotonic() - t0 < 10
    finally:
        src.close()


def _transactional(bootstrap: str, topic: str, batches: list[tuple[list[int], bool]]) -> None:
    """Write each batch of event ids (partition = id % 2) in a transaction, committed
    or aborted: every commit and abort leaves a marker, every aborted record an offset
    that read_committed never shows (gaps in the offsets a read sees)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic})
    producer.init_transactions(30)
    for ids, commit in batches:
        producer.begin_transaction()
        for i in ids:
            producer.produce(topic, json.dumps(events(1, i)[0]).encode(), partition=i % 2)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)


def test_offset_gaps_read_exactly_in_random_batches(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """Transaction markers and aborted records leave gaps in a partition's offsets:
    any split of the offsets into consecutive ranges (hypothesis) reads every
    committed record once, in its range, with the offset and timestamp the broker
    gives a plain consumer (the oracle)."""
    topic = new_topic(2)
    _transactional(bootstrap, topic, [(list(range(i * 40, i * 40 + 40)), i % 3 != 1)
                                      for i in range(6)])
    oracle = {(m.partition(), m.offset()): (json.loads(m.value())["event_id"], m.timestamp()[1])
              for m in consume_all(bootstrap, topic)}
    assert len(oracle) == 160  # two of six transactions aborted
    src = opened(KafkaSource(topic, bootstrap=bootstrap, schema=SCHEMA,
                             metadata_columns=("partition", "offset", "timestamp")))
    try:
        ends = src.latest_offset(src.initial_offset())
        high = [ends[f"{topic}:{p}"] for p in range(2)]
        assert high[0] > 80, "no gaps: the markers are missing"

        @settings(max_examples=12, deadline=None)
        @given(cuts=st.lists(st.tuples(st.integers(0, high[0]), st.integers(0, high[1])),
                             max_size=5))
        def split(cuts: list[tuple[int, int]]) -> None:
            bounds = [(0, 0), *sorted(cuts), (high[0], high[1])]
            bounds = [tuple(max(b[p] for b in bounds[: i + 1]) for p in range(2))
                      for i in range(len(bounds))]
            seen: dict[tuple[int, int], tuple[int, int]] = {}
            for a, b in itertools.pairwise(bounds):
                got = src.read({f"{topic}:{p}": a[p] for p in range(2)},
                               {f"{topic}:{p}": b[p] for p in range(2)}).data
                for p, o, e, ts in got.select(
                    "partition", "offset", "event_id", pl.col("timestamp").dt.epoch("ms")
                ).iter_rows():
                    assert a[p] <= o < b[p]
                    assert (p, o) not in seen
                    seen[(p, o)] = (e, ts)
            assert seen == oracle

        split()
    finally:
        src.close()


def test_query_reads_everything_once_with_per_partition_watermarks(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path, table_name: str
) -> None:
    topic = new_topic(3)
    rows = [{"k": i % 3, "ts": f"2026-01-01T00:00:{i % 60:02d}Z"} for i in range(120)]
    produce_json(bootstrap, topic, rows, partitions=[i % 3 for i in range(120)])
    stream = mb.read_kafka(topic, bootstrap=bootstrap,
                           schema={"k": pl.Int64, "ts": pl.Datetime("ms", "UTC")},
                           max_records_per_batch=50, commit_group=f"lag-{topic}")
    q = (stream.with_watermark("ts", "5s").select("k", "ts", "partition", "offset")
         .write_memory(table_name).start(checkpoint=tmp_path / "chk", trigger="available-now"))
    q.await_termination(60)
    got = mb.table(table_name)
    assert got.height == 120
    assert got.select("partition", "offset").n_unique() == 120
    assert q.last_progress is not None
    source = stream.plan.sources()[0]
    assert source.metrics()["lag"] == {f"{topic}:{p}": 0 for p in range(3)}
    assert "lag" not in q.last_progress["sources"][0]["description"]  # static, fingerprinted
    commits = sorted((tmp_path / "chk" / "commits").iterdir())
    assert len(commits) >= 3  # 120 records, 50 per batch
    from confluent_kafka import Consumer, TopicPartition

    group = Consumer({"bootstrap.servers": bootstrap, "group.id": f"lag-{topic}"})
    committed = group.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
    group.close()
    assert [tp.offset for tp in committed] == [40, 40, 40]  # lag tools see the query


def test_starting_offsets_latest_and_timestamp(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    from confluent_kafka import Producer

    topic = new_topic(2)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(20):
        producer.produce(topic, json.dumps({"event_id": i}).encode(), partition=i % 2,
                         timestamp=1_700_000_000_000 + i * 1000)
    producer.flush(30)
    latest = opened(KafkaSource(topic, bootstrap=bootstrap, format="raw",
                                starting_offsets="latest"))
    assert latest.initial_offset() == {f"{topic}:0": 10, f"{topic}:1": 10}
    latest.close()
    by_time = opened(KafkaSource(topic, bootstrap=bootstrap, format="raw",
                                 starting_offsets=1_700_000_000_000 + 10_000))
    assert by_time.initial_offset() == {f"{topic}:0": 5, f"{topic}:1": 5}
    by_time.close()
    explicit = opened(KafkaSource(topic, bootstrap=bootstrap, format="raw",
                                  starting_offsets={1: 7}))
    assert explicit.initial_offset() == {f"{topic}:0": 0, f"{topic}:1": 7}
    explicit.close()


def test_new_partition_is_picked_up_from_its_beginning(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path, table_name: str
) -> None:
    from confluent_kafka.admin import AdminClient, NewPartitions

    topic = new_topic(2)
    produce_json(bootstrap, topic, events(20), partitions=[i % 2 for i in range(20)])
    q = mb.read_kafka(topic, bootstrap=bootstrap, schema=SCHEMA).write_memory(table_name).start(
        checkpoint=tmp_path / "chk")
    try:
        q.process_all_available()
        assert mb.table(table_name).height == 20
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
        deadline = time.monotonic() + 30
        while len(admin.list_topics(topic=topic, timeout=10).topics[topic].partitions) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        produce_json(bootstrap, topic, events(10, start=100), partitions=[2] * 10)
        deadline = time.monotonic() + 30
        while mb.table(table_name).height < 30 and time.monotonic() < deadline:
            q.process_all_available()
            time.sleep(0.1)
    finally:
        q.stop()
    got = mb.table(table_name)
    assert sorted(got["event_id"].to_list()) == [*range(20), *range(100, 110)]
    assert got.filter(pl.col("partition") == 2)["offset"].to_list() == list(range(10))


def test_malformed_values_go_to_dead_letters_and_good_ones_are_kept(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path, table_name: str
) -> None:
    topic = new_topic(1)
    values: list[bytes | None] = []
    bad_offsets = {}
    for i in range(200):
        if i % 17 == 5:
            values.append(b'{"event_id": ' + str(i).encode() + b', "card_id": oops}')
            bad_offsets[i] = "invalid JSON"
        elif i % 29 == 3:
            values.append(json.dumps({"event_id": i, "card_id": "x", "amount": 1}).encode())
            bad_offsets[i] = "column 'card_id'"
        elif i == 50:
            values.append(None)
            bad_offsets[i] = "tombstone"
        elif i == 60:
            values.append(b"[1, 2]")
            bad_offsets[i] = "invalid JSON"
        else:
            values.append(json.dumps({"event_id": i, "card_id": i, "amount": 2.5}).encode())
    produce(bootstrap, topic, values)
    chk = tmp_path / "chk"
    q = mb.read_kafka(topic, bootstrap=bootstrap, schema=SCHEMA, max_records_per_batch=64) \
        .write_memory(table_name).start(checkpoint=chk, trigger="available-now")
    q.await_termination(60)
    got = mb.table(table_name)
    assert sorted(got["event_id"].to_list()) == sorted(set(range(200)) - set(bad_offsets))
    dead = mb.parquet_table(chk / "dead_letter").sort("location")
    assert dead.height == len(bad_offsets)
    where = {int(loc.rsplit("@", 1)[1]): reason
             for loc, reason in zip(dead["location"], dead["reason"], strict=True)}
    assert set(where) == set(bad_offsets)
    for offset, expected in bad_offsets.items():
        assert expected in where[offset], (offset, where[offset])
    assert all(loc.startswith(f"{topic}:0@") for loc in dead["location"])
    raw = dict(zip(dead["location"], dead["raw"], strict=True))
    assert raw[f"{topic}:0@5"] == values[5]
    assert sum(p["dead_letter_rows"] for p in q.recent_progress) == len(bad_offsets)


@pytest.mark.parametrize("mode", ["fail", "skip"])
def test_records_deleted_from_the_broker(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path, table_name: str, mode: str
) -> None:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    topic = new_topic(2)
    produce_json(bootstrap, topic, events(100), partitions=[i % 2 for i in range(100)])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_records([TopicPartition(topic, 0, 20)], request_timeout=30)
    for fut in futures.values():
        fut.result()
    stream = mb.read_kafka(topic, bootstrap=bootstrap, schema=SCHEMA, on_data_loss=mode,
                           starting_offsets={0: 0, 1: 0})
    q = stream.write_memory(table_name).start(checkpoint=tmp_path / "chk", trigger="available-now")
    if mode == "fail":
        with pytest.raises(mb.QueryTerminatedError) as info:
            q.await_termination(60)
        message = str(info.value.__cause__)
        assert f"{topic}:0: offsets [0, 20)" in message, message
        assert "on_data_loss='skip'" in message
        return
    q.await_termination(60)
    got = mb.table(table_name)
    lost = {2 * o for o in range(20)}  # partition 0 holds the even event ids
    assert sorted(got["event_id"].to_list()) == sorted(set(range(100)) - lost)
    assert stream.plan.sources()[0].metrics()["lost_records"] == 20


def test_kill9_mid_run_then_restart_gives_identical_output(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(3)
    rows = events(40_000)
    produce_json(bootstrap, topic, rows, partitions=[r["event_id"] % 3 for r in rows])
    chk, out = tmp_path / "chk", tmp_path / "out"
    cmd = [sys.executable, "-m", "microbatch.cli", "run", str(Path(__file__).parent /
           "job_kafka_to_parquet.py"), "--checkpoint", str(chk), "--trigger", "available-now",
           "--param", f"bootstrap={bootstrap}", "--param", f"topic={topic}",
           "--param", f"output={out}", "--param", "max_records_per_batch=400"]
    kills = run_with_kills(cmd, chk, tmp_path / "stderr.log", random.Random(5), kills=4)
    assert kills == 4
    got = mb.parquet_table(out)
    want = sorted(r["event_id"] for r in rows if r["amount"] >= 20)
    assert got.height == len(want), f"{got.height - len(want)} rows too many/few"
    assert sorted(got["event_id"].to_list()) == want


def test_broker_restart_mid_run_loses_and_duplicates_nothing(
    kafka_broker: Broker, new_topic: Callable[..., str], tmp_path: Path, table_name: str
) -> None:
    if not kafka_broker.restartable:
        pytest.skip("MICROBATCH_KAFKA_BOOTSTRAP names a broker these tests do not own; "
                    "the restart test needs the session's own broker")
    bootstrap = kafka_broker.bootstrap
    topic = new_topic(3)
    produce_json(bootstrap, topic, events(300), partitions=[i % 3 for i in range(300)])
    q = mb.read_kafka(topic, bootstrap=bootstrap, schema=SCHEMA, max_records_per_batch=100) \
        .write_memory(table_name).start(checkpoint=tmp_path / "chk")
    try:
        q.process_all_available()
        assert mb.table(table_name).height == 300
        kafka_broker.stop()
        time.sleep(1.5)  # the query keeps planning against a dead broker, retrying
        kafka_broker.start()
        produce_json(bootstrap, topic, events(300, start=1000),
                     partitions=[i % 3 for i in range(300)])
        deadline = time.monotonic() + 60
        while mb.table(table_name).height < 600 and time.monotonic() < deadline:
            assert q.exception is None, q.exception
            time.sleep(0.2)
        assert q.exception is None
    finally:
        q.stop()
    got = mb.table(table_name)
    assert sorted(got["event_id"].to_list()) == [*range(300), *range(1000, 1300)]
    assert len(consume_all(bootstrap, topic)) == 600
