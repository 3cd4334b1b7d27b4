"""Workers read their own splits: no row of a splittable source crosses the driver.

Files (JSON lines with a declared schema), a Delta table and a Kafka topic
(a real broker, with committed and aborted transactions) feed a windowed
aggregation on ``RayExecutor(workers=2)``; each run must equal the local
executor bit for bit (rows, dead letters, input rows per batch) and a
one-shot Polars oracle, while the driver-side source's ``read`` is never
called (counted) and the batch profile says the workers read and the driver
shipped no bytes. A batch whose driver is SIGKILLed after its write-ahead
entry is re-run from the recorded range: new files that arrived meanwhile are
not in it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import determinism_queries as queries
import polars as pl
import pytest

import microbatch as mb
from microbatch.checkpoint import Checkpoint
from microbatch.cli.jobfile import build_writer
from microbatch.observability.progress import load_progress
from microbatch.sources.delta import DeltaSource
from microbatch.sources.files import FileSource
from microbatch.sources.kafka import KafkaSource
from sinks import MemorySink

pytestmark = pytest.mark.slow

SCHEMA = {"card_id": pl.Int64, "amount": pl.Float64, "event_time": pl.Datetime("ms", "UTC")}
T0 = 1_767_225_600_000
JOB = Path(__file__).resolve().parent / "jobs" / "windowed_sessions.py"
_names = iter(range(10**6))


def payments(first: int, n: int, *, step_ms: int = 7) -> pl.DataFrame:
    """``n`` payments from event ``first`` on: event time ``step_ms`` apart (in
    order: no row is late), amounts in quarters (every sum is exact in any order)."""
    i = pl.int_range(first, first + n, eager=True)
    return pl.DataFrame({
        "card_id": (i * 7919) % 37,
        "amount": ((i * 31) % 400) * 0.25,
        "event_time": (T0 + i * step_ms).cast(pl.Datetime("ms", "UTC")),
    })


def windows(stream: mb.Stream) -> mb.Stream:
    return (stream.with_watermark("event_time", "2s")
            .group_by(mb.window("event_time", "1s"), "card_id")
            .agg(pl.len().alias("n"), pl.col("amount").sum().alias("total")))


def oracle(rows: pl.DataFrame, like: pl.DataFrame) -> pl.DataFrame:
    """The windows of ``rows`` computed at once, in ``like``'s columns and types."""
    start = pl.col("event_time").dt.truncate("1s")
    got = rows.group_by(start.alias("window_start"), "card_id").agg(
        pl.len().alias("n"), pl.col("amount").sum().alias("total"))
    got = got.with_columns((pl.col("window_start") + pl.duration(seconds=1)).alias("window_end"))
    return got.select(like.columns).cast(dict(like.schema))  # type: ignore[arg-type]


def _sorted(df: pl.DataFrame) -> pl.DataFrame:
    return queries.bits(df).sort(df.columns, nulls_last=True)


def count_driver_reads(monkeypatch: pytest.MonkeyPatch, cls: type) -> list[Any]:
    """Every call of ``cls.read`` in this process (the driver's), from now on."""
    calls: list[Any] = []
    real = cls.read

    def counted(self: Any, start: Any, end: Any) -> Any:
        calls.append((start, end))
        return real(self, start, end)

    monkeypatch.setattr(cls, "read", counted)
    return calls


def run(build: Callable[[MemorySink], mb.Stream], executor: mb.RayExecutor | None,
        chk: Path | None = None) -> tuple[pl.DataFrame, pl.DataFrame, list[dict[str, Any]]]:
    """Output rows, dead letters and data batches' progress records of one run."""
    n = next(_names)
    dead = MemorySink(f"reads-dead-{n}")
    query = build(dead).write_memory(f"reads-out-{n}").start(
        chk or tempfile.mkdtemp(prefix="mb-reads-"), trigger="available-now",
        executor=executor, flush_at_end=True)
    assert query.await_termination(300)
    if query.exception is not None:
        raise query.exception
    progress = [r for r in query.recent_progress if r["input_rows"]]
    return mb.table(f"reads-out-{n}"), mb.table(f"reads-dead-{n}"), progress


def assert_workers_read(
    build: Callable[[MemorySink], mb.Stream], cls: type, good_rows: pl.DataFrame,
    ray_cluster: str, monkeypatch: pytest.MonkeyPatch, *, dead_letters: int,
) -> list[dict[str, Any]]:
    """Local and Ray runs of ``build``: equal, equal to the oracle, no driver read
    on Ray; returns the Ray run's progress records."""
    calls = count_driver_reads(monkeypatch, cls)
    local, local_dead, local_progress = run(build, None)
    assert calls, "the local run reads on the driver (the counter works)"
    calls.clear()
    ray, ray_dead, ray_progress = run(
        build, mb.RayExecutor(workers=2, address=ray_cluster, shards=4))
    assert calls == [], "the driver read rows of a source its workers can read"
    assert local.height > 50
    assert local.schema == ray.schema
    assert _sorted(local).equals(_sorted(ray)), "the Ray run's rows differ from the local run's"
    assert _sorted(ray).equals(_sorted(oracle(good_rows, ray))), "the rows differ from the oracle"
    assert local_dead.height == ray_dead.height == dead_letters
    if dead_letters:
        assert local_dead.sort("location").equals(ray_dead.sort("location"))
    assert [r["input_rows"] for r in ray_progress] == [r["input_rows"] for r in local_progress]
    assert len(ray_progress) >= 2
    for record in ray_progress:
        assert record["executor"]["reads"] == "workers"
        assert record["executor"]["shipped_bytes"] == 0
    return ray_progress


# --------------------------------------------------------------------------- files


def write_json_files(directory: Path, first_file: int, files: int, rows: int, *,
                     step_ms: int = 7) -> pl.DataFrame:
    """``files`` JSON-lines files of ``rows`` payments each, in arrival order; file 3
    holds a malformed line. Returns the good rows."""
    directory.mkdir(parents=True, exist_ok=True)
    frames = []
    for f in range(first_file, first_file + files):
        frame = payments(f * rows, rows, step_ms=step_ms)
        frames.append(frame)
        lines = [json.dumps({"card_id": c, "amount": a, "event_time": t.isoformat()})
                 for c, a, t in frame.iter_rows()]
        if f == 3:
            lines.insert(5, '{"card_id": "seven", "amount": 1.0}')
        path = directory / f"part-{f:03d}.json"
        path.write_text("\n".join(lines) + "\n")
        stamp = 1_700_000_000_000_000_000 + f * 10**6
        os.utime(path, ns=(stamp, stamp))
    return pl.concat(frames)


def test_files_are_read_by_the_workers(
    ray_cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    good = write_json_files(landing, 0, 7, 150)

    def build(dead: MemorySink) -> mb.Stream:
        source = mb.read_files(landing, format="json", schema=SCHEMA, max_files_per_batch=3)
        return windows(source.on_dead_letters(dead))

    progress = assert_workers_read(build, FileSource, good, ray_cluster, monkeypatch,
                                   dead_letters=1)
    assert progress[0]["executor"]["read_bytes"] > 3 * 150 * 40  # three files' bytes


def test_a_source_without_splits_is_read_by_the_driver(
    ray_cluster: str, tmp_path: Path
) -> None:
    """Parquet files without a declared schema cannot be split: the driver reads
    them and slices the rows, as before, with the same result."""
    landing = tmp_path / "landing"
    landing.mkdir()
    frames = [payments(i * 200, 200) for i in range(4)]
    for i, frame in enumerate(frames):
        frame.write_parquet(landing / f"p{i}.parquet")

    def build(dead: MemorySink) -> mb.Stream:
        source = mb.read_files(landing, format="parquet", max_files_per_batch=2)
        return windows(source.on_dead_letters(dead))

    local, _, _ = run(build, None)
    ray, _, progress = run(build, mb.RayExecutor(workers=2, address=ray_cluster, shards=4))
    assert _sorted(local).equals(_sorted(ray))
    assert {r["executor"]["reads"] for r in progress} == {"driver"}
    assert all(r["executor"]["shipped_bytes"] > 0 for r in progress)


def test_a_killed_driver_re_runs_its_recorded_files(ray_cluster: str, tmp_path: Path) -> None:
    """The driver is SIGKILLed right after writing ``offsets/1``; files arrive; the
    restart re-runs batch 1 with exactly the files it recorded, read by the
    workers, and the output over both runs is the local executor's, bit for bit,
    each window once."""
    landing, chk, out = tmp_path / "landing", tmp_path / "chk", tmp_path / "out"
    write_json_files(landing, 0, 4, 120, step_ms=250)
    args = ["run", str(JOB), "--checkpoint", str(chk), "--trigger", "available-now",
            "--param", f"output={out}", "--param", f"input={landing}",
            "--workers", "2", "--ray-address", ray_cluster]
    killed = _cli(args, {"MICROBATCH_FAULT": "after_write_ahead@1"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    recorded = Checkpoint(chk).offsets.get(1)
    assert recorded is not None
    assert tuple(recorded.sources["0"]) == (2, 4)
    write_json_files(landing, 4, 2, 120, step_ms=250)  # a fresh plan of batch 1 would take them

    again = _cli(args, {})
    assert again.returncode == 0, again.stderr
    progress = {r["batch_id"]: r for r in load_progress(chk / "progress")}
    assert progress[1]["recovered"]
    assert progress[1]["input_rows"] == 2 * 120  # files 2 and 3 (one line a dead letter)
    assert progress[1]["dead_letter_rows"] == 1
    assert progress[1]["executor"]["reads"] == "workers"

    reference = tmp_path / "reference"
    query = build_writer(JOB, {"output": str(reference), "input": str(landing)}).start(
        tmp_path / "reference-chk", trigger="available-now")
    assert query.await_termination(300)
    assert query.exception is None
    got, want = mb.parquet_table(out), mb.parquet_table(reference)
    assert want.height > 20
    assert got.select("window_start", "card_id").is_duplicated().sum() == 0
    assert _sorted(got).equals(_sorted(want))


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **env}
    if "MICROBATCH_FAULT" not in env:
        full.pop("MICROBATCH_FAULT", None)
    return subprocess.run([sys.executable, "-m", "microbatch.cli", *args], env=full,
                          capture_output=True, text=True, timeout=240)


# --------------------------------------------------------------------------- Delta


@pytest.mark.delta
def test_a_delta_table_is_read_by_the_workers(
    ray_cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltalake import write_deltalake

    table = str(tmp_path / "table")
    frames = [payments(v * 300, 300).with_columns((pl.col("card_id") % 3).alias("part"))
              for v in range(5)]
    for frame in frames:
        write_deltalake(table, frame.to_arrow(), mode="append", partition_by=["part"])

    def build(dead: MemorySink) -> mb.Stream:
        source = mb.read_delta(table, max_files_per_batch=4).drop("part")
        return windows(source.on_dead_letters(dead))

    assert_workers_read(build, DeltaSource, pl.concat(frames).drop("part"), ray_cluster,
                        monkeypatch, dead_letters=0)


# --------------------------------------------------------------------------- Kafka


@pytest.fixture
def kafka_topic(kafka_bootstrap: str) -> tuple[str, pl.DataFrame]:
    """A 3-partition topic of JSON payments written in transactions (one aborted:
    its records and every transaction's marker take offsets but give no rows),
    with one malformed value; and the committed rows."""
    from confluent_kafka import Producer

    from sinks.kafka_client import create_topics

    topic = f"reads-{os.getpid()}-{next(_names)}"
    create_topics(kafka_bootstrap, [topic], partitions=3, replication_factor=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": topic})
    producer.init_transactions(30)
    committed = []
    for t in range(4):
        rows = payments(t * 240, 240)
        producer.begin_transaction()
        for i, (card, amount, when) in enumerate(rows.iter_rows()):
            value = json.dumps({"card_id": card, "amount": amount,
                                "event_time": when.isoformat()}).encode()
            producer.produce(topic, value, partition=i % 3)
        if t == 1:
            producer.produce(topic, b'{"card_id": "x"', partition=2)
        # NOTE: delivered first: the aborted records then surely take offsets (and
        # an abort with records in flight fails now and then: INVALID_TXN_STATE)
        assert producer.flush(30) == 0
        if t == 2:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            committed.append(rows)
    return topic, pl.concat(committed)


@pytest.mark.kafka
def test_a_kafka_topic_is_read_by_the_workers(
    ray_cluster: str, kafka_bootstrap: str, kafka_topic: tuple[str, pl.DataFrame],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic, good = kafka_topic

    def build(dead: MemorySink) -> mb.Stream:
        source = mb.read_kafka(topic, bootstrap=kafka_bootstrap, schema=SCHEMA,
                               max_records_per_batch=400, metadata_columns=())
        return windows(source.on_dead_letters(dead))

    progress = assert_workers_read(build, KafkaSource, good, ray_cluster, monkeypatch,
                                   dead_letters=1)
    assert sum(r["input_rows"] for r in progress) == good.height

