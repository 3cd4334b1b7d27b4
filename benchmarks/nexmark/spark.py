"""The Nexmark queries on Spark Structured Streaming (PySpark, ``local[2]``, 2 shuffle
partitions: :data:`benchmarks.compare_engines.SPARK_CONF`), over the same Parquet
directories, file source with ``maxFilesPerTrigger``, ``withWatermark("dateTime",
"4 seconds")``, available-now trigger, the in-memory sink (the output stays in the
JVM, as ours stays in the process). Runs in the peers venv (``make bench-peers``);
imports neither this engine nor its generator.

Written: q0, q1, q2, q3 (a stream-stream join with the same time bounds as ours),
q11 (``session_window``). Not written: q4 (two aggregations in one query, the
second over the first's updates: Spark refuses multiple aggregations outside
append mode), q5, q7, q8 (an aggregation of an aggregation's output, or a join
after one, per window: Spark 4 chains windowed aggregations in append mode, but
we did not write them this round), q12 (a processing-time window needs
``current_timestamp()`` windows without a watermark, i.e. update mode with state
forever).
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

from benchmarks.compare_engines import SPARK_CONF

QUERIES = ("q0", "q1", "q2", "q3", "q11")
_SESSION: list[Any] = []


def session() -> Any:
    """This process's SparkSession: made by the cold run, reused by the warm one."""
    if not _SESSION:
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.master("local[2]").appName("microbatch-nexmark")
        for key, value in SPARK_CONF.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        _SESSION.append(spark)
    return _SESSION[0]


def build(query: str, data: Path, spec: dict[str, Any], files_per_batch: int) -> Any:
    """The streaming DataFrame of ``query``."""
    from pyspark.sql import functions as F

    spark = session()

    def read(stream: str) -> Any:
        path = data / stream
        schema = spark.read.parquet(str(next(path.glob("part-*.parquet")))).schema
        return (spark.readStream.schema(schema).option("maxFilesPerTrigger", files_per_batch)
                .parquet(str(path)).withWatermark("dateTime", "4 seconds"))

    if query == "q0":
        return read("bid").select("auction", "bidder", "price", "dateTime", "extra")
    if query == "q1":
        euro = (F.col("price") * F.lit(Decimal("0.908"))).alias("price")
        return read("bid").select("auction", "bidder", euro, "dateTime", "extra")
    if query == "q2":
        return read("bid").filter(F.col("auction") % 123 == 0).select("auction", "price")
    if query == "q3":
        back, ahead = spec["person_reach_ms"]
        a = read("auction").filter(F.col("category") == 10).alias("A")
        p = read("person").filter(F.col("state").isin("OR", "ID", "CA")).alias("P")
        cond = ((F.col("A.seller") == F.col("P.id"))
                & (F.col("P.dateTime") >= F.col("A.dateTime") - F.expr(
                    f"INTERVAL {int(back)} MILLISECONDS"))
                & (F.col("P.dateTime") <= F.col("A.dateTime") + F.expr(
                    f"INTERVAL {int(ahead)} MILLISECONDS")))
        return a.join(p, cond).select("P.name", "P.city", "P.state", "A.id")
    if query == "q11":
        win = F.session_window("dateTime", "10 seconds")
        return (read("bid").groupBy(win.alias("w"), "bidder")
                .agg(F.count(F.lit(1)).alias("bid_count"))
                .select("bidder", "bid_count", F.col("w.start").alias("starttime"),
                        F.col("w.end").alias("endtime")))
    raise ValueError(f"{query} is not written for Spark")


def run(query: str, data: Path, spec: dict[str, Any], workdir: Path, *, phase: str,
        files_per_batch: int, output: Path | None) -> dict[str, Any]:
    """One available-now run; ``output``: write the result there (after timing)."""
    import time

    import psutil

    proc = psutil.Process()

    def cpu() -> float:
        total = 0.0
        for p in [proc, *proc.children(recursive=True)]:
            t = p.cpu_times()
            total += t.user + t.system
        return total

    t0, c0 = time.perf_counter(), cpu()
    out = build(query, data, spec, files_per_batch)
    name = f"nexmark_{query}_{phase}"
    handle = (out.writeStream.outputMode("append").format("memory").queryName(name)
              .option("checkpointLocation", str(workdir / f"chk-{phase}"))
              .trigger(availableNow=True).start())
    handle.awaitTermination()
    seconds, cpu_s = time.perf_counter() - t0, cpu() - c0
    batches = sum(1 for p in handle.recentProgress if json.loads(p.json)["numInputRows"])
    table = session().table(name)
    rows = table.count()
    if output is not None:
        table.write.mode("overwrite").parquet(str(output))
    return {"seconds": seconds, "cpu_s": cpu_s, "batches": batches, "rows": rows,
            "version": session().version}
