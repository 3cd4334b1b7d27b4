"""``microbatch lateness``: the profile of a log against a direct, row-by-row computation.

The direct computation walks the batches one by one as the engine would
(watermark from the earlier batches, a row late when its window's end plus the
allowed lateness is at or before it, state added then evicted), with Python
loops: the vectorized profile must give the same numbers on generated logs,
read from a Parquet directory (arrival = mtime) and from a Delta table
(arrival = commit time).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from deltalake import write_deltalake

from microbatch.tools.lateness import load_delta, load_parquet_dir, profile

ROOT = Path(__file__).resolve().parents[2]
WINDOW, TRIGGER = 60_000, 1_000
T0 = 1_767_225_600_000  # 2026-01-01


def generated(seed: int, n: int = 3_000) -> pl.DataFrame:
    """Arrival at ~20 rows/s; event time = arrival minus a small disorder, and for 5 %
    of the rows minus 1 minute to 2 hours (uploads from a phone)."""
    rng = np.random.default_rng(seed)
    arrival = T0 + np.sort(rng.integers(0, n * 50, n))
    lag = rng.integers(0, 3_000, n) + np.where(rng.random(n) < 0.05,
                                               rng.integers(60_000, 7_200_000, n), 0)
    return pl.DataFrame({"arrival": arrival, "event_ms": arrival - lag,
                         "card": rng.integers(0, 40, n)})


def direct(df: pl.DataFrame, *, delay: int, lateness: int, min_count: int) -> dict:
    rows = df.sort("arrival", maintain_order=True).rows(named=True)
    first = rows[0]["arrival"]
    batches: dict[int, list[dict]] = {}
    for r in rows:
        batches.setdefault((r["arrival"] - first) // TRIGGER, []).append(r)
    newest, late, total, kept, alive, sizes = None, 0, {}, {}, {}, []
    waits: list[float] = []
    closed_first: set = set()
    for b in range(max(batches) + 1):
        wm = None if newest is None else newest - delay
        for r in batches.get(b, []):
            we = r["event_ms"] // WINDOW * WINDOW + WINDOW
            key = (we, r["card"])
            total[key] = total.get(key, 0) + 1
            if wm is not None and we + lateness <= wm:
                late += 1
                continue
            kept[key] = kept.get(key, 0) + 1
            alive[key] = we
        if wm is not None:
            alive = {k: we for k, we in alive.items() if we + lateness > wm}
            for key in kept:
                if key not in closed_first and key[0] <= wm:
                    closed_first.add(key)
                    waits.append((first + (b + 1) * TRIGGER - key[0]) / 1000)
        sizes.append(len(alive))
        batch_max = max((r["event_ms"] for r in batches.get(b, [])), default=None)
        if batch_max is not None:
            newest = batch_max if newest is None else max(newest, batch_max)
    alerts = [k for k, n in total.items() if n >= min_count]
    return {
        "late_rows": late / len(rows),
        "windows_differ": sum(kept.get(k, 0) < n for k, n in total.items()) / len(total),
        "alerts": len(alerts),
        "alerts_missed": sum(kept.get(k, 0) < min_count for k in alerts) / len(alerts),
        "state_peak": max(sizes),
        "state_mean": round(float(np.mean(sizes)), 1),
        "first_result_s": round(float(np.median(waits)), 2) if waits else None,
    }


def parquet_log(tmp: Path, df: pl.DataFrame, files: int = 30) -> Path:
    """Land ``df`` as files whose mtimes are their rows' arrival (one file a second...)."""
    root = tmp / "log"
    root.mkdir()
    by_second = df.with_columns((pl.col("arrival") // 1000 * 1000).alias("__s"))
    for (second,), part in by_second.group_by("__s", maintain_order=True):
        path = root / f"f-{second}.parquet"
        part.select(pl.from_epoch("event_ms", time_unit="ms").dt.replace_time_zone("UTC")
                    .alias("event_time"), "card").write_parquet(path)
        os.utime(path, ns=(second * 10**6, second * 10**6))
    return root


@pytest.mark.parametrize("seed", [1, 2])
def test_the_profile_of_a_parquet_log_equals_the_direct_computation(
    tmp_path: Path, seed: int
) -> None:
    df = generated(seed).with_columns(pl.col("arrival") // 1000 * 1000)  # file mtimes
    log = load_parquet_dir(parquet_log(tmp_path, df), time_column="event_time", keys=["card"])
    delays, lateness = [0, 5_000, 60_000], [0, 600_000, 3_600_000]
    table = profile(log, window_ms=WINDOW, delays_ms=delays, lateness_ms=lateness,
                    trigger_ms=TRIGGER, min_count=3)
    assert table.height == 9
    for cell in table.iter_rows(named=True):
        want = direct(df, delay=int(cell["delay_s"] * 1000),
                      lateness=int(cell["allowed_lateness_s"] * 1000), min_count=3)
        got = {k: cell[k] for k in want}
        assert got == pytest.approx(want), (cell["delay_s"], cell["allowed_lateness_s"])
    # more lateness allowed: never more rows late, never fewer windows in state
    for _, cells in table.group_by("delay_s"):
        by_lateness = cells.sort("allowed_lateness_s")
        assert by_lateness["late_rows"].diff().drop_nulls().le(0).all()
        assert by_lateness["state_peak"].diff().drop_nulls().ge(0).all()


def test_the_profile_of_a_delta_log_uses_commit_times(tmp_path: Path) -> None:
    df = generated(3, n=600)
    path = str(tmp_path / "table")
    for _, part in df.with_columns((pl.col("arrival") // 5_000).alias("v")).group_by(
            "v", maintain_order=True):
        write_deltalake(path, part.select(
            pl.from_epoch("event_ms", time_unit="ms").dt.replace_time_zone("UTC")
            .alias("event_time"), "card").to_arrow(), mode="append")
    log = load_delta(path, time_column="event_time", keys=["card"])
    assert log.rows.height == 600
    assert log.rows["__arrival"].is_sorted()  # commit times, in version order
    table = profile(log, window_ms=WINDOW, delays_ms=[1_000], lateness_ms=[0],
                    trigger_ms=TRIGGER, min_count=3)
    commits = log.rows.select(pl.col("__arrival").alias("arrival"), "__t", "card")
    want = direct(commits.rename({"__t": "event_ms"}), delay=1_000, lateness=0, min_count=3)
    assert {k: table.row(0, named=True)[k] for k in want} == pytest.approx(want)


def test_the_cli_prints_the_grid_and_writes_the_plot(tmp_path: Path) -> None:
    df = generated(4, n=800).with_columns(pl.col("arrival") // 1000 * 1000)
    root = parquet_log(tmp_path, df)
    plot = tmp_path / "profile.png"
    done = subprocess.run(
        [sys.executable, "-m", "microbatch.cli", "lateness", str(root), "--time", "event_time",
         "--key", "card", "--window", "1m", "--delay", "5s,1m", "--allowed-lateness", "0,1h",
         "--min-count", "3", "--plot", str(plot), "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = pl.read_json(done.stdout.encode())
    assert rows.height == 4
    assert set(rows.columns) >= {"delay_s", "allowed_lateness_s", "late_rows", "alerts_missed",
                                 "state_peak", "first_result_s", "final_result_s"}
    assert plot.stat().st_size > 10_000
    bad = subprocess.run(
        [sys.executable, "-m", "microbatch.cli", "lateness", str(root), "--time", "nope"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert "no column(s) ['nope']" in bad.stderr
    assert "Traceback" not in bad.stderr
