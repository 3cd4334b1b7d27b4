"""The stateful examples against one-shot oracles: random batch splits and
restarts (hypothesis), and SIGKILLs of the real job processes.

Every example takes each key's rows in event-time order once the watermark
passes them, so its output must equal the oracle's whatever the split, the
disorder within the watermark delay, or where the process died.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType

import device_offline
import geo_velocity
import polars as pl
import pytest
import running_total
import sliding_burst
import stateful_input
import stateful_oracles as oracle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import microbatch as mb
from microbatch.sources.generator import GeneratorSource
from microbatch.testing import StreamTest

ROOT = Path(__file__).resolve().parents[2]
START = datetime(2026, 1, 1, tzinfo=UTC)
DELAY_S = 40
SCHEMA = {
    "event_id": pl.Int64,
    "card_id": pl.Int64,
    "device_id": pl.Int64,
    "country": pl.String,
    "amount": pl.Float64,
    "event_time": pl.Datetime("ms", "UTC"),
}

Example = tuple[ModuleType, Callable[[pl.DataFrame, int], pl.DataFrame], list[str]]
EXAMPLES: dict[str, Example] = {
    "geo_velocity": (geo_velocity, oracle.geo_velocity,
                     ["alert_id", "card_id", "event_id", "country", "previous_country"]),
    "device_offline": (device_offline, oracle.device_offline,
                       ["event_key", "device_id", "status"]),
    "sliding_burst": (sliding_burst, oracle.sliding_burst, ["alert_id", "card_id", "event_id"]),
    "running_total": (running_total, oracle.running_total,
                      ["card_id", "event_id", "amount", "session_total"]),
}


@st.composite
def payments(draw: st.DrawFn) -> pl.DataFrame:
    """Up to 60 payments of 3 cards, event time advancing in steps chosen to hit
    the rules' edges (30 s, 1, 5, 10, 30 min), each up to 30 s behind (less than
    the 40 s watermark delay: no row is late), some at the same millisecond."""
    n = draw(st.integers(1, 60))
    steps = draw(st.lists(st.sampled_from([0, 10, 20, 30, 60, 300, 301, 600, 1800, 1801]),
                          min_size=n, max_size=n))
    jitter = draw(st.lists(st.sampled_from([0, 10, 30]), min_size=n, max_size=n))
    cards = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    countries = draw(st.lists(st.sampled_from(["FR", "DE"]), min_size=n, max_size=n))
    amounts = draw(st.lists(st.sampled_from([0.1, 0.2, 1.5, 10.0, 99.99]), min_size=n,
                            max_size=n))
    nominal, times = 0, []
    for step, back in zip(steps, jitter, strict=True):
        nominal += step
        times.append(START + timedelta(seconds=nominal - back))
    return pl.DataFrame({
        "event_id": range(n), "card_id": cards, "device_id": cards, "country": countries,
        "amount": amounts, "event_time": times,
    }, schema=SCHEMA)


def final_watermark(rows: pl.DataFrame) -> int:
    return int(rows["event_time"].dt.epoch("ms").max()) - DELAY_S * 1000  # type: ignore[arg-type]


def check(got: pl.DataFrame, want: pl.DataFrame, columns: list[str]) -> None:
    got = got.select(columns) if got.width else pl.DataFrame(schema=want.select(columns).schema)
    dupes = got.height - got.unique().height
    assert dupes == 0, f"{dupes} rows emitted twice"
    missing = want.select(columns).join(got, on=columns, how="anti", nulls_equal=True)
    extra = got.join(want.select(columns), on=columns, how="anti", nulls_equal=True)
    assert missing.is_empty(), f"missing:\n{missing}"
    assert extra.is_empty(), f"extra:\n{extra}"


@pytest.mark.parametrize("name", list(EXAMPLES))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large])
@given(rows=payments(), data=st.data())
def test_every_split_and_restart_gives_the_oracle(name: str, rows: pl.DataFrame,
                                                  data: st.DataObject) -> None:
    example, answer, columns = EXAMPLES[name]
    cuts = sorted(data.draw(st.sets(st.integers(1, max(rows.height - 1, 1)), max_size=6)))
    restart_at = data.draw(st.sampled_from([None, *range(len(cuts) + 1)]))
    t = StreamTest(lambda s: example.rule(s.with_watermark("event_time", f"{DELAY_S}s")),
                   schema=SCHEMA)
    try:
        for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, rows.height], strict=True)):
            t.add(rows.slice(a, b - a)).process()
            if i == restart_at:
                t.restart()
        assert t.late_rows.height == 0
        assert t.watermark_ms == final_watermark(rows)
        check(t.output, answer(rows, final_watermark(rows)), columns)
    finally:
        t.close()


def test_geo_velocity_with_late_rows_equals_the_oracle_over_the_rows_kept() -> None:
    """Disorder beyond the delay: the late rows go to the late output (nothing
    lost), the alerts are the oracle's over the other rows."""
    rows = pl.DataFrame({
        "event_id": range(7), "card_id": [1] * 6 + [2], "device_id": [1] * 7,
        "country": ["FR", "DE", "FR", "DE", "FR", "DE", "FR"], "amount": [1.0] * 7,
        "event_time": [START + timedelta(minutes=m) for m in (0, 5, 20, 1, 25, 24, 40)],
    }, schema=SCHEMA)
    t = StreamTest(lambda s: geo_velocity.rule(s.with_watermark("event_time", "2m")),
                   schema=SCHEMA)
    for i in range(rows.height):
        t.add(rows.slice(i, 1)).process()
    late = t.late_rows["event_id"].to_list()
    assert late == [3]  # minute 1 arrives after the watermark reached minute 18
    kept = rows.filter(~pl.col("event_id").is_in(late))
    wm = int(rows["event_time"].dt.epoch("ms").max()) - 120_000  # type: ignore[arg-type]
    check(t.output, oracle.geo_velocity(kept, wm), EXAMPLES["geo_velocity"][2])
    # 5 min FR -> DE; then in event-time order 20 FR, 24 DE, 25 FR: two more hops
    assert sorted(t.output["event_id"].to_list()) == [1, 4, 5]
    t.close()


# --------------------------------------------------------------- SIGKILLs

PARAMS = {"rows": "6000", "cards": "40", "event_rate": "0.5", "max_records_per_batch": "150",
          "delay": "30s", "max_delay": "20s", "seed": "5"}


def generated() -> pl.DataFrame:
    src = GeneratorSource(rows_per_second=None, total_rows=int(PARAMS["rows"]), cards=40,
                          max_delay="20s", seed=5, start=stateful_input.START, event_rate=0.5)
    o = src.initial_offset()
    rows = src.read(o, src.latest_offset(o, capped=False)).data
    return rows.with_columns(*stateful_input.derived_columns())


def commits(chk: Path) -> int:
    names = os.listdir(chk / "commits") if (chk / "commits").exists() else []
    return max((int(n) for n in names if n.isdigit()), default=-1) + 1


def run_with_kills(job: Path, chk: Path, out: Path, rng: random.Random, kills: int) -> int:
    """Run ``job`` to the end, SIGKILLing it ``kills`` times a few commits in."""
    cmd = [sys.executable, "-m", "microbatch.cli", "run", str(job), "--checkpoint", str(chk),
           "--trigger", "available-now", "--param", f"output={out}",
           *[a for k, v in PARAMS.items() for a in ("--param", f"{k}={v}")]]
    killed, log = 0, chk.parent / "stderr.log"
    while True:
        with log.open("wb") as err:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        if killed < kills:
            target, deadline = commits(chk) + rng.randint(1, 12), time.monotonic() + 120
            while proc.poll() is None and commits(chk) < target:
                assert time.monotonic() < deadline, "the job made no progress in 120 s"
                time.sleep(0.002)
            time.sleep(rng.uniform(0, 0.02))
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                killed += 1
                continue
        assert proc.wait(timeout=300) == 0, log.read_text()
        return killed


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_sigkilled_jobs_give_the_oracle(name: str, tmp_path: Path) -> None:
    example, answer, columns = EXAMPLES[name]
    chk, out = tmp_path / "chk", tmp_path / "out"
    rng = random.Random(f"{name}-{os.environ.get('CRASH_SEED', '14')}")
    killed = run_with_kills(Path(example.__file__), chk, out, rng, kills=3)
    assert killed == 3
    rows = generated()
    wm = int(rows["event_time"].dt.epoch("ms").max()) - 30_000  # type: ignore[arg-type]
    want = answer(rows, wm)
    assert want.height > 20, "the workload should exercise the rule"
    check(mb.parquet_table(out), want, columns)
    assert signal.SIGKILL  # the kills above are real process kills
