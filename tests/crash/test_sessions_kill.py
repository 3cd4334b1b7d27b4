"""Session windows into Delta under SIGKILL: the table equals one-shot sessions.

``jobs/card_sessions.py`` MERGEs sessions per card into a Delta table in
``update`` mode (and, parametrized, appends the change rows in ``changelog``
mode). A batch that extends or merges sessions must delete the rows it
replaces in the same commit; killed at random moments and restarted on its
checkpoint, the job must leave exactly the one-shot Polars sessionization of
every row: no stale session, no row twice, nothing missing (issue 28).
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from urllib.parse import unquote

import polars as pl
import pytest
from change_oracle import apply_changes
from kill_helpers import run_with_kills
from oracles import sessions
from polars.testing import assert_frame_equal

pytestmark = [pytest.mark.crash, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "card_sessions.py"
ROWS, CAP, GAP_MS = 8_000, 250, 10_000
KEYS = ["window_start", "window_end", "card_id"]


def command(chk: Path, out: Path, mode: str, backend: str = "memory") -> list[str]:
    return [
        sys.executable, "-m", "microbatch.cli", "run", str(JOB),
        "--checkpoint", str(chk), "--trigger", "available-now",
        "--param", f"output={out}", "--param", f"rows={ROWS}",
        "--param", f"max_records_per_batch={CAP}", "--param", f"mode={mode}",
        "--state-backend", backend,
    ]  # fmt: skip


def one_shot_sessions() -> pl.DataFrame:
    """Every row of the job's log sessionized at once by Polars (no row is late:
    the watermark delay equals the generator's largest delay)."""
    sys.path.insert(0, str(ROOT / "jobs"))
    try:
        import card_sessions
    finally:
        sys.path.pop(0)
    from microbatch.sources.generator import GeneratorSource

    params = card_sessions.Params(output="unused", rows=ROWS)
    src = GeneratorSource(
        rows_per_second=None, total_rows=ROWS, seed=params.seed, cards=params.cards,
        event_rate=params.event_rate, max_delay=params.max_delay, start=card_sessions.START,
    )  # fmt: skip
    o = src.initial_offset()
    rows = src.read(o, src.latest_offset(o, capped=False)).data
    got = sessions(
        rows, time="event_time", keys=["card_id"], gap_ms=GAP_MS,
        aggs=[pl.len().alias("transactions"),
              pl.col("amount").cast(card_sessions.MONEY).sum().alias("total_amount")],
    )  # fmt: skip
    as_time = pl.from_epoch(pl.col("ws"), "ms").dt.replace_time_zone("UTC")
    return got.select(
        as_time.alias("window_start"),
        pl.from_epoch(pl.col("we"), "ms").dt.replace_time_zone("UTC").alias("window_end"),
        "card_id", pl.col("transactions").cast(pl.Int64), "total_amount",
    ).pipe(in_ms).sort(KEYS)  # fmt: skip


def in_ms(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(pl.col("window_start", "window_end").dt.cast_time_unit("ms"))


def rows_in_commit_order(out: Path) -> pl.DataFrame:
    """The appended change rows in the order they were written: version by
    version (the Delta log), each commit's files in the order it adds them."""
    frames = []
    for entry in sorted((out / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                frames.append(pl.read_parquet(out / unquote(action["add"]["path"])))
    return pl.concat(frames)


def applied(changes: pl.DataFrame) -> pl.DataFrame:
    """The table the change rows build, applied one by one by the test's oracle."""
    table: dict[tuple[object, ...], dict[str, object]] = {}
    apply_changes(table, changes, KEYS)
    return pl.DataFrame(list(table.values()), schema=changes.drop("_change_type").schema)


@pytest.mark.parametrize(
    ("mode", "backend"), [("update", "memory"), ("changelog", "memory"), ("update", "lmdb")]
)
def test_sessions_into_delta_under_sigkill_equal_one_shot_sessions(
    tmp_path: Path, mode: str, backend: str
) -> None:
    """``backend="lmdb"``: the sessions' keyed stores live in the on-disk database,
    which a kill may leave one version ahead of the commit log or behind the files."""
    chk, out = tmp_path / "chk", tmp_path / "out"
    seed = int(os.environ.get("CRASH_SEED", "2828"))
    kills = run_with_kills(command(chk, out, mode, backend), chk, tmp_path / "stderr.log",
                           random.Random(seed), kills=3, most_commits=8, most_delay_s=0.05)
    assert kills == 3
    want = one_shot_sessions()
    if mode == "changelog":
        changes = in_ms(rows_in_commit_order(out))
        kinds = set(changes["_change_type"].unique())
        # sessions extended or merged across batches: retractions really happened
        assert {"insert", "delete"} <= kinds, kinds
        got = applied(changes)
    else:
        got = in_ms(pl.read_delta(str(out)))
    dupes = got.height - got.select(KEYS).unique().height
    assert dupes == 0, f"{dupes} session rows twice"
    stale = got.join(want, on=KEYS, how="anti")
    assert stale.height == 0, f"{stale.height} stale sessions, e.g. {stale.head(3)}"
    assert_frame_equal(got.select(want.columns).sort(KEYS), want)
    if backend == "lmdb":
        assert list((chk / "state").rglob("lmdb/data.mdb")), "the state was not on disk"
