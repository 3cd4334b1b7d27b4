"""Prometheus metrics, scraped over HTTP on 127.0.0.1: values against known inputs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from obs_helpers import CLI, EVENT_SCHEMA, windowed_counts
from prometheus_client.parser import text_string_to_metric_families

import microbatch as mb

REPO = Path(__file__).resolve().parents[2]
GENERATED_JOB = REPO / "jobs" / "generated_to_parquet.py"


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``(sample name, sorted labels) -> value`` of one scrape."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    """One sample, by name and labels."""
    return samples[(name, tuple(sorted(labels.items())))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_query_metrics_match_the_batches(chk: Path, t0: datetime,
                                         name: Callable[[], str]) -> None:
    src = mb.read_memory(schema=EVENT_SCHEMA)
    query = windowed_counts(src).write_memory(name()).start(
        chk, trigger="50ms", name="obsq", metrics_port=0)
    url = query.metrics_url
    assert url is not None
    assert url.startswith("http://127.0.0.1:")
    try:
        src.add({"ts": [t0 + timedelta(seconds=s) for s in (1, 2, 3, 4)], "k": [1, 2, 3, 1]})
        query.process_all_available(30)
        src.add({"ts": [t0 + timedelta(minutes=2)], "k": [4]})
        query.process_all_available(30)
        src.add({"ts": [t0 + timedelta(seconds=5)] * 3, "k": [1, 2, 3]})  # 3 late rows
        query.process_all_available(30)
        got = scrape(url)
        last = query.last_progress
    finally:
        query.stop()

    q = {"query": "obsq"}
    assert value(got, "microbatch_query_active", **q) == 1
    assert value(got, "microbatch_input_rows_total", **q) == 8
    assert value(got, "microbatch_source_input_rows_total", source="0", **q) == 8
    assert value(got, "microbatch_late_rows_total", **q) == 3
    assert value(got, "microbatch_output_rows_total", **q) == 3  # window [t0, t0+1m): 3 keys
    assert value(got, "microbatch_dead_letter_rows_total", **q) == 0
    assert value(got, "microbatch_batches_total", **q) == len(query.recent_progress)
    assert value(got, "microbatch_last_batch_id", **q) == last["batch_id"]
    assert value(got, "microbatch_state_rows", operator="agg-0", **q) == 1
    assert value(got, "microbatch_state_bytes", operator="agg-0", **q) == last["state_bytes"]
    assert value(got, "microbatch_source_lag_records", source="0", partition="0", **q) == 0
    assert value(got, "microbatch_trigger_interval_seconds", **q) == 0.05
    assert value(got, "microbatch_batch_duration_seconds", **q) == pytest.approx(
        last["duration_ms"]["total"] / 1000)
    assert value(got, "microbatch_batch_step_duration_seconds", step="execute", **q) == (
        pytest.approx(last["duration_ms"]["execute"] / 1000))
    watermark = (t0 + timedelta(minutes=2) - timedelta(seconds=10)).timestamp()
    assert value(got, "microbatch_watermark_seconds", **q) == pytest.approx(watermark)
    assert value(got, "microbatch_watermark_lag_seconds", **q) == pytest.approx(
        time.time() - watermark, abs=30)
    # the window [t0, t0 + 1m) was emitted about an hour after its end
    emitted = [r for r in query.recent_progress if r["output_rows"]]
    assert emitted[-1]["latency_ms"]["max_ms"] > 55 * 60_000
    with pytest.raises(urllib.error.URLError):  # the server stops with the query
        urllib.request.urlopen(url, timeout=5)
    assert query.metrics_url is None


def test_busy_metrics_port_is_a_clear_error(chk: Path, name: Callable[[], str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        src = mb.read_memory(schema=EVENT_SCHEMA)
        with pytest.raises(mb.MicrobatchError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            src.write_memory(name()).start(chk, metrics_port=port)
    assert not chk.exists()  # refused before the query opened its checkpoint


def test_cli_run_serves_metrics_while_running(tmp_path: Path) -> None:
    port = free_port()
    chk, out = tmp_path / "chk", tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROBATCH_FAULT")}
    proc = subprocess.Popen(
        [*CLI, "run", str(GENERATED_JOB), "--checkpoint", str(chk), "--trigger", "200ms",
         "--param", f"output={out}", "--param", "rows_per_second=2000",
         "--metrics-port", str(port), "--name", "gen"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        deadline = time.monotonic() + 60
        got: dict = {}
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                got = scrape(f"http://127.0.0.1:{port}/metrics")
            except (urllib.error.URLError, ConnectionError):
                got = {}
            if got.get(("microbatch_batches_total", (("query", "gen"),)), 0) >= 2:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        assert value(got, "microbatch_batches_total", query="gen") >= 2
        assert value(got, "microbatch_input_rows_total", query="gen") > 0
        assert ("microbatch_source_lag_records", (("partition", "0"), ("query", "gen"),
                                                  ("source", "0"))) in got
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert f"serving Prometheus metrics on http://127.0.0.1:{port}/metrics" in stderr
    lines = [line for line in stderr.splitlines() if " batch " in line and "rows in" in line]
    assert lines
    assert all(", lag " in line for line in lines)  # plain progress lines carry the lag
