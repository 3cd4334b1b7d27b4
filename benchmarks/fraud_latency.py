"""Detection latency of the fraud job: from a transaction's arrival to the webhook's POST.

    .venv/bin/python -m benchmarks.fraud_latency [--seconds 60] [--rate 300] [--bootstrap H:P]

Without ``--bootstrap`` it starts its own Kafka broker (``scripts/kafka_broker.py``) in
a temporary directory. For each trigger (``1s``, then back-to-back batches) it:

1. starts a webhook receiver (``microbatch.tools.receiver``, its own process)
   that logs the wall-clock time each alert's first POST arrives;
2. starts ``microbatch run jobs/fraud_alerts.py`` (the real job, its own
   process) on a fresh 3-partition topic;
3. plays ``--rate`` transactions per second for ``--warmup`` + ``--seconds``
   seconds, and measures the alerts completed after the warm-up: card
   payments keyed by card (Zipf-skewed cards), event time = now, and
   ``--late-share`` of them uploaded from a phone up to an hour late (event time
   1 minute to 59 minutes ago: they still count, and can complete their old
   window's rule). Each record's Kafka timestamp is its wall-clock send time;
4. waits for the job to drain, stops it, and computes per alert the time from
   the arrival of the transaction that completed the rule (the third of its
   card and minute, in arrival order) to the receiver getting the alert.

Prints a Markdown table (p50, p90, p99, max per trigger) and writes it to
``benchmarks/results/fraud_latency.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import polars as pl

from benchmarks.harness import markdown_table
from scripts.kafka_broker import running_broker

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "jobs" / "fraud_alerts.py"
OUT = Path(__file__).resolve().parent / "results" / "fraud_latency.md"
MINUTE_MS = 60_000


def create_topic(bootstrap: str, topic: str) -> None:
    from sinks.kafka_client import create_topics

    create_topics(bootstrap, [topic], partitions=3)


def start_receiver(work: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "microbatch.tools.receiver", "--port", "0",
         "--log", str(work / "received.jsonl")],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        raise RuntimeError(f"the receiver did not start: {line!r}")
    return proc, line.split()[-1] + "/alerts"


def start_job(work: Path, bootstrap: str, topic: str, url: str, trigger: str
              ) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "microbatch.cli", "run", str(JOB),
           "--checkpoint", str(work / "chk"), "--trigger", trigger,
           "--param", f"bootstrap={bootstrap}", "--param", f"topic={topic}",
           "--param", f"alerts_topic={topic}-alerts", "--param", f"webhook={url}",
           "--param", f"output={work / 'alerts'}"]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=open(work / "job.log", "w"), text=True)


def play(bootstrap: str, topic: str, *, rate: float, seconds: float, late_share: float,
         cards: int, seed: int) -> pl.DataFrame:
    """Send transactions at ``rate`` per second; return them with their send time."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1,
                         "enable.idempotence": True})
    rng = np.random.default_rng(seed)
    weights = np.arange(1, cards + 1, dtype=np.float64) ** -1.1
    weights /= weights.sum()
    sent: list[tuple[int, int, int, int]] = []
    start = time.time()
    event_id = 0
    while (now := time.time()) - start < seconds:
        due = int((now - start) * rate) - event_id
        for _ in range(max(0, due)):
            card = int(rng.choice(cards, p=weights))
            wall_ms = int(time.time() * 1000)
            late = rng.random() < late_share
            event_ms = wall_ms - int(rng.uniform(60_000, 59 * 60_000)) if late else wall_ms
            value = json.dumps({
                "event_id": event_id, "card_id": card, "merchant": "m-0001",
                "amount": f"{rng.lognormal(3.5, 1.0):.2f}",
                "event_time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(event_ms / 1000))
                + f".{event_ms % 1000:03d}Z",
            })
            producer.produce(topic, value=value, key=str(card), timestamp=wall_ms)
            sent.append((event_id, card, event_ms, wall_ms))
            event_id += 1
        producer.poll(0)
        time.sleep(0.002)
    producer.flush(30)
    return pl.DataFrame(sent, schema=["event_id", "card_id", "event_ms", "sent_ms"], orient="row")


def latencies(sent: pl.DataFrame, received: Path) -> pl.DataFrame:
    """Per alert: the completing transaction's send time and the first POST's arrival."""
    completing = (
        sent.with_columns((pl.col("event_ms") // MINUTE_MS * MINUTE_MS).alias("ws"))
        .sort("sent_ms", "event_id")
        .with_columns(pl.int_range(pl.len()).over("card_id", "ws").alias("nth"))
        .filter(pl.col("nth") == 2)  # the third transaction of its card and minute
        .select(pl.format("{}-{}", "card_id", "ws").alias("alert_id"), "sent_ms",
                (pl.col("event_ms") < pl.col("sent_ms") - 30_000).alias("late_upload"))
    )
    posts = pl.read_ndjson(received).filter(~pl.col("duplicate")).select(
        pl.col("key").alias("alert_id"), (pl.col("received_ns") // 1_000_000).alias("posted_ms"))
    return completing.join(posts, on="alert_id", how="left").with_columns(
        (pl.col("posted_ms") - pl.col("sent_ms")).alias("latency_ms"))


def run_one(trigger: str, bootstrap: str, args: argparse.Namespace) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix=f"bench-latency-{trigger}-"))
    topic = f"tx-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic)
    receiver, url = start_receiver(work)
    job = start_job(work, bootstrap, topic, url, trigger)
    try:
        started_ms = int(time.time() * 1000)
        sent = play(bootstrap, topic, rate=args.rate, seconds=args.warmup + args.seconds,
                    late_share=args.late_share, cards=args.cards, seed=args.seed)
        time.sleep(args.drain)
    finally:
        job.send_signal(signal.SIGTERM)
        job.wait(60)
        receiver.terminate()
        receiver.wait(10)
        if receiver.stdout is not None:
            receiver.stdout.close()
    # NOTE: the first --warmup seconds of traffic warm the job up (its first batch
    # creates the Delta table, the clients, compiles the plan): measured from then on
    result = latencies(sent, work / "received.jsonl").filter(
        pl.col("sent_ms") >= started_ms + args.warmup * 1000)
    got = result.drop_nulls("latency_ms")
    ms = got["latency_ms"].to_numpy()
    late = got.filter("late_upload")["latency_ms"].to_numpy()
    return {
        "trigger": "back to back" if trigger in ("0s", "0") else trigger,
        "transactions": sent.height,
        "alerts": result.height,
        "posted": got.height,
        "p50": float(np.percentile(ms, 50)),
        "p90": float(np.percentile(ms, 90)),
        "p99": float(np.percentile(ms, 99)),
        "max": float(ms.max()),
        "late_alerts": len(late),
        "late_p99": float(np.percentile(late, 99)) if len(late) else None,
        "mean": statistics.fmean(ms.tolist()),
    }


def table(rows: list[dict[str, object]], args: argparse.Namespace) -> str:
    cells = []
    for r in rows:
        late = "-" if r["late_p99"] is None else f"{r['late_alerts']}, {r['late_p99'] / 1000:.2f} s"
        cells.append((r["trigger"], f"{r['transactions']:,}", f"{r['alerts']:,} ({r['posted']:,})",
                      *(f"{r[q] / 1000:.2f} s" for q in ("p50", "p90", "p99", "max")), late))
    lines = markdown_table(("trigger", "transactions", "alerts (posted)", "p50", "p90", "p99",
                            "max", "alerts from hour-late uploads, p99"), cells,
                           align="lrrrrrrr")
    return (f"{args.rate:g} transactions/s for {args.seconds:g} s per trigger "
            f"({args.late_share:.0%} uploaded up to an hour late), {args.cards:,} cards "
            "(Zipf 1.1), 3 Kafka partitions; latency = webhook receipt minus the send "
            "time of the transaction that completed the rule.\n\n" + "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument("--rate", type=float, default=300.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--late-share", type=float, default=0.02)
    parser.add_argument("--cards", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--warmup", type=float, default=10.0,
                        help="seconds of traffic before the measured part")
    parser.add_argument("--drain", type=float, default=5.0)
    parser.add_argument("--triggers", default="1s,0s")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap
        if bootstrap is None:
            bootstrap = stack.enter_context(running_broker()).bootstrap
        rows = [run_one(t, bootstrap, args) for t in args.triggers.split(",")]
    text = table(rows, args)
    print(text)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
