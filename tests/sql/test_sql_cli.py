"""``microbatch sql FILE.sql``, run as a real subprocess on real files and Delta tables.

A script's output equals the same query written with the Python API and a
one-shot Polars computation over every row (windowed, materialized view, two
INSERTs, ``--param``), also when the process is SIGKILLed at random moments and
restarted on its checkpoint. A mistake in a script is one paragraph naming
``FILE:LINE:COLUMN`` and the fix, exit code 2, no traceback.
"""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from input_files import write_parquet_files
from kill_helpers import run_with_kills
from oracles import tumbling_or_hopping
from polars.testing import assert_frame_equal

import microbatch as mb
from microbatch.sql.script import compile_script

CLI = [sys.executable, "-m", "microbatch.cli"]


def cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROBATCH_FAULT")}
    return subprocess.run([*CLI, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=env, check=False)


SCRIPT = """-- totals per card
CREATE TABLE tx (card_id BIGINT, amount DOUBLE, event_time TIMESTAMP(3),
  WATERMARK FOR event_time AS event_time - INTERVAL '5' SECOND)
  WITH ('connector' = 'files', 'path' = '${input}', 'format' = 'parquet');
CREATE TABLE totals WITH ('connector' = 'delta', 'path' = '${output}');
INSERT INTO totals SELECT card_id, amount FROM tx;
"""


@pytest.mark.parametrize(("script", "params", "fragments"), [
    (SCRIPT, ["input=in"], ["job.sql:5:60:", "${output} has no value",
                            "Pass --param output=VALUE"]),
    (SCRIPT, ["input=in", "output=out", "outptu=x"],
     ["unknown --param 'outptu'", "Did you mean 'output'?"]),
    (SCRIPT.replace("'format'", "'fromat'"), ["input=in", "output=out"],
     ["job.sql:4:53:", "no option 'fromat'", "did you mean 'format'"]),
    (SCRIPT.replace("INSERT INTO totals", "INSERT INTO total"), ["input=in", "output=out"],
     ["job.sql:6:13:", "no table total is declared", "CREATE TABLE total"]),
    (SCRIPT.replace("AS event_time -", "AS event_time +"), ["input=in", "output=out"],
     ["job.sql:3:17:", "column minus a fixed interval"]),
    (SCRIPT.replace("CREATE TABLE totals", "CREATE TABLE totals (a INT"),
     ["input=in", "output=out"], ["job.sql:5:", "syntax"]),
])
def test_script_mistakes_are_one_paragraph_with_line_and_column(
    tmp_path: Path, script: str, params: list[str], fragments: list[str]
) -> None:
    (tmp_path / "job.sql").write_text(script)
    args: list[str] = []
    for item in params:
        args += ["--param", item]
    result = cli("sql", "job.sql", "--checkpoint", tmp_path / "chk", *args, cwd=tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    message = " ".join(result.stderr.split())
    for fragment in fragments:
        assert fragment in message, message
    assert not (tmp_path / "chk").exists()  # refused before anything ran


def test_missing_script_file(tmp_path: Path) -> None:
    result = cli("sql", "nope.sql", "--checkpoint", tmp_path / "chk", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "cannot read the SQL script nope.sql" in " ".join(result.stderr.split())


# ------------------------------------------------------------------ real runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MINUTE_MS = 60_000

RUN_SCRIPT = """-- windowed totals, big transactions and a per-card view, from one source
CREATE TABLE tx (card_id BIGINT, amount DOUBLE, event_time TIMESTAMP(3),
  WATERMARK FOR event_time AS event_time - INTERVAL '5' SECOND)
  WITH ('connector' = 'files', 'path' = '${input}', 'format' = '${format}',
        'max_files_per_batch' = '1');
CREATE TABLE totals WITH ('connector' = 'delta', 'path' = '${totals}');
CREATE TABLE big WITH ('connector' = 'files', 'path' = '${big}');
INSERT INTO totals
SELECT window_start, window_end, card_id, COUNT(*) AS n, SUM(amount) AS total
FROM TABLE(TUMBLE(TABLE tx, DESCRIPTOR(event_time), INTERVAL '1' MINUTE))
WHERE amount >= ${min_amount}
GROUP BY window_start, window_end, card_id;
INSERT INTO big SELECT card_id, amount, event_time FROM tx WHERE amount > 400;
CREATE MATERIALIZED VIEW per_card WITH ('connector' = 'delta', 'path' = '${per_card}') AS
SELECT card_id, COUNT(*) AS n, SUM(amount) AS total, MAX(amount) AS biggest
FROM tx GROUP BY card_id;
"""
MIN_AMOUNT = 50


def rows_in_order(seed: int, n: int) -> pl.DataFrame:
    """Transactions in event-time order (so no row is late for a 5 s watermark
    delay, whatever the file split: a one-shot computation is the oracle);
    whole-number amounts, so sums are exact in any order."""
    rng = random.Random(seed)
    times = sorted(rng.randrange(0, 12 * MINUTE_MS) for _ in range(n))
    return pl.DataFrame({
        "card_id": [rng.randrange(6) for _ in range(n)],
        "amount": [float(rng.randrange(1, 500)) for _ in range(n)],
        "event_time": [T0.timestamp() * 1000 + t for t in times],
    }).with_columns(pl.col("event_time").cast(pl.Int64).cast(pl.Datetime("ms", "UTC")))


def write_input(directory: Path, rows: pl.DataFrame, cuts: list[int], fmt: str) -> None:
    """``rows`` as consecutive files split at ``cuts``, in arrival order."""
    bounds = [0, *sorted({c for c in cuts if 0 < c < rows.height}), rows.height]
    frames = [rows[lo:hi] for lo, hi in itertools.pairwise(bounds)]
    if fmt == "parquet":
        write_parquet_files(directory, frames)
        return
    directory.mkdir(parents=True, exist_ok=True)
    for i, part in enumerate(frames):
        part.write_csv(directory / f"part-{i:05d}.csv")
        stamp = 1_700_000_000_000_000_000 + i * 1_000_000
        os.utime(directory / f"part-{i:05d}.csv", ns=(stamp, stamp))


def delta(path: Path) -> pl.DataFrame:
    frame = pl.from_arrow(DeltaTable(str(path)).to_pyarrow_table())
    assert isinstance(frame, pl.DataFrame)
    return frame


def windows(frame: pl.DataFrame) -> pl.DataFrame:
    """A windowed result in one comparable shape: epoch-ms bounds, Int64 counts."""
    return frame.select(
        pl.col("window_start").dt.epoch("ms").alias("ws"),
        pl.col("window_end").dt.epoch("ms").alias("we"),
        "card_id", pl.col("n").cast(pl.Int64), "total",
    ).sort("ws", "card_id")  # fmt: skip


def window_oracle(rows: pl.DataFrame) -> pl.DataFrame:
    kept = rows.filter(pl.col("amount") >= MIN_AMOUNT)
    return tumbling_or_hopping(
        kept, time="event_time", keys=["card_id"], size_ms=MINUTE_MS, slide_ms=MINUTE_MS,
        aggs=[pl.len().cast(pl.Int64).alias("n"), pl.col("amount").sum().alias("total")],
    ).select("ws", "we", "card_id", "n", "total").sort("ws", "card_id")  # fmt: skip


def per_card_oracle(rows: pl.DataFrame) -> pl.DataFrame:
    return rows.group_by("card_id").agg(
        pl.len().cast(pl.Int64).alias("n"), pl.col("amount").sum().alias("total"),
        pl.col("amount").max().alias("biggest"),
    ).sort("card_id")  # fmt: skip


def run_args(tmp: Path, fmt: str = "parquet") -> list[str]:
    params = {"input": tmp / "in", "format": fmt, "totals": tmp / "totals", "big": tmp / "big",
              "per_card": tmp / "per_card", "min_amount": str(MIN_AMOUNT)}
    args = ["sql", str(tmp / "job.sql"), "--checkpoint", str(tmp / "chk"),
            "--trigger", "available-now"]
    for name, value in params.items():
        args += ["--param", f"{name}={value}"]
    return args


def closed(oracle: pl.DataFrame, rows: pl.DataFrame) -> pl.DataFrame:
    """The windows of ``oracle`` that the final watermark of ``rows`` closes
    (what an available-now run has emitted in append mode)."""
    watermark = rows.select(pl.col("event_time").max().dt.epoch("ms")).item() - 5_000
    return oracle.filter(pl.col("we") <= watermark)


def assert_outputs(tmp: Path, rows: pl.DataFrame) -> None:
    """Every table the script writes equals its one-shot computation over ``rows``."""
    assert_frame_equal(windows(delta(tmp / "totals")), closed(window_oracle(rows), rows))
    big = mb.parquet_table(tmp / "big").sort("event_time", "card_id", "amount")
    want = rows.filter(pl.col("amount") > 400).sort("event_time", "card_id", "amount")
    assert_frame_equal(big, want)
    per_card = delta(tmp / "per_card").with_columns(pl.col("n").cast(pl.Int64)).sort("card_id")
    assert_frame_equal(per_card, per_card_oracle(rows))


@pytest.mark.delta
@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_script_of_three_queries_equals_one_shot_and_continues_on_its_checkpoint(
    tmp_path: Path, fmt: str
) -> None:
    """Two INSERTs and a materialized view from Parquet or CSV files with a
    WATERMARK, ``--param`` filling paths, the format and a WHERE threshold; a
    second run over more files continues each query's checkpoint."""
    rows = rows_in_order(seed=7, n=300)
    rng = random.Random(fmt)
    first, more = rows[:180], rows[180:]
    (tmp_path / "job.sql").write_text(RUN_SCRIPT)
    write_input(tmp_path / "in", first, rng.sample(range(1, 180), 5), fmt)
    result = cli(*run_args(tmp_path, fmt), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for name in ("totals", "big", "per_card"):  # each query's checkpoint, its progress lines
        assert (tmp_path / "chk" / name / "commits").is_dir()
        assert f"[{name}] " in result.stderr, result.stderr
    assert_outputs(tmp_path, first)

    later = tmp_path / "later"
    write_input(later, more, rng.sample(range(1, 120), 3), fmt)
    for i, file in enumerate(sorted(later.iterdir())):  # arrive after the first files
        target = tmp_path / "in" / f"later-{i:05d}{file.suffix}"
        file.rename(target)
        stamp = 1_800_000_000_000_000_000 + i * 1_000_000
        os.utime(target, ns=(stamp, stamp))
    result = cli(*run_args(tmp_path, fmt), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert_outputs(tmp_path, rows)
    assert closed(window_oracle(rows), rows).height > closed(window_oracle(first), first).height


# ------------------------------------------------------------------ the Python API's twin

TWIN_SCRIPT = """
CREATE TABLE tx (card_id BIGINT, amount DOUBLE, event_time TIMESTAMP(3),
  WATERMARK FOR event_time AS event_time - INTERVAL '5' SECOND)
  WITH ('connector' = 'files', 'path' = '${input}', 'format' = 'parquet',
        'max_files_per_batch' = '1');
CREATE TABLE totals WITH ('connector' = 'memory', 'name' = '${prefix}_totals');
INSERT INTO totals
SELECT window_start, window_end, card_id, COUNT(*) AS n, SUM(amount) AS total
FROM TABLE(TUMBLE(TABLE tx, DESCRIPTOR(event_time), INTERVAL '1' MINUTE))
WHERE amount >= ${min_amount}
GROUP BY window_start, window_end, card_id;
CREATE MATERIALIZED VIEW ${prefix}_per_card AS
SELECT card_id, COUNT(*) AS n, SUM(amount) AS total, MAX(amount) AS biggest
FROM tx GROUP BY card_id;
"""

disorder = st.lists(  # (card, ms since T0, amount): arrival order != event-time order
    st.tuples(st.integers(0, 3), st.integers(0, 5 * MINUTE_MS), st.integers(1, 120)),
    min_size=1, max_size=60,
)
_names = itertools.count()


def in_arrival_order(items: list[tuple[int, int, int]]) -> pl.DataFrame:
    return pl.DataFrame({
        "card_id": [c for c, _, _ in items],
        "amount": [float(a) for _, _, a in items],
        "event_time": [int(T0.timestamp() * 1000) + t for _, t, _ in items],
    }, schema={"card_id": pl.Int64, "amount": pl.Float64, "event_time": pl.Int64}).with_columns(
        pl.col("event_time").cast(pl.Datetime("ms", "UTC")))


@pytest.mark.slow
@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=disorder, cuts=st.lists(st.integers(1, 59), max_size=6))
def test_script_queries_equal_their_python_api_twins_for_every_file_split(
    tmp_path: Path, items: list[tuple[int, int, int]], cuts: list[int]
) -> None:
    """Out-of-order rows split into files at random: the script's windowed INSERT
    drops the same late rows as the Python API's query and emits the same
    windows; its materialized view equals the one-shot GROUP BY."""
    rows = in_arrival_order(items)
    tmp = Path(tempfile.mkdtemp(dir=tmp_path))
    write_input(tmp / "in", rows, cuts, "parquet")
    prefix = f"twin{next(_names)}"
    script = compile_script(TWIN_SCRIPT, {"input": str(tmp / "in"), "prefix": prefix,
                                          "min_amount": "30"})
    assert [q.name for q in script.queries] == ["totals", f"{prefix}_per_card"]
    for i, item in enumerate(script.queries):
        item.writer.start(tmp / f"chk{i}", "available-now").await_termination()

    twin = (
        mb.read_files(tmp / "in", format="parquet", max_files_per_batch=1)
        .with_watermark("event_time", "5s")
        .filter(pl.col("amount") >= 30)
        .group_by(mb.window("event_time", "1m"), "card_id")
        .agg(pl.len().alias("n"), pl.col("amount").sum().alias("total"))
    )
    twin.write_memory(f"{prefix}_twin").start(tmp / "chk_twin", "available-now") \
        .await_termination()
    got, want = mb.table(f"{prefix}_totals"), mb.table(f"{prefix}_twin")
    assert got.columns == want.columns
    assert_frame_equal(windows(got), windows(want))

    per_card = mb.table(f"{prefix}_per_card").with_columns(pl.col("n").cast(pl.Int64))
    assert_frame_equal(per_card.sort("card_id"), per_card_oracle(rows))


# ------------------------------------------------------------------ SIGKILL


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.delta
def test_script_killed_at_random_moments_gives_one_clean_runs_output(tmp_path: Path) -> None:
    """The three-query script SIGKILLed mid-run and restarted on its checkpoint:
    each table equals what one uninterrupted run writes (the one-shot oracle)."""
    rng = random.Random(int(os.environ.get("CRASH_SEED", "2929")))
    rows = rows_in_order(seed=29, n=600)
    write_input(tmp_path / "in", rows, rng.sample(range(1, 600), 29), "parquet")
    (tmp_path / "job.sql").write_text(RUN_SCRIPT)
    kills = run_with_kills([*CLI, *run_args(tmp_path)], tmp_path / "chk" / "totals",
                           tmp_path / "stderr.log", rng, kills=3, most_commits=6,
                           most_delay_s=0.05)
    assert kills == 3
    assert_outputs(tmp_path, rows)
