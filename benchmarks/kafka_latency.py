"""End-to-end latency through a real Kafka broker: broker append -> row visible in the sink.

    .venv/bin/python -m benchmarks.kafka_latency [--rate 50000 [RATE ...]] [--seconds 30]
        [--warmup 5] [--bootstrap H:P] [--sinks delta kafka] [--triggers 1s 0s]
        [--poll-ms 20] [--max-records-per-batch N] [--keep]

The contract measured: ``--rate`` events/s through the broker, p50/p90/p99/max
from each event's append to the broker to its row being visible in the sink,
per sink (Delta, Kafka) and trigger (``1s``, and ``0s``: batches back to back),
for each ``--rate`` given (several rates show which one the machine sustains).

Without ``--bootstrap`` it starts its own broker (``scripts/kafka``, as
:mod:`benchmarks.fraud_latency` does) and stops it at the end. For each
sink x trigger, on fresh topics:

1. an input topic of 3 partitions created with
   ``message.timestamp.type=LogAppendTime``: every record's Kafka timestamp
   is the broker's append time, where latency starts;
2. a watcher process recording when rows become visible: for Delta, a poller
   that checks every ``--poll-ms`` whether the next commit file
   ``_delta_log/<version>.json`` exists (the atomic step that makes a version
   readable), stamps the wall time it first saw it, then reads the rows of the
   files that version added; for Kafka, a ``read_committed`` consumer on the
   output topic stamping the wall time each record is handed to it;
3. the job, in its own process through the CLI (``microbatch -v run
   benchmarks/kafka_latency.py --trigger T``: this file is the job, see
   :func:`build`): ``read_kafka`` -> JSON decode -> ``event_id`` and the
   Kafka timestamp as ``append_ts`` -> ``write_delta`` (one commit per batch)
   or ``write_kafka`` (one transaction per batch, exactly once);
4. a producer process (confluent-kafka, ``produce_batch`` every 20 ms,
   ``linger.ms=5``, idempotent) sending ``--rate`` JSON events/s (``event_id``,
   ``card_id``, ``amount``, ``event_time``) for ``--warmup`` + ``--seconds`` seconds,
   once the job has written ``PRIMER`` events (its start-up is not measured);
5. waits for the sink to hold everything sent, stops the job (SIGTERM), then
   reads the input topic back (the audit: each event id and its append time).

Measured: the events appended in ``[start + warmup, start + warmup + seconds)``
(``start``: the producer's first send).
Latency per row = visible wall time - broker append time (same machine, same
clock; the append time has ms resolution). Every measured event id must be
in the sink exactly once (nothing lost, nothing duplicated). The job's
progress records (logged by ``-v``) give the per-step profile; CPU time per
process over the measured window shows where the machine's cores went, and CPU
time per event (job, broker, producer) what the rate costs whatever else runs.
A run "keeps up" when the producer held the rate, the latency did not grow
over the window and the sink caught up within a trigger interval + 2 s.

Prints a Markdown report and writes it to ``benchmarks/results/kafka_latency.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # also when the CLI loads this file as the job
    sys.path.insert(0, str(ROOT))

import microbatch as mb  # noqa: E402
from benchmarks.harness import markdown_table, percentile  # noqa: E402
from benchmarks.measure import machine_info  # noqa: E402
from scripts.kafka_broker import running_broker  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "kafka_latency.md"
PARTITIONS = 3
SCHEMA = {"event_id": pl.Int64, "card_id": pl.Int64, "amount": pl.Float64,
          "event_time": pl.Datetime("ms", "UTC")}
"""An input event as the producer writes it (one JSON object per record)."""
TARGET_P99_MS = 1200.0
"""The issue's target: p99 <= 1.2 s to Delta at 50k events/s, trigger 1s."""
STEPS = ("plan", "write_ahead", "read", "execute", "sink", "commit")
PROGRESS_LOGGER = " microbatch.observability.progress: "
PRIMER = 30
"""Events sent (and awaited in the sink) before the measured traffic starts."""
SEND_EVERY_S = 0.02
"""The producer sends what is due every 20 ms (1,000 events at 50k/s): sending every
5 ms with ``linger.ms=5`` cost a fifth of a core in librdkafka at any rate."""


# --------------------------------------------------------------------------- the job


def build(params: dict[str, str]) -> mb.DataStreamWriter:
    """The measured job (``microbatch run benchmarks/kafka_latency.py``).

    Params: ``bootstrap``, ``topic``, ``sink`` (``delta`` or ``kafka``),
    ``output`` (the Delta table) or ``output_topic``; ``max_records_per_batch``
    (optional). Output rows: ``event_id``, ``append_ts`` (the record's Kafka
    timestamp: the broker's append time on a ``LogAppendTime`` topic).
    """
    cap = params.get("max_records_per_batch")
    events = mb.read_kafka(params["topic"], bootstrap=params["bootstrap"], format="json",
                           schema=SCHEMA, max_records_per_batch=int(cap) if cap else None,
                           metadata_columns=("timestamp",))
    rows = events.select("event_id", pl.col("timestamp").alias("append_ts"))
    if params.get("sink", "delta") == "delta":
        return rows.write_delta(params["output"])
    return rows.write_kafka(params["output_topic"], bootstrap=params["bootstrap"],
                            delivery_guarantee="exactly_once")


# --------------------------------------------------------------------------- topics


def create_topics(bootstrap: str, *topics: str, log_append_time: bool) -> None:
    """Fresh topics of ``PARTITIONS`` partitions (append-time timestamps if asked)."""
    from sinks.kafka_client import create_topics as create

    config = {"message.timestamp.type": "LogAppendTime"} if log_append_time else {}
    create(bootstrap, topics, partitions=PARTITIONS, replication_factor=1, topic_config=config)


# --------------------------------------------------------------------------- producer


def produce(bootstrap: str, topic: str, *, rate: float, seconds: float, warmup: float,
            started: Any, result_path: str, cards: int = 100_000, seed: int = 1) -> None:
    """Send ``rate`` events/s for ``seconds`` (a process of its own); write what it did,
    with its CPU seconds after ``warmup``."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "enable.idempotence": True, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 2_000_000})
    rng = np.random.default_rng(seed)
    t0 = time.time()
    started.value = t0
    sent = 0
    max_behind = 0
    queue_full = 0
    cpu_at_warmup = None
    while True:
        now = time.time()
        elapsed = now - t0
        if elapsed >= seconds:
            break
        if cpu_at_warmup is None and elapsed >= warmup:
            cpu_at_warmup = (now, time.process_time())
        due = int(elapsed * rate) - sent
        max_behind = max(max_behind, due)
        if due > 0:
            ids = np.arange(sent, sent + due)
            card = rng.integers(0, cards, due)
            cents = rng.integers(100, 50_000, due)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)).encode() + (
                b".%03dZ" % (int(now * 1000) % 1000))
            part = card % PARTITIONS
            for p in range(PARTITIONS):
                sel = part == p
                msgs = [
                    {"key": b"%d" % c,
                     "value": b'{"event_id":%d,"card_id":%d,"amount":%d.%02d,"event_time":"%s"}'
                     % (i, c, a // 100, a % 100, stamp)}
                    for i, c, a in zip(ids[sel].tolist(), card[sel].tolist(),
                                       cents[sel].tolist(), strict=True)
                ]
                while msgs:
                    queued = producer.produce_batch(topic, msgs, partition=p)
                    if queued == len(msgs):
                        break
                    failed = [m for m in msgs if "_error" in m]
                    if not all("QUEUE_FULL" in str(m["_error"]) for m in failed):
                        raise RuntimeError(f"produce failed: {failed[0]['_error']!r}")
                    queue_full += 1
                    msgs = [{"key": m["key"], "value": m["value"]} for m in failed]
                    producer.poll(0.01)
            sent += due
        producer.poll(0)
        time.sleep(max(0.0, SEND_EVERY_S - (time.time() - now)))
    ended = time.time()
    cpu_total = time.process_time()
    cpu_share = (
        (time.process_time() - cpu_at_warmup[1]) / (ended - cpu_at_warmup[0]) * 100
        if cpu_at_warmup is not None and ended > cpu_at_warmup[0] else math.nan)
    remaining = producer.flush(60)
    Path(result_path).write_text(json.dumps({
        "sent": sent, "started": t0, "ended": ended, "unflushed": remaining,
        "max_behind_records": max_behind, "queue_full_retries": queue_full,
        "cpu_percent": cpu_share, "cpu_seconds": cpu_total,
    }))


# --------------------------------------------------------------------------- watchers


def watch_delta(table: str, out_path: str, poll_s: float, stop: MpEvent,
                seen: Synchronized[int]) -> None:
    """Stamp each Delta version when its commit file first exists; read its rows."""
    log_dir = Path(table) / "_delta_log"
    version = 0
    chunks: list[pl.DataFrame] = []
    checks = 0
    gaps: list[float] = []
    last = time.time()
    while not stop.is_set():
        commit = log_dir / f"{version:020d}.json"
        now = time.time()
        gaps.append(now - last)
        last = now
        checks += 1
        if not commit.exists():
            time.sleep(poll_s)
            continue
        visible = time.time()
        adds = [a["add"] for a in map(json.loads, commit.read_text().splitlines())
                if "add" in a and a["add"].get("dataChange", True)]
        for add in adds:
            df = pl.read_parquet(Path(table) / unquote(add["path"]),
                                 columns=["event_id", "append_ts"])
            chunks.append(df.select(
                "event_id", pl.col("append_ts").dt.epoch("ms").alias("append_ms"),
                pl.lit(visible * 1000).alias("visible_ms"),
                pl.lit(int(add["modificationTime"])).alias("written_ms")))
            seen.value += df.height
        version += 1
        last = time.time()  # reading the rows is not a gap between checks
    _save(chunks, out_path, {"checks": checks, "gap_ms": _gap_stats(gaps), "versions": version})


def watch_kafka(bootstrap: str, topic: str, out_path: str, stop: MpEvent,
                seen: Synchronized[int]) -> None:
    """A read_committed consumer stamping the wall time each record is handed over."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"latency-{uuid.uuid4().hex}",
        "enable.auto.commit": False, "isolation.level": "read_committed",
        "fetch.wait.max.ms": 10, "fetch.error.backoff.ms": 10,
    })
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    values: list[bytes] = []
    produced: list[int] = []
    stamps: list[tuple[float, int]] = []
    gaps: list[float] = []
    last = time.time()
    try:
        while not stop.is_set():
            first = consumer.poll(0.01)
            now = time.time()
            gaps.append(now - last)
            last = now
            if first is None:
                continue
            msgs = [first, *consumer.consume(100_000, 0)]
            good = [m.value() or b"" for m in msgs if m.error() is None]
            produced.extend(m.timestamp()[1] for m in msgs if m.error() is None)
            values.extend(good)
            stamps.append((now, len(good)))
            seen.value += len(good)
    finally:
        consumer.close()
    chunks = []
    if values:
        decoded = pl.read_ndjson(b"\n".join(values),
                                 schema={"event_id": pl.Int64, "append_ts": pl.String})
        at = np.repeat([s for s, _ in stamps], [n for _, n in stamps]) * 1000
        chunks.append(decoded.select(
            "event_id",
            pl.col("append_ts").str.to_datetime(time_zone="UTC").dt.epoch("ms")
            .alias("append_ms"),
            pl.Series("visible_ms", at), pl.Series("written_ms", produced)))
    _save(chunks, out_path, {"checks": len(gaps), "gap_ms": _gap_stats(gaps),
                             "arrivals": len(stamps)})


def _gap_stats(gaps: Sequence[float]) -> dict[str, float]:
    ms = [g * 1000 for g in gaps[1:]] or [math.nan]
    return {"median": float(np.median(ms)), "p99": percentile(ms, 99), "max": max(ms)}


def _save(chunks: list[pl.DataFrame], out_path: str, meta: dict[str, Any]) -> None:
    empty = pl.DataFrame(schema={"event_id": pl.Int64, "append_ms": pl.Int64,
                                 "visible_ms": pl.Float64, "written_ms": pl.Int64})
    rows = pl.concat([empty, *[c.cast(empty.schema) for c in chunks]])
    rows.write_parquet(out_path)
    Path(out_path).with_suffix(".json").write_text(json.dumps(meta))


# --------------------------------------------------------------------------- audit


def read_topic(bootstrap: str, topic: str) -> pl.DataFrame:
    """Every record of the input topic: ``event_id`` and its broker append time."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"audit-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "fetch.max.bytes": 64 * 1024 * 1024, "queued.min.messages": 500_000})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    values: list[bytes] = []
    times: list[tuple[int, int]] = []
    eof = 0
    try:
        while eof < PARTITIONS:
            msgs = consumer.consume(100_000, 1.0)
            good = [m for m in msgs if m.error() is None]
            eof += len(msgs) - len(good)
            values.extend(m.value() or b"" for m in good)
            times.extend(map(Message.timestamp, good))
    finally:
        consumer.close()
    types = {t for t, _ in times}
    if types - {2}:  # confluent_kafka.TIMESTAMP_LOG_APPEND_TIME
        raise RuntimeError(f"input records are not LogAppendTime-stamped: types {types}")
    ids = pl.read_ndjson(b"\n".join(values), schema={"event_id": pl.Int64})
    return ids.with_columns(pl.Series("append_ms", [ms for _, ms in times], pl.Int64))


# --------------------------------------------------------------------------- one run


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User+system CPU seconds of each process (and the machine's busy seconds)."""
    import psutil

    out = {}
    for name, pid in pids.items():
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            out[name] = t.user + t.system
    total = psutil.cpu_times()
    out["machine"] = total.user + total.system + total.nice + getattr(total, "irq", 0) + \
        getattr(total, "softirq", 0)
    return out


@contextlib.contextmanager
def stopping(proc: subprocess.Popen[str] | mp.process.BaseProcess, name: str,
             timeout: float = 60.0) -> Iterator[None]:
    """Always end ``proc`` (a Popen or a multiprocessing Process) when the block ends."""
    try:
        yield
    finally:
        if isinstance(proc, subprocess.Popen):
            if proc.poll() is None:
                print(f"  stopping the {name} (pid {proc.pid})", file=sys.stderr)
                proc.terminate()
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        elif proc.is_alive():
            print(f"  stopping the {name} (pid {proc.pid})", file=sys.stderr)
            proc.terminate()
            proc.join(timeout)
            if proc.is_alive():
                proc.kill()
                proc.join()


def prime(bootstrap: str, topic: str, seen: Synchronized[int], job: subprocess.Popen[str],
          *, timeout: float) -> None:
    """Send ``PRIMER`` events (negative ids) and wait until the sink shows them: the
    job's one-time costs (clients, first fetch, creating the table) happen before
    the measured traffic starts."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(PRIMER):
        producer.produce(topic, b'{"event_id":%d,"card_id":0,"amount":1.00,'
                         b'"event_time":"2026-01-01T00:00:00.000Z"}' % -(i + 1),
                         partition=i % PARTITIONS)
    if producer.flush(30):
        raise RuntimeError("the primer events were not delivered")
    deadline = time.time() + timeout
    while seen.value < PRIMER:
        if job.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"the job did not write the {PRIMER} primer events "
                               f"in {timeout:g} s (exit {job.poll()})")
        time.sleep(0.05)


def job_progress(log: Path) -> list[dict[str, Any]]:
    """The job's progress records, from its ``-v`` log (one JSON line per batch)."""
    records = []
    if log.exists():
        for line in log.read_text(errors="replace").splitlines():
            _, sep, payload = line.partition(PROGRESS_LOGGER)
            if sep:
                with contextlib.suppress(json.JSONDecodeError):
                    records.append(json.loads(payload))
    return records


def run_one(sink: str, trigger: str, rate: float, *, bootstrap: str, broker_pid: int | None,
            args: argparse.Namespace) -> dict[str, Any]:
    label = "back to back" if trigger in ("0s", "0") else trigger
    load = os.getloadavg()
    print(f"== {sink} sink, trigger {label}: {rate:,.0f} events/s for "
          f"{args.warmup:g}+{args.seconds:g} s (load average {load[0]:.1f})", file=sys.stderr)
    work = Path(tempfile.mkdtemp(prefix=f"bench-kafka-latency-{sink}-"))
    topic = f"lat-in-{uuid.uuid4().hex[:8]}"
    out_topic = f"lat-out-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, topic, log_append_time=True)
    if sink == "kafka":
        create_topics(bootstrap, out_topic, log_append_time=False)
    table = work / "table"
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    seen = ctx.Value("q", 0)
    rows_path = str(work / "visible.parquet")
    watcher = (
        ctx.Process(target=watch_delta, args=(str(table), rows_path, args.poll_ms / 1000,
                                              stop, seen), daemon=True)
        if sink == "delta" else
        ctx.Process(target=watch_kafka, args=(bootstrap, out_topic, rows_path, stop, seen),
                    daemon=True)
    )
    watcher.start()
    cmd = [sys.executable, "-m", "microbatch.cli", "-v", "run", str(Path(__file__).resolve()),
           "--checkpoint", str(work / "chk"), "--trigger", trigger,
           "--param", f"bootstrap={bootstrap}", "--param", f"topic={topic}",
           "--param", f"sink={sink}", "--param", f"output={table}",
           "--param", f"output_topic={out_topic}"]
    if args.max_records_per_batch:
        cmd += ["--param", f"max_records_per_batch={args.max_records_per_batch}"]
    log = work / "job.log"
    with open(log, "w") as err, open(work / "job.out", "w") as out:
        job = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, text=True)
    started = ctx.Value("d", 0.0)
    prod_path = str(work / "producer.json")
    producer = ctx.Process(target=produce, args=(bootstrap, topic), daemon=True,
                           kwargs={"rate": rate, "seconds": args.warmup + args.seconds,
                                   "warmup": args.warmup, "started": started,
                                   "result_path": prod_path})
    with stopping(watcher, "watcher"), stopping(job, "job"), stopping(producer, "producer"):
        deadline = time.time() + 60
        while not (work / "chk" / "metadata").exists():  # the query has started
            if job.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the job did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        prime(bootstrap, topic, seen, job, timeout=60)
        pids = {"job": job.pid, "watcher": watcher.pid or 0}
        if broker_pid is not None:
            pids["broker"] = broker_pid
        cpu_ready = cpu_seconds(pids)
        producer.start()
        while started.value == 0.0 and producer.is_alive():
            time.sleep(0.01)
        t0 = started.value
        time.sleep(max(0.0, t0 + args.warmup - time.time()))
        cpu_start, cpu_t0 = cpu_seconds(pids), time.time()
        producer.join(args.warmup + args.seconds + 120)
        cpu_end, cpu_t1 = cpu_seconds(pids), time.time()
        if producer.exitcode != 0:
            raise RuntimeError(f"the producer failed (exit {producer.exitcode})")
        made = json.loads(Path(prod_path).read_text())
        drain_until = time.time() + args.drain
        while seen.value < made["sent"] + PRIMER and time.time() < drain_until:
            if job.poll() is not None:
                break
            time.sleep(0.1)
        drained_s = time.time() - made["ended"]
        cpu_done = cpu_seconds(pids)
        job.send_signal(signal.SIGTERM)
        try:
            job.wait(60)
        except subprocess.TimeoutExpired:
            job.kill()
        stop.set()
        watcher.join(60)
    if job.returncode != 0:
        print(f"  the job exited {job.returncode}: {log.read_text()[-3000:]}", file=sys.stderr)
    visible = pl.read_parquet(rows_path)
    meta = json.loads(Path(rows_path).with_suffix(".json").read_text())
    audit = read_topic(bootstrap, topic)
    final_rows = None
    if sink == "delta" and table.exists():
        final_rows = pl.read_delta(str(table), columns=["event_id"]).height
    result = analyse(audit, visible, job_progress(log), made, args)
    per_event = {k: (cpu_done[k] - cpu_ready[k]) / max(made["sent"], 1) * 1e6
                 for k in cpu_done if k in cpu_ready and k != "machine"}
    per_event["producer"] = made["cpu_seconds"] / max(made["sent"], 1) * 1e6
    elapsed = cpu_t1 - cpu_t0
    cpu = {k: (cpu_end[k] - cpu_start[k]) / elapsed * 100 for k in cpu_end if k in cpu_start}
    cpu["producer"] = made["cpu_percent"]
    cpu["other"] = cpu["machine"] - sum(v for k, v in cpu.items() if k != "machine")
    result.update(sink=sink, trigger=label, target_rate=rate, cpu=cpu, cpu_us=per_event,
                  watcher=meta, drained_s=drained_s,
                  job_exit=job.returncode, final_table_rows=final_rows, work=str(work),
                  load=(load[0], os.getloadavg()[0]),
                  produced=made)
    if args.keep:
        print(f"  kept {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    print(f"  {result['measured']:,} events measured, p50 {result['p50']:.0f} ms, "
          f"p99 {result['p99']:.0f} ms, lost {result['lost']}, duplicated "
          f"{result['duplicated']}", file=sys.stderr)
    return result


def analyse(audit: pl.DataFrame, visible: pl.DataFrame, progress: list[dict[str, Any]],
            made: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Latency, completeness and the job's profile over the measured window."""
    w0 = made["started"] * 1000 + args.warmup * 1000
    w1 = w0 + args.seconds * 1000
    window = audit.filter(pl.col("append_ms").is_between(w0, w1, closed="left"))
    counts = visible.group_by("event_id").agg(
        pl.len().alias("copies"), pl.col("visible_ms").min(), pl.col("written_ms").min(),
        pl.col("append_ms").first().alias("sink_append_ms"))
    joined = window.join(counts, on="event_id", how="left")
    lost = joined.filter(pl.col("copies").is_null()).height
    duplicated = joined.filter(pl.col("copies") > 1).height
    got = joined.drop_nulls("copies").with_columns(
        (pl.col("visible_ms") - pl.col("append_ms")).alias("latency_ms"))
    ms = got["latency_ms"].to_numpy()
    # a job that keeps up has the same latency at the end of the window as at its start
    quarter = args.seconds * 250
    first = got.filter(pl.col("append_ms") < w0 + quarter)["latency_ms"]
    last = got.filter(pl.col("append_ms") >= w1 - quarter)["latency_ms"]
    # rows to batches: a row is in the first batch planned at or after its append
    batches = pl.DataFrame(
        [(p["batch_id"], p["timestamp_ms"]) for p in progress],
        schema={"batch_id": pl.Int64, "planned_ms": pl.Int64}, orient="row",
    ).sort("planned_ms")
    split = got.sort("append_ms").join_asof(batches, left_on="append_ms", right_on="planned_ms",
                                            strategy="forward")
    wait = split.drop_nulls("planned_ms").select(
        (pl.col("planned_ms") - pl.col("append_ms")).alias("wait"),
        (pl.col("visible_ms") - pl.col("planned_ms")).alias("batch"),
        (pl.col("visible_ms") - pl.col("written_ms")).alias("written"))
    in_window = [p for p in progress if w0 <= p["timestamp_ms"] < w1 + 1000]
    steps = {s: [float(p["duration_ms"].get(s, 0.0)) for p in in_window] for s in
             (*STEPS, "total")}
    return {
        "audit_rows": audit.height,
        "measured": window.height,
        "rate": window.height / args.seconds,
        "lost": lost,
        "duplicated": duplicated,
        "sink_rows": visible.height,
        "sink_unknown": visible.join(audit, on="event_id", how="anti").height,
        "append_mismatch": got.filter(pl.col("sink_append_ms") != pl.col("append_ms")).height,
        "p50": _pct(got["latency_ms"], 50),
        "p90": _pct(got["latency_ms"], 90),
        "p99": _pct(got["latency_ms"], 99),
        "max": float(ms.max()) if len(ms) else math.nan,
        "drift": _pct(last, 50) - _pct(first, 50),
        "wait_p50": _pct(wait["wait"], 50), "wait_p99": _pct(wait["wait"], 99),
        "batch_p50": _pct(wait["batch"], 50), "batch_p99": _pct(wait["batch"], 99),
        "written_p50": _pct(wait["written"], 50), "written_p99": _pct(wait["written"], 99),
        "batches": len(in_window),
        "rows_per_batch": float(np.median([p["input_rows"] for p in in_window]))
        if in_window else math.nan,
        "falling_behind": sum(bool(p.get("falling_behind")) for p in in_window),
        "steps_p50": {s: float(np.median(v)) if v else math.nan for s, v in steps.items()},
        "steps_p99": {s: percentile(v, 99) for s, v in steps.items()},
    }


def _pct(series: pl.Series, q: float) -> float:
    return float(np.percentile(series.to_numpy(), q)) if series.len() else math.nan


# --------------------------------------------------------------------------- report


def _s(ms: float) -> str:
    return "n/a" if math.isnan(ms) else f"{ms / 1000:.2f} s"


def keeps_up(r: dict[str, Any]) -> bool:
    """The job sustained the input: the producer held its rate, the latency did not
    grow over the window, and the sink caught up soon after the last send."""
    interval = 0.0 if r["trigger"] == "back to back" else parse_seconds(r["trigger"])
    return bool(r["rate"] >= 0.98 * r["target_rate"] and r["drift"] < 500
                and r["drained_s"] < interval + 2.0)


def parse_seconds(trigger: str) -> float:
    from microbatch.durations import parse_duration_ms

    return parse_duration_ms(trigger) / 1000


def contract_line(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's target, stated against the Delta / 1s run at the highest rate."""
    runs = [r for r in rows if r["sink"] == "delta" and r["trigger"] == "1s"]
    if not runs:
        return []
    r = max(runs, key=lambda r: r["target_rate"])
    ok = r["p99"] <= TARGET_P99_MS and keeps_up(r)
    return [
        f"**Target** (p99 ≤ 1.2 s to Delta at 50,000 events/s, trigger 1s): at "
        f"{r['rate']:,.0f} events/s in, p99 {_s(r['p99'])} (p50 {_s(r['p50'])}) — "
        f"{'met ✅' if ok and r['target_rate'] >= 50_000 else 'not met ❌'}.",
        "",
    ]


def report(rows: list[dict[str, Any]], args: argparse.Namespace, machine: dict[str, Any],
           load: tuple[float, float, float]) -> str:
    rates = " ".join(f"{r:g}" for r in args.rate)
    lines = [
        "# End-to-end latency through a real Kafka broker",
        "",
        f"`python -m benchmarks.kafka_latency --rate {rates} --seconds {args.seconds:g} "
        f"--warmup {args.warmup:g} --sinks {' '.join(args.sinks)} "
        f"--triggers {' '.join(args.triggers)}` on {time.strftime('%Y-%m-%d %H:%M %Z')}.",
        "",
        f"Machine: {machine['nproc']} cores ({machine['cpu']}), {machine['ram_gib']} GiB, "
        f"Python {machine['python']}, Polars {machine['polars']}, PyArrow "
        f"{machine['pyarrow']}; load average at start {load[0]:.1f} / {load[1]:.1f} / "
        f"{load[2]:.1f} (1/5/15 min). One broker (`scripts/kafka`, KRaft, single node), "
        "the job, the producer and the watcher all run on this machine.",
        "",
        "Latency = the wall time the row was first seen in the sink minus the record's "
        "broker append time (`LogAppendTime`), over the events appended in the measured "
        f"{args.seconds:g} s after {args.warmup:g} s of warm-up. Delta: the watcher checks "
        f"for the next commit file every {args.poll_ms:g} ms (`check gap p99`: the measured "
        "gap between two checks); Kafka: a `read_committed` consumer (poll 10 ms, "
        "`fetch.wait.max.ms=10`; `check gap` between two polls). The watcher only adds "
        "to the latency (its stamp is at or after visibility). `drift` = the p50 of the "
        "last quarter of the window minus that of the first: a job that keeps up has "
        "none. `caught up` = from the last send until the sink held every event.",
        "",
        *contract_line(rows),
    ]
    latency_rows = []
    for r in rows:
        target = ""
        if r["sink"] == "delta" and r["trigger"] == "1s":
            ok = r["p99"] <= TARGET_P99_MS and r["rate"] >= 0.98 * r["target_rate"]
            target = "p99 ≤ 1.2 s " + ("✅" if ok else "❌")
        latency_rows.append((
            r["sink"], r["trigger"], f"{r['rate']:,.0f} ({r['target_rate']:,.0f})",
            f"{r['measured']:,}", _s(r["p50"]), _s(r["p90"]), _s(r["p99"]), _s(r["max"]),
            _s(r["drift"]), f"{r['drained_s']:.1f} s", "yes" if keeps_up(r) else "no",
            f"{r['lost']:,} / {r['duplicated']:,}", f"{r['watcher']['gap_ms']['p99']:.0f} ms",
            target))
    lines += markdown_table(
        ("sink", "trigger", "input events/s (target)", "measured events", "p50", "p90", "p99",
         "max", "drift", "caught up", "keeps up", "lost / duplicated", "check gap p99",
         "target"), latency_rows, align="llrrrrrrrrlrrl")
    lines += [
        "",
        "Where the time goes. `wait` = from the append to the planning of the batch that "
        "took the event (its end offsets fixed), `batch` = from there to visible, "
        "`written` = from the sink writing the row (Delta: the data file's "
        "`modificationTime`; Kafka: the output record's produce timestamp) to visible; steps: the "
        "job's progress records, median / p99 ms per batch planned in the window; CPU: % of "
        f"one core over the measured window (the machine has {machine['nproc'] * 100} %; "
        "`other` = everything else on the machine); µs/event: CPU time of each process "
        "from the job's start to the sink holding every event, per event sent.",
        "",
    ]
    step_rows = []
    for r in rows:
        steps = [f"{r['steps_p50'][s]:.0f} / {r['steps_p99'][s]:.0f}" for s in (*STEPS, "total")]
        cpu = r["cpu"]
        cpu_text = " / ".join(f"{cpu.get(k, math.nan):.0f}" for k in
                              ("job", "broker", "producer", "watcher", "other"))
        us = " / ".join(f"{r['cpu_us'].get(k, math.nan):.1f}"
                        for k in ("job", "broker", "producer"))
        step_rows.append((
            r["sink"], r["trigger"], f"{r['target_rate']:,.0f}",
            f"{r['wait_p50']:.0f} / {r['wait_p99']:.0f} ms",
            f"{r['batch_p50']:.0f} / {r['batch_p99']:.0f} ms",
            f"{r['written_p50']:.0f} / {r['written_p99']:.0f} ms", r["batches"],
            f"{r['rows_per_batch']:,.0f}", *steps, cpu_text, us))
    lines += markdown_table(
        ("sink", "trigger", "rate", "wait p50 / p99", "batch p50 / p99", "written p50 / p99",
         "batches", "rows/batch", *STEPS, "total",
         "CPU % job / broker / producer / watcher / other", "µs/event job / broker / producer"),
        step_rows, align="llrrrrrr" + "r" * (len(STEPS) + 1) + "ll")
    lines += ["", "Checks:"]
    for r in rows:
        made = r["produced"]
        extra = (f", the final table holds {r['final_table_rows']:,} rows"
                 if r["final_table_rows"] is not None else "")
        lines.append(
            f"- {r['sink']} / {r['trigger']} / {r['target_rate']:,.0f}/s: {made['sent']:,} "
            f"sent ({made['unflushed']} unflushed, the producer at most "
            f"{made['max_behind_records']:,} records behind its schedule), "
            f"{r['audit_rows']:,} in the input topic, {r['sink_rows']:,} rows seen in the "
            f"sink{extra}; {r['sink_unknown']} unknown ids, {r['append_mismatch']} rows whose "
            f"append_ts differs from the topic's; {r['falling_behind']} batches flagged "
            f"falling_behind; job exit {r['job_exit']}; load average {r['load'][0]:.1f} "
            f"before, {r['load'][1]:.1f} after.")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=None, help="use this broker (default: start one)")
    parser.add_argument("--rate", type=float, nargs="+", default=[50_000.0],
                        help="events/s to produce (several: one run each)")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before measuring")
    parser.add_argument("--drain", type=float, default=60.0,
                        help="seconds to wait for the sink to catch up after the last send")
    parser.add_argument("--sinks", nargs="+", default=["delta", "kafka"],
                        choices=["delta", "kafka"])
    parser.add_argument("--triggers", nargs="+", default=["1s", "0s"],
                        help="intervals; 0s (or back-to-back) runs batches back to back")
    parser.add_argument("--poll-ms", type=float, default=20.0,
                        help="how often the Delta watcher checks for a new version")
    parser.add_argument("--max-records-per-batch", type=int, default=None)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--keep", action="store_true",
                        help="keep each run's directory (job log, checkpoint, table)")
    args = parser.parse_args(argv)
    args.triggers = ["0s" if t in ("back-to-back", "b2b", "0") else t
                     for t in ",".join(args.triggers).split(",") if t]
    machine = machine_info()
    load = os.getloadavg()
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap
        broker_pid = None
        if bootstrap is None:
            # --keep: the broker's directory (its log) stays too
            keep = Path(tempfile.mkdtemp(prefix="bench-latency-kafka-")) if args.keep else None
            broker = stack.enter_context(running_broker(keep))
            bootstrap, broker_pid = broker.bootstrap, broker.pid
        rows = [run_one(sink, trigger, rate, bootstrap=bootstrap, broker_pid=broker_pid,
                        args=args)
                for rate in args.rate for sink in args.sinks for trigger in args.triggers]
    text = report(rows, args, machine, load)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0 if all(r["lost"] == 0 and r["duplicated"] == 0 for r in rows) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
