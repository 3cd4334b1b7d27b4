"""``jobs/fraud_alerts.py`` on its parameter contract, replaying Parquet files.

The contract (checked by a harness outside the repo, so the names are fixed):
``--param input=DIR max_files_per_batch=N delay=10s allowed_lateness=1h
webhook=URL output=PATH late_output=PATH``. Generated transactions land as
Parquet files (arrival order = mtime) with bursts on hot cards, uploads up to an
hour late (they still count) and rows up to two hours late (late output). The
job is SIGKILLed at the sinks' commit points and at random moments while a
webhook receiver fails, throttles and answers slowly; then:

- the alert table equals a batch recompute: one row per ``alert_id`` with the
  window's final count and total over the rows that were not late, where
  "late" is decided by an independent simulation of the watermark per batch;
- the late output holds exactly the late rows, with their reason;
- the webhook got every alert's key, each with one body (revision 0, the count
  when it fired), and a replay of the log on a new checkpoint sends the same
  bodies (the receiver sees duplicates only).
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "fraud_alerts.py"
FILES, PER_BATCH = 24, 2
DELAY_MS, LATENESS_MS, MINUTE_MS = 10_000, 3_600_000, 60_000

pytestmark = [pytest.mark.slow, pytest.mark.crash, pytest.mark.delta]


def job() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fraud_alerts_job", JOB)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module  # a job's dataclass Params needs its module registered
    spec.loader.exec_module(module)
    return module


def simulate(
    data: pl.DataFrame, *, unread: pl.DataFrame | None = None
) -> tuple[set[int], pl.DataFrame]:
    """(late event ids, expected alert table) from the files' batches alone;
    ``unread``: rows of files the job must not read (dead letters)."""
    size = -(-data.height // FILES)
    t = pl.col("event_time").dt.epoch("ms")
    rows = data.with_columns(
        (pl.int_range(pl.len()) // (size * PER_BATCH)).alias("batch"),
        (t // MINUTE_MS * MINUTE_MS + MINUTE_MS).alias("we"),
    )
    if unread is not None:
        rows = rows.join(unread.select("event_id"), on="event_id", how="anti")
    newest = rows.group_by("batch").agg(t.max().alias("newest")).sort("batch")
    marks = newest.with_columns(
        (pl.col("newest").cum_max().shift(1) - DELAY_MS).alias("wm")  # from earlier batches
    )
    rows = rows.join(marks.select("batch", "wm"), on="batch", how="left")
    late = rows.filter(pl.col("wm").is_not_null() & (pl.col("we") + LATENESS_MS <= pl.col("wm")))
    kept = rows.join(late.select("event_id"), on="event_id", how="anti")
    want = (
        kept.group_by((pl.col("we") - MINUTE_MS).alias("ws"), "card_id")
        .agg(pl.len().cast(pl.Int64).alias("transactions"),
             pl.col("amount").sum().alias("total_amount"),
             pl.col("amount").max().alias("max_amount"),
             pl.col("event_time").min().alias("first_event_time"),
             pl.col("event_time").max().alias("last_event_time"))
        .filter(pl.col("transactions") >= 3)
        .with_columns(pl.format("{}-{}", "card_id", "ws").alias("alert_id"))
    )
    return set(late["event_id"].to_list()), want


def table(path: Path) -> pl.DataFrame:
    return alert_rows(pl.read_delta(str(path)))


def alert_rows(df: pl.DataFrame) -> pl.DataFrame:
    """An alert table's rows in comparable form (windows as epoch ms), sorted."""
    return df.select(
        "alert_id", "card_id",
        pl.col("window_start").dt.epoch("ms").alias("ws"),
        (pl.col("window_end") - pl.col("window_start")).dt.total_milliseconds().alias("len_ms"),
        "transactions", "total_amount", "max_amount",
        pl.col("first_event_time").dt.epoch("ms"), pl.col("last_event_time").dt.epoch("ms"),
    ).sort("alert_id")


def receiver(tmp: Path, **flags: object) -> tuple[subprocess.Popen[str], str]:
    args = [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]
    proc = subprocess.Popen([sys.executable, "-m", "microbatch.tools.receiver", "--port", "0",
                             "--log", str(tmp / "received.jsonl"), *args],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("listening on "), line
    return proc, line.split()[-1] + "/alerts"


def run(params: dict[str, str], chk: Path, *, fault: str | None = None,
        kill_after: float | None = None) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROBATCH_FAULT")}
    if fault:
        env["MICROBATCH_FAULT"] = fault
    cmd = [sys.executable, "-m", "microbatch.cli", "run", str(JOB), "--checkpoint", str(chk),
           "--trigger", "available-now",
           *[a for k, v in params.items() for a in ("--param", f"{k}={v}")]]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    if kill_after is not None:
        try:
            proc.wait(kill_after)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode in (0, -9), err[-3000:]
    return proc.returncode


def test_the_contract_with_kills_and_a_flaky_webhook_equals_a_batch_recompute(
    tmp_path: Path,
) -> None:
    fraud = job()
    data = fraud.generated_transactions(rows=12_000, cards=300, events_per_second=50.0,
                                        late_fraction=0.03, late_by=("1m", "2h"), seed=4)
    fraud.write_files(tmp_path / "in", data, files=FILES)
    late_ids, want = simulate(data)
    assert 50 < len(late_ids) < 300  # the two-hour-late share
    assert want.height > 100

    hook, url = receiver(tmp_path, seed=2, fail_rate=0.1, throttle_rate=0.02,
                         slow_rate=0.02, slow_s=0.3)
    params = {"input": str(tmp_path / "in"), "max_files_per_batch": str(PER_BATCH),
              "delay": "10s", "allowed_lateness": "1h", "webhook": url,
              "output": str(tmp_path / "alerts"), "late_output": str(tmp_path / "late")}
    chk = tmp_path / "chk"
    try:
        kills = 0
        for i, point in enumerate(["sink.after_data", "sink.before_commit",
                                   "sink.after_commit", "after_sink", "after_state_commit"]):
            kills += run(params, chk, fault=f"{point}@{2 * i + 1}") == -9
        rng = random.Random(1)
        for _ in range(2):
            kills += run(params, chk, kill_after=rng.uniform(2.0, 4.0)) == -9
        assert run(params, chk) == 0
        # a replay of the same log on a new checkpoint (and a new table)
        replay = {**params, "output": str(tmp_path / "replay"),
                  "late_output": str(tmp_path / "replay-late")}
        assert run(replay, tmp_path / "chk-replay") == 0
    finally:
        hook.terminate()
        hook.wait(10)
        assert hook.stdout is not None
        hook.stdout.close()
    assert kills >= 4

    got = table(tmp_path / "alerts")
    assert got["alert_id"].n_unique() == got.height  # one row per alert
    expected = want.select(
        "alert_id", "card_id", "ws", pl.lit(MINUTE_MS).alias("len_ms"), "transactions",
        "total_amount", "max_amount", pl.col("first_event_time").dt.epoch("ms"),
        pl.col("last_event_time").dt.epoch("ms"),
    ).sort("alert_id")
    assert got.equals(expected.cast(dict(got.schema)))  # type: ignore[arg-type]
    assert table(tmp_path / "replay").equals(got)

    late = pl.read_delta(str(tmp_path / "late"))
    assert set(late["event_id"].to_list()) == late_ids
    assert late.height == len(late_ids)
    assert late["late_reason"].str.contains("of allowed lateness").all()

    posts = [json.loads(line) for line in (tmp_path / "received.jsonl").read_text().splitlines()]
    bodies: dict[str, set[str]] = {}
    for post in posts:
        bodies.setdefault(post["key"], set()).add(post["sha256"])
    assert set(bodies) == set(expected["alert_id"].to_list())  # every alert paged
    assert all(len(b) == 1 for b in bodies.values())  # one body per key, replay included
    assert not any(p["status"] == 409 for p in posts)
    first = {p["key"]: json.loads(p["body"]) for p in posts if not p["duplicate"]}
    assert all(b["revision"] == 0 and b["transactions"] >= 3 for b in first.values())
    assert any(b["transactions"] < t for b, t in zip(
        (first[k] for k in expected["alert_id"]), expected["transactions"], strict=True))


def test_a_drifted_file_is_dead_lettered_and_counted_and_the_alerts_equal_the_recompute(
    tmp_path: Path,
) -> None:
    fraud = job()
    data = fraud.generated_transactions(rows=6_000, cards=150, events_per_second=50.0,
                                        late_fraction=0.0, seed=7)
    fraud.write_files(tmp_path / "in", data, files=FILES)
    size = -(-data.height // FILES)
    drifted = tmp_path / "in" / "tx-00005.parquet"  # an upstream renamed amount
    stat = drifted.stat()
    unread = data.slice(5 * size, size)
    unread.rename({"amount": "amt"}).write_parquet(drifted)
    os.utime(drifted, ns=(stat.st_mtime_ns, stat.st_mtime_ns))
    _, want = simulate(data, unread=unread)
    assert want.height > 20

    chk = tmp_path / "chk"
    params = {"input": str(tmp_path / "in"), "max_files_per_batch": str(PER_BATCH),
              "delay": "10s", "allowed_lateness": "1h",
              "output": str(tmp_path / "alerts"), "late_output": str(tmp_path / "late")}
    assert run(params, chk) == 0

    got = table(tmp_path / "alerts")
    expected = want.select(
        "alert_id", "card_id", "ws", pl.lit(MINUTE_MS).alias("len_ms"), "transactions",
        "total_amount", "max_amount", pl.col("first_event_time").dt.epoch("ms"),
        pl.col("last_event_time").dt.epoch("ms"),
    ).sort("alert_id")
    assert got.equals(expected.cast(dict(got.schema)))  # type: ignore[arg-type]
    dead = pl.read_parquet(chk / "dead_letter" / "**" / "*.parquet")
    assert dead["location"].to_list() == [str(drifted)]
    assert dead["reason"][0].startswith("schema mismatch: missing column 'amount'")
    status = subprocess.run(
        [sys.executable, "-m", "microbatch.cli", "status", str(chk), "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
    )
    doc = json.loads(status.stdout)
    codes = {a["code"]: a["message"] for a in doc["alarms"]}
    assert codes["schema_mismatch"].startswith("schema mismatch: 1 input file in the last")

