"""The one benchmark harness: timing, the ratio to one-shot Polars, the table and the
worker processes behave as every entry point relies on."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    cold_then_warm,
    dict_table,
    markdown_table,
    ratio,
    repeat,
    run_process,
)


def test_repeat_times_only_the_calls_after_the_warmup() -> None:
    calls: list[int] = []
    times = repeat(lambda: calls.append(1), 3, warmup=2)
    assert len(calls) == 5
    assert len(times) == 3
    assert all(t >= 0 for t in times)


def test_cold_then_warm_runs_in_order_and_reports_each_run() -> None:
    seen: list[list[str]] = []

    def run(phase: str) -> dict[str, Any]:
        return {"phase": phase}

    results = cold_then_warm(run, on_run=lambda so_far: seen.append(list(so_far)))
    assert results == {"cold": {"phase": "cold"}, "warm": {"phase": "warm"}}
    assert seen == [["cold"], ["cold", "warm"]]


def test_ratio_to_the_one_shot_limit() -> None:
    assert ratio(50.0, 100.0) == 0.5
    for engine, limit in ((None, 1.0), (1.0, None), (1.0, 0.0), (1.0, math.nan)):
        assert math.isnan(ratio(engine, limit))


def test_markdown_tables_align_and_escape() -> None:
    assert markdown_table(("a", "b"), [("x|y", 1)], align="lr") == [
        "| a | b |", "|---|---:|", "| x/y | 1 |"]
    assert dict_table([{"name": "q1", "rate": "1,234.5"}])[1] == "|---|---:|"


def test_run_process_reads_the_result_and_reports_failures(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    ok = run_process([sys.executable, "-c", f"open({str(result)!r}, 'w').write('{{\"x\": 1}}')"],
                     result_file=result, log=tmp_path / "ok.log", timeout_s=60)
    assert ok.failure is None
    assert ok.result == {"x": 1}

    bad = run_process([sys.executable, "-c", "raise SystemExit('no data here')"],
                      result_file=result, log=tmp_path / "bad.log", timeout_s=60)
    assert bad.result is None  # a stale result file is never read as this run's
    assert bad.failure is not None
    assert "exit code 1" in bad.failure
    assert "no data here" in bad.failure

    slow = run_process([sys.executable, "-c", "import time; time.sleep(60)"],
                       result_file=result, log=tmp_path / "slow.log", timeout_s=0.5,
                       sample_tree_rss=True)
    assert slow.failure is not None
    assert slow.failure.startswith("timed out")
    assert slow.seconds < 30
    assert slow.peak_tree_rss_mb is not None
    assert slow.peak_tree_rss_mb > 0
