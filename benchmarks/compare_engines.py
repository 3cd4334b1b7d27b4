"""The compared engines, each running one workload twice in a fresh process.

``python -m benchmarks.compare_engines ENGINE WORKLOAD WORKDIR RESULT [--quick]
[--bootstrap HOST:PORT --topic NAME] [--data DIR]`` runs ``WORKLOAD`` (see
:data:`WORKLOADS`) on ``ENGINE`` (see :data:`ALL_ENGINES`) twice in this process:

- ``cold``: the first run in the fresh process, with what a first run pays
  (imports, first calls, the JVM's JIT compilation for Spark);
- ``warm``: the same workload again in the same process (for Spark the same
  SparkSession and JVM, not stopped in between), with the same data, query,
  batch size and sink, into a fresh output and checkpoint directory (Kafka
  readers: the same topic from the beginning, in a fresh consumer group).

Each run writes its normalized output to ``WORKDIR/<cold|warm>/result.parquet``;
``RESULT`` gets ``{"cold": {...}, "warm": {...}}`` (wall seconds of the
processing, start-up seconds, input rows, engine-specific progress), written
after each run, so a warm run that fails or times out leaves the cold one.
Peak memory is sampled by the parent (:mod:`benchmarks.compare`) over this
process's whole tree, so a JVM started by PySpark counts.

``--data DIR``: the event workloads read ``DIR``'s Parquet files with the
generator's columns (:func:`benchmarks.data.from_directory`; files in name
order) instead of the generated data; Q4 keeps its generated 1,000-row files.

Normalized outputs, compared by :mod:`benchmarks.compare_check`:

- windowed workloads (q1, q2, q3): ``ws``, ``we`` (window bounds, epoch ms),
  ``card_id``, ``n``, ``amount``; session ends are the last event + the gap,
  whatever the engine's own convention is;
- q4 (filter): ``event_id``, ``amount``.

Timing: ``wall_s`` covers starting the query to its end, with the data read
from the same Parquet files (Quix, and every engine on Q5: from a Kafka topic of
the same rows). It
leaves out interpreter start, imports and, for Spark, creating the
SparkSession (JVM start), which are reported as ``startup_s`` (in the warm run
the session is there already).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from benchmarks import data
from benchmarks.harness import cold_then_warm

DELAY_S = 10
KAFKA_VALUE_SCHEMA = {"event_id": pl.Int64, "card_id": pl.Int64, "amount": pl.Float64}
"""The JSON value of a Q5 record (it also holds ``event_time`` in epoch ms, which
equals the message timestamp every engine reads as event time)."""
WINDOW_COLUMNS = ("ws", "we", "card_id", "n", "amount")
Q4_THRESHOLD = 20.0


@dataclass(frozen=True)
class Spec:
    """One compared workload: a query over a dataset at a batch size."""

    name: str
    query: str  # q1 | q2 | q3 | q4
    files_per_batch: int
    tiny: bool = False
    title: str = ""
    short: str = ""
    """The title in a few words, for the summary matrix."""
    kafka_partitions: int = 0
    """> 0: the engines read the rows from a Kafka topic of that many partitions
    (key = card id, partition = card id mod partitions, message timestamp = event
    time) instead of the Parquet files; a batch is ``rows_per_batch`` records."""
    data_dir: Path | None = None
    """Read the events from this directory (:func:`benchmarks.data.from_directory`)
    instead of generating them; ignored by ``tiny`` workloads (Q4 keeps its files)."""

    def dataset(self, quick: bool) -> data.EventFiles:
        """The files this workload reads."""
        if self.tiny:
            return data.tiny(quick)
        if self.data_dir is not None:
            return data.from_directory(self.data_dir)
        return data.events(quick)

    def rows_per_batch(self, quick: bool) -> int:
        return self.batch_rows(self.dataset(quick))

    def batch_rows(self, ds: data.EventFiles) -> int:
        """Rows (Q5: Kafka records) per batch over ``ds``."""
        return ds.rows_per_file * self.files_per_batch

    @property
    def windowed(self) -> bool:
        return self.query != "q4"


WORKLOADS = {
    "q1-small": Spec("q1-small", "q1", 1, title="Q1 tumbling 1 min, count+sum per card",
                     short="Q1 tumbling 1 min"),
    "q1-large": Spec("q1-large", "q1", 10, title="Q1 tumbling 1 min, count+sum per card",
                     short="Q1 tumbling 1 min"),
    "q2": Spec("q2", "q2", 1, title="Q2 hopping 5 min / 1 min, count+sum per card",
               short="Q2 hopping 5 min / 1 min"),
    "q3": Spec("q3", "q3", 1, title="Q3 session windows, 30 s gap, count+sum per card",
               short="Q3 sessions, 30 s gap"),
    "q4": Spec("q4", "q4", 1, tiny=True,
               title="Q4 tiny batches: filter amount > 20 → sink, 1 file per batch",
               short="Q4 tiny batches, filter → sink"),
    "q5": Spec("q5", "q1", 1, kafka_partitions=3,
               title="Q5 Q1 over Kafka: the same rows from a 3-partition topic (JSON values), "
                     "tumbling 1 min count+sum per card",
               short="Q5 Q1 from a 3-partition Kafka topic"),
}
"""Small batches are one input file (100k rows; 50k with --quick), large ten; Q5
reads as many records per batch from Kafka."""

ENGINES = ("polars-oneshot", "microbatch", "microbatch-noop", "spark", "spark-noop",
           "bytewax", "quix")
"""The engines a comparison runs by default."""
SPARK_DEFAULT_PARTITIONS = "spark-200p"
"""Spark with its default 200 shuffle partitions (only on request: ``python -m
benchmarks.compare --spark-default-partitions``)."""
ALL_ENGINES = (*ENGINES, SPARK_DEFAULT_PARTITIONS)


def base_engine(engine: str) -> str:
    """The engine behind a variant: ``spark-noop`` and ``spark-200p`` -> ``spark``."""
    return engine.removesuffix("-noop").removesuffix("-200p")


# --------------------------------------------------------------------------- helpers


def _epoch_ms(col: str) -> pl.Expr:
    return pl.col(col).dt.epoch("ms")


def _write_result(frame: pl.DataFrame, workdir: Path) -> int:
    frame.write_parquet(workdir / "result.parquet")
    return frame.height


# --------------------------------------------------------------------------- Polars one-shot


def run_oneshot(spec: Spec, ds: data.EventFiles, workdir: Path) -> dict[str, Any]:
    """The limit: the existing workloads' one-shot Polars query, over all files."""
    lf = pl.scan_parquet(ds.file_paths())
    case = None if spec.query == "q4" else _oneshot_case(spec)  # its import is not timed
    t0 = time.perf_counter()
    if case is None:
        lf.filter(pl.col("amount") > Q4_THRESHOLD).sink_parquet(workdir / "out.parquet")
        wall = time.perf_counter() - t0
        out = pl.read_parquet(workdir / "out.parquet").select("event_id", "amount")
    else:
        frame = case.oneshot(lf).collect()
        frame.write_parquet(workdir / "out.parquet")
        wall = time.perf_counter() - t0
        out = frame.select(_epoch_ms("window_start").alias("ws"),
                           _epoch_ms("window_end").alias("we"), "card_id", "n", "amount")
    return {"wall_s": wall, "input_rows": ds.rows, "output_rows": _write_result(out, workdir)}


def _oneshot_case(spec: Spec) -> Any:
    if spec.query == "q1":
        from benchmarks.q1_tumbling import CASE
    elif spec.query == "q2":
        from benchmarks.q2_hopping import CASE
    else:
        from benchmarks.q3_session import CASE
    return CASE


# --------------------------------------------------------------------------- this engine


def microbatch_stream(spec: Spec, ds: data.EventFiles,
                      kafka: tuple[str, str] | None = None) -> Any:
    """This engine's query of ``spec``, reusing the workloads' windows
    (``benchmarks.q*``): over ``ds``'s files, or with ``kafka`` (bootstrap, topic)
    over the topic, event time = the message timestamp."""
    import microbatch as mb
    from microbatch.sources.generator import GENERATOR_SCHEMA

    if kafka is not None:
        src = (mb.read_kafka(kafka[1], bootstrap=kafka[0], schema=KAFKA_VALUE_SCHEMA,
                             max_records_per_batch=spec.batch_rows(ds),
                             metadata_columns=("timestamp",))
               .rename({"timestamp": "event_time"}))
    else:
        src = mb.read_files(ds.path, max_files_per_batch=spec.files_per_batch,
                            schema=GENERATOR_SCHEMA)
    if spec.query == "q4":
        return src.filter(pl.col("amount") > Q4_THRESHOLD)
    return (src.with_watermark("event_time", f"{DELAY_S}s")
            .group_by(_oneshot_case(spec).window(), "card_id")
            .agg(pl.len().alias("n"), pl.col("amount").sum().alias("amount")))


def run_microbatch(spec: Spec, ds: data.EventFiles, workdir: Path, *, noop: bool,
                   kafka: tuple[str, str] | None = None) -> dict[str, Any]:
    """This engine on :func:`microbatch_stream`, into Parquet (or a no-op sink)."""
    import microbatch as mb
    from benchmarks.measure import run_available_now

    stream = microbatch_stream(spec, ds, kafka)
    batches_hint = ds.files // spec.files_per_batch + 5
    if noop:
        writer = stream.foreach_batch(lambda _df, _batch: None)
        t0 = time.perf_counter()
        query = writer.start(str(workdir / "chk"), trigger="available-now",
                             retention=batches_hint + 100)
        query.await_termination()
        wall = time.perf_counter() - t0
        progress = query.recent_progress
    else:
        run = run_available_now(stream, workdir / "out", workdir / "chk",
                                batches_hint=batches_hint)
        wall, progress = run.wall_s, run.progress
    keep = ("batch_id", "input_rows", "output_rows", "late_rows", "watermark_ms",
            "next_watermark_ms", "duration_ms")
    result: dict[str, Any] = {
        "wall_s": wall,
        "input_rows": sum(int(p["input_rows"]) for p in progress),
        "batches": len(progress),
        "late_rows": sum(int(p.get("late_rows") or 0) for p in progress),
        "progress": [{k: p.get(k) for k in keep} for p in progress],
        "output": str(workdir / "out"),
        "files_per_batch": spec.files_per_batch,
    }
    if not noop:
        out = mb.parquet_table(workdir / "out")
        if spec.query == "q4":
            out = out.select("event_id", "amount")
        else:
            out = out.select(_epoch_ms("window_start").alias("ws"),
                             _epoch_ms("window_end").alias("we"), "card_id", "n", "amount")
        result["output_rows"] = _write_result(out, workdir)
    return result


# --------------------------------------------------------------------------- Spark


SPARK_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.memory": "4g",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.streaming.numRecentProgressUpdates": "1000",
    "spark.sql.adaptive.enabled": "false",
}
"""``local[2]`` (all cores of the machine). Shuffle partitions 2, one per core,
instead of the default 200, which costs ~200 state-store tasks per batch
(measured by the ``spark-200p`` engine, ``compare --spark-default-partitions``);
driver heap 4 GiB (default 1 GiB). State store: the default (HDFS-backed, in
memory)."""
SPARK_DEFAULT_SHUFFLE_PARTITIONS = 200

_SPARK_SESSIONS: dict[str, Any] = {}
"""This process's SparkSession, made by the cold run and reused by the warm one."""


def spark_conf(engine: str, *, kafka: bool) -> dict[str, str]:
    """:data:`SPARK_CONF` for ``engine`` (``spark-200p``: Spark's default shuffle
    partitions), with the Kafka connector when the workload reads Kafka."""
    conf = dict(SPARK_CONF)
    if engine == SPARK_DEFAULT_PARTITIONS:
        conf["spark.sql.shuffle.partitions"] = str(SPARK_DEFAULT_SHUFFLE_PARTITIONS)
    if kafka:
        import pyspark

        conf["spark.jars.packages"] = spark_kafka_package(pyspark.__version__)
    return conf


def spark_session(engine: str, *, kafka: bool) -> Any:
    """This process's ``local[2]`` SparkSession: created (JVM start) on the first call,
    the same session afterwards, until :func:`stop_spark`."""
    if engine not in _SPARK_SESSIONS:
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.master("local[2]").appName("microbatch-compare")
        for key, value in spark_conf(engine, kafka=kafka).items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        _SPARK_SESSIONS[engine] = spark
    return _SPARK_SESSIONS[engine]


def stop_spark() -> None:
    """Stop the SparkSession :func:`spark_session` made, if any (after the warm run)."""
    while _SPARK_SESSIONS:
        _SPARK_SESSIONS.popitem()[1].stop()


def run_spark(engine: str, spec: Spec, ds: data.EventFiles, workdir: Path, *,
              kafka: tuple[str, str] | None = None) -> dict[str, Any]:
    """Spark Structured Streaming: file source (or, with ``kafka``, the Kafka source of
    ``spark-sql-kafka`` fetched by Ivy from Maven Central, ``maxOffsetsPerTrigger``,
    ``from_json``, event time = the message timestamp), watermark, window, append mode;
    ``spark-noop`` writes to the no-op sink. The session outlives the run."""
    t_start = time.perf_counter()
    from pyspark.sql import functions as F
    from pyspark.sql.types import (
        DoubleType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    noop = engine.endswith("-noop")
    spark = spark_session(engine, kafka=kafka is not None)
    startup = time.perf_counter() - t_start
    schema = StructType([
        StructField("event_id", LongType()), StructField("card_id", LongType()),
        StructField("merchant", StringType()), StructField("amount", DoubleType()),
        StructField("event_time", TimestampType()),
    ])
    if kafka is not None:
        value = "event_id LONG, card_id LONG, amount DOUBLE"
        src = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", kafka[0])
               .option("subscribe", kafka[1]).option("startingOffsets", "earliest")
               .option("maxOffsetsPerTrigger", spec.batch_rows(ds)).load()
               .select(F.from_json(F.col("value").cast("string"), value).alias("v"),
                       F.col("timestamp").alias("event_time"))
               .select("v.*", "event_time"))
    else:
        src = (spark.readStream.schema(schema)
               .option("maxFilesPerTrigger", spec.files_per_batch).parquet(str(ds.path)))
    if spec.query == "q4":
        out = src.filter(F.col("amount") > Q4_THRESHOLD)
    else:
        if spec.query == "q1":
            win = F.window("event_time", "1 minute")
        elif spec.query == "q2":
            win = F.window("event_time", "5 minutes", "1 minute")
        else:
            win = F.session_window("event_time", "30 seconds")
        out = (src.withWatermark("event_time", f"{DELAY_S} seconds")
               .groupBy(win.alias("window"), "card_id")
               .agg(F.count(F.lit(1)).alias("n"), F.sum("amount").alias("amount"))
               .select(F.col("window.start").alias("window_start"),
                       F.col("window.end").alias("window_end"), "card_id", "n", "amount"))
    writer = (out.writeStream.outputMode("append")
              .option("checkpointLocation", str(workdir / "chk"))
              .trigger(availableNow=True))
    writer = (writer.format("noop") if noop
              else writer.format("parquet").option("path", str(workdir / "out")))
    t0 = time.perf_counter()
    query = writer.start()
    query.awaitTermination()
    wall = time.perf_counter() - t0
    progress = [json.loads(p.json) if hasattr(p, "json") else p
                for p in query.recentProgress]
    progress = [_spark_progress(p) for p in progress]
    result: dict[str, Any] = {
        "wall_s": wall,
        "startup_s": startup,
        "input_rows": sum(p["input_rows"] for p in progress),
        "batches": len(progress),
        "data_batches": sum(1 for p in progress if p["input_rows"]),
        "progress": progress,
        "spark_version": spark.version,
        "shuffle_partitions": int(spark.conf.get("spark.sql.shuffle.partitions")),
    }
    if not noop:
        frame = pl.read_parquet(workdir / "out" / "*.parquet")
        if spec.query == "q4":
            frame = frame.select("event_id", "amount")
        else:
            frame = frame.select(_epoch_ms("window_start").alias("ws"),
                                 _epoch_ms("window_end").alias("we"),
                                 "card_id", "n", "amount")
        result["output_rows"] = _write_result(frame, workdir)
    return result


SPARK_KAFKA = "org.apache.spark:spark-sql-kafka-0-10_2.13"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"


@functools.cache
def spark_kafka_package(spark_version: str) -> str:
    """The Maven coordinates of Spark's Kafka connector for ``spark_version``: that
    version's, else the newest earlier patch release of the same minor version on Maven
    Central (patch releases of one minor line share the connector's API; a new pyspark
    is often on PyPI before its connector is on Maven Central)."""
    import urllib.error
    import urllib.request

    major, minor, patch = (int(x) for x in spark_version.split(".")[:3])
    group, artifact = SPARK_KAFKA.split(":")
    for p in range(patch, -1, -1):
        version = f"{major}.{minor}.{p}"
        url = (f"{MAVEN_CENTRAL}/{group.replace('.', '/')}/{artifact}/{version}/"
               f"{artifact}-{version}.pom")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"),
                                        timeout=20):
                return f"{SPARK_KAFKA}:{version}"
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise RuntimeError(f"Maven Central answered {exc.code} for {url}") from exc
        except OSError as exc:
            raise RuntimeError(f"cannot reach Maven Central for {SPARK_KAFKA}: {exc}") from exc
    raise RuntimeError(f"no {SPARK_KAFKA} for Spark {major}.{minor}.x on Maven Central "
                       f"(tried {spark_version} down to {major}.{minor}.0)")


def _spark_progress(p: dict[str, Any]) -> dict[str, Any]:
    wm = (p.get("eventTime") or {}).get("watermark")
    ops = p.get("stateOperators") or []
    return {
        "batch_id": p.get("batchId"),
        "input_rows": int(p.get("numInputRows") or 0),
        "duration_ms": p.get("durationMs") or {},
        "watermark": wm,
        "late_rows": sum(int(o.get("numRowsDroppedByWatermark") or 0) for o in ops),
        "state_rows": sum(int(o.get("numRowsTotal") or 0) for o in ops),
    }


# --------------------------------------------------------------------------- Bytewax


ALIGN = datetime(2026, 1, 1, tzinfo=UTC)


def run_bytewax(spec: Spec, ds: data.EventFiles, workdir: Path,
                kafka: tuple[str, str] | None = None) -> dict[str, Any]:
    """Bytewax (one worker, ``run_main``): a Parquet-files source yielding one file per
    input batch (with ``kafka``: its ``KafkaSource`` with ``tail=False``, each JSON
    value parsed, event time = the message timestamp), ``key_on`` card,
    ``fold_window`` with an event-time clock.

    The clock's ``now_getter`` is fixed and ``to_system_utc`` returns None, so
    the watermark only follows event time (max timestamp seen for the key -
    10 s), as in a replay; with the default system clock it would also advance
    with wall time and make the output depend on the machine's speed.
    """
    import bytewax.operators as op
    import bytewax.operators.windowing as win
    from bytewax.dataflow import Dataflow
    from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
    from bytewax.outputs import DynamicSink, StatelessSinkPartition
    from bytewax.testing import run_main

    paths = ds.file_paths()

    class FilesPartition(StatefulSourcePartition):  # type: ignore[misc, unused-ignore]
        def __init__(self, start: int) -> None:
            self.i = start

        def next_batch(self) -> list[Any]:
            if self.i >= len(paths):
                raise StopIteration
            frame = pl.read_parquet(paths[self.i])
            self.i += 1
            if spec.query == "q4":
                return [frame]
            return list(frame.select(pl.col("card_id").cast(pl.String), "event_time",
                                     "amount").iter_rows())

        def snapshot(self) -> int:
            return self.i

    class FilesSource(FixedPartitionedSource):  # type: ignore[misc, unused-ignore]
        def list_parts(self) -> list[str]:
            return ["files"]

        def build_part(self, step_id: str, for_part: str, resume_state: Any) -> FilesPartition:
            return FilesPartition(resume_state or 0)

    class ListPartition(StatelessSinkPartition):  # type: ignore[misc, unused-ignore]
        def __init__(self, target: list[Any]) -> None:
            self.target = target

        def write_batch(self, items: list[Any]) -> None:
            self.target.extend(items)

    class ListSink(DynamicSink):  # type: ignore[misc, unused-ignore]
        def __init__(self, target: list[Any]) -> None:
            self.target = target

        def build(self, step_id: str, worker_index: int, worker_count: int) -> ListPartition:
            return ListPartition(self.target)

    flow = Dataflow(f"compare-{spec.name}")
    if kafka is not None:
        import json as jsonlib

        from bytewax.connectors.kafka import KafkaSource, KafkaSourceMessage

        def parse(msg: KafkaSourceMessage[bytes, bytes]) -> tuple[str, datetime, float]:
            value = jsonlib.loads(msg.value)
            assert msg.timestamp is not None
            return (str(value["card_id"]), datetime.fromtimestamp(msg.timestamp[1] / 1000, UTC),
                    value["amount"])

        messages = op.input("kafka", flow, KafkaSource([kafka[0]], [kafka[1]], tail=False,
                                                       batch_size=10_000))
        stream = op.map("parse", messages, parse)
    else:
        stream = op.input("files", flow, FilesSource())
    down: list[Any] = []
    meta: list[Any] = []
    late: list[Any] = []
    if spec.query == "q4":
        out_dir = workdir / "out"
        out_dir.mkdir()
        counter = iter(range(1 << 30))

        def write(frame: pl.DataFrame) -> int:
            kept = frame.filter(pl.col("amount") > Q4_THRESHOLD)
            kept.write_parquet(out_dir / f"part-{next(counter):05d}.parquet")
            return kept.height

        op.output("out", op.map("filter-write", stream, write), ListSink(down))
    else:
        keyed = op.key_on("card", stream, lambda row: row[0])
        clock = win.EventClock(lambda row: row[1],
                               wait_for_system_duration=timedelta(seconds=DELAY_S),
                               now_getter=lambda: ALIGN, to_system_utc=lambda _t: None)
        if spec.query == "q1":
            windower: Any = win.TumblingWindower(length=timedelta(minutes=1), align_to=ALIGN)
        elif spec.query == "q2":
            windower = win.SlidingWindower(length=timedelta(minutes=5),
                                           offset=timedelta(minutes=1), align_to=ALIGN)
        else:
            windower = win.SessionWindower(gap=timedelta(seconds=30))

        def folder(acc: list[Any], row: tuple[str, datetime, float]) -> list[Any]:
            acc[0] += 1
            acc[1] += row[2]
            return acc

        out = win.fold_window("agg", keyed, clock, windower, lambda: [0, 0.0], folder,
                              lambda a, b: [a[0] + b[0], a[1] + b[1]], ordered=False)
        op.output("down", out.down, ListSink(down))
        op.output("meta", out.meta, ListSink(meta))
        op.output("late", out.late, ListSink(late))
    t0 = time.perf_counter()
    run_main(flow)
    wall = time.perf_counter() - t0
    import bytewax

    result: dict[str, Any] = {"wall_s": wall, "input_rows": ds.rows,
                              "bytewax_version": getattr(bytewax, "__version__", "?")}
    if spec.query == "q4":
        frame = pl.read_parquet(workdir / "out" / "*.parquet").select("event_id", "amount")
        result["output_rows"] = _write_result(frame, workdir)
        return result
    values = pl.DataFrame(
        {"key": [k for k, _ in down], "wid": [w for _, (w, _) in down],
         "n": [acc[0] for _, (_, acc) in down], "amount": [acc[1] for _, (_, acc) in down]},
        schema={"key": pl.String, "wid": pl.Int64, "n": pl.Int64, "amount": pl.Float64})
    bounds = pl.DataFrame(
        {"key": [k for k, _ in meta], "wid": [w for _, (w, _) in meta],
         "open": [m.open_time for _, (_, m) in meta],
         "close": [m.close_time for _, (_, m) in meta]},
        schema={"key": pl.String, "wid": pl.Int64, "open": pl.Datetime("us", "UTC"),
                "close": pl.Datetime("us", "UTC")})
    # Sessions: close_time is the last event (inclusive); ours ends at last + gap.
    gap_ms = 30_000 if spec.query == "q3" else 0
    frame = values.join(bounds, on=["key", "wid"], how="left").select(
        _epoch_ms("open").alias("ws"), (_epoch_ms("close") + gap_ms).alias("we"),
        pl.col("key").cast(pl.Int64).alias("card_id"), "n", "amount")
    result["late_rows"] = len(late)
    result["output_rows"] = _write_result(frame, workdir)
    return result


# --------------------------------------------------------------------------- Quix Streams


def run_quix(spec: Spec, ds: data.EventFiles, workdir: Path, *, bootstrap: str,
             topic: str) -> dict[str, Any]:
    """Quix Streams over a Kafka topic holding the same rows in arrival order (key: card
    id, value: JSON, message timestamp: event time): one partition, or Q5's three.

    ``closing_strategy="partition"`` (a window closes when the partition's
    max timestamp - grace passes its end; the default, "key", would keep most
    of the 100k keys' windows open); grace = 10 s. Defaults otherwise, which
    include a RocksDB state store with a changelog topic per store.
    """
    import uuid

    from quixstreams import Application
    from quixstreams.dataframe.windows import Count, Sum

    app = Application(broker_address=bootstrap, consumer_group=f"cmp-{uuid.uuid4().hex[:8]}",
                      auto_offset_reset="earliest", state_dir=str(workdir / "state"),
                      loglevel="WARNING")
    source = app.topic(topic, key_deserializer="str", value_deserializer="json")
    sdf = app.dataframe(source)
    seen = {"n": 0, "first": 0.0, "last": 0.0}
    total = ds.rows

    def count_input(_value: Any) -> None:
        seen["n"] += 1
        if seen["n"] == 1:
            seen["first"] = time.perf_counter()
        if seen["n"] >= total:
            seen["last"] = time.perf_counter()
            app.stop()

    sdf = sdf.update(count_input)
    grace = DELAY_S * 1000
    if spec.query == "q1":
        window: Any = sdf.tumbling_window(60_000, grace_ms=grace)
    elif spec.query == "q2":
        window = sdf.hopping_window(300_000, 60_000, grace_ms=grace)
    else:
        window = sdf.session_window(30_000, grace_ms=grace)
    sdf = window.agg(n=Count(), amount=Sum("amount")).final(closing_strategy="partition")
    rows: list[tuple[Any, ...]] = []
    sdf = sdf.update(lambda v, key, _ts, _h: rows.append((key, v["start"], v["end"], v["n"],
                                                          v["amount"])), metadata=True)
    t0 = time.perf_counter()
    app.run(sdf, timeout=60.0)
    end = seen["last"] or time.perf_counter()
    if seen["n"] < total:
        raise RuntimeError(f"Quix consumed {seen['n']:,} of {total:,} records before its "
                           "60 s idle timeout")
    import quixstreams

    result: dict[str, Any] = {"wall_s": end - t0, "startup_s": (seen["first"] or t0) - t0,
                              "input_rows": seen["n"],
                              "quix_version": getattr(quixstreams, "__version__", "?")}
    frame = pl.DataFrame(rows, schema={"key": pl.String, "ws": pl.Int64, "end": pl.Int64,
                                       "n": pl.Int64, "amount": pl.Float64}, orient="row")
    # Quix sessions end at the last event + 1 ms; ours at the last event + the gap.
    we = (pl.col("end") - 1 + 30_000) if spec.query == "q3" else pl.col("end")
    frame = frame.select("ws", we.alias("we"), pl.col("key").cast(pl.Int64).alias("card_id"),
                         "n", "amount")
    result["output_rows"] = _write_result(frame, workdir)
    return result


# --------------------------------------------------------------------------- entry point


def kafka_source(engine: str, spec: Spec, bootstrap: str | None,
                 topic: str | None) -> tuple[str, str] | None:
    """(bootstrap, topic) when ``engine`` reads ``spec``'s rows from Kafka (Quix always;
    every streaming engine on Q5), else None."""
    if engine != "quix" and not (spec.kafka_partitions and engine != "polars-oneshot"):
        return None
    if not bootstrap or not topic:
        raise SystemExit(f"{engine} on {spec.name} reads Kafka: it needs --bootstrap "
                         "and --topic")
    return bootstrap, topic


def run_once(engine: str, spec: Spec, ds: data.EventFiles, workdir: Path,
             kafka: tuple[str, str] | None) -> dict[str, Any]:
    """One run of ``spec`` on ``engine``, its output and checkpoints under ``workdir``."""
    if engine == "polars-oneshot":
        return run_oneshot(spec, ds, workdir)
    if base_engine(engine) == "microbatch":
        return run_microbatch(spec, ds, workdir, noop=engine.endswith("noop"), kafka=kafka)
    if base_engine(engine) == "spark":
        return run_spark(engine, spec, ds, workdir, kafka=kafka)
    if engine == "bytewax":
        return run_bytewax(spec, ds, workdir, kafka=kafka)
    if engine == "quix":
        assert kafka is not None
        return run_quix(spec, ds, workdir, bootstrap=kafka[0], topic=kafka[1])
    raise SystemExit(f"unknown engine {engine!r}")


def run(engine: str, spec: Spec, quick: bool, workdir: Path, *, bootstrap: str | None,
        topic: str | None,
        on_run: Callable[[dict[str, dict[str, Any]]], None] | None = None,
        ) -> dict[str, dict[str, Any]]:
    """Run ``spec`` on ``engine`` cold, then warm in the same process (see the module
    docstring), each in its own directory ``workdir/<phase>``; ``on_run`` gets the
    results so far after each run. Returns ``{"cold": {...}, "warm": {...}}``."""
    ds = spec.dataset(quick)
    kafka = kafka_source(engine, spec, bootstrap, topic)

    def one(phase: str) -> dict[str, Any]:
        phase_dir = workdir / phase
        shutil.rmtree(phase_dir, ignore_errors=True)
        phase_dir.mkdir(parents=True)
        return run_once(engine, spec, ds, phase_dir, kafka)

    try:
        return cold_then_warm(one, on_run)
    finally:
        stop_spark()


def write_json(path: Path, doc: Any) -> None:
    """Write ``doc`` to ``path`` atomically (a reader never sees half of it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, default=str))
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare_engines")
    parser.add_argument("engine", choices=ALL_ENGINES)
    parser.add_argument("workload", choices=list(WORKLOADS))
    parser.add_argument("workdir", type=Path)
    parser.add_argument("result", type=Path)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--bootstrap")
    parser.add_argument("--topic")
    parser.add_argument("--data", type=Path, metavar="DIR",
                        help="read the events from DIR's Parquet files (name order)")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    spec = WORKLOADS[args.workload]
    if args.data is not None:
        spec = dataclasses.replace(spec, data_dir=args.data)
    run(args.engine, spec, args.quick, args.workdir, bootstrap=args.bootstrap,
        topic=args.topic, on_run=lambda results: write_json(args.result, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
