"""``microbatch replay`` as a real subprocess, on a windowed job over files whose
late row is late or not depending on where the batches were cut.

One live run (one file per batch) and its replay are shared by every test (a
module fixture):

- a replay with another batch cap writes exactly the live run's table (the
  comparison of ``microbatch diff``, frame equality) and the same offsets
  entries, while a backfill with that cap
  writes another one (the late row counts there): why replay exists;
- ``--batches 2..3`` writes batch 2's windows, counted from the rows of the
  warm-up batches 0 and 1 (whose sink writes are skipped);
- after the replay, ``run`` on the replay's checkpoint continues live beside
  the old job, and both end with the same table;
- the refusals: other sources, an existing non-replay checkpoint, the old
  checkpoint itself, a batch the old run never committed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from rich.console import Console

import microbatch as mb
from microbatch.checkpoint import Checkpoint
from microbatch.cli.jobfile import build_writer
from microbatch.exceptions import ReplayError
from microbatch.observability.status import status_document
from microbatch.observability.status_view import render_status
from microbatch.tools.diff import diff_frames
from tests.input_files import write_parquet_files
from tests.oracles import cut_into_batches

pytestmark = [pytest.mark.delta]

CLI = [sys.executable, "-m", "microbatch.cli"]
REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 1, 1, tzinfo=UTC)
DELAY_MS, MINUTE_MS = 10_000, 60_000
SCHEMA = {"card": pl.Int64, "ts": pl.Datetime("ms", "UTC"), "amount": pl.Int64}

JOB = '''
from dataclasses import dataclass

import polars as pl
import microbatch as mb

@dataclass(frozen=True)
class Params:
    input: str
    output: str
    cap: int = 1

def build(params: Params):
    schema = {"card": pl.Int64, "ts": pl.Datetime("ms", "UTC"), "amount": pl.Int64}
    return (mb.read_files(params.input, format="parquet", schema=schema,
                          max_files_per_batch=params.cap)
            .with_watermark("ts", "10s")
            .group_by(mb.window("ts", "1m"), "card")
            .agg(pl.len().alias("n"), pl.col("amount").sum().alias("total"))
            .write_delta(params.output))
'''

FILES = [  # (card, seconds after T0) per file, in arrival order
    [(1, 0), (1, 20), (2, 5)],
    [(1, 130)],  # the watermark passes 120: the minute [0, 60) closes
    [(1, 40), (2, 135)],  # (1, 40) is late after file 1 in an earlier batch, not with it
]
MORE = [[(3, 300), (1, 150)]]  # arrives after the replay: closes [120, 180)


def frames(files: list[list[tuple[int, int]]], first: int = 0) -> list[pl.DataFrame]:
    return [
        pl.DataFrame(
            {"card": [c for c, _ in f], "ts": [T0 + timedelta(seconds=s) for _, s in f],
             "amount": [100 * (first + i) + j for j, _ in enumerate(f)]},
            schema=SCHEMA,
        )
        for i, f in enumerate(files)
    ]


def oracle(files: list[pl.DataFrame], cuts: list[int]) -> pl.DataFrame:
    """The append output of a run whose batches are the files cut before each
    index of ``cuts`` (a one-shot computation)."""
    batch_of = [sum(i >= c for c in cuts) for i in range(len(files))]
    rows = pl.concat([f.with_columns(pl.lit(b).alias("batch"))
                      for f, b in zip(files, batch_of, strict=True)])
    found = cut_into_batches(
        rows, batch=pl.col("batch"), time="ts", keys=["card"], size_ms=MINUTE_MS,
        delay_ms=DELAY_MS,
        aggs=[pl.len().cast(pl.UInt32).alias("n"), pl.col("amount").sum().alias("total")])
    return found.select("ws", "we", "card", "n", "total").sort("ws", "card")


def table(path: Path) -> pl.DataFrame:
    return pl.read_delta(str(path)).select(
        pl.col("window_start").dt.epoch("ms").alias("ws"),
        pl.col("window_end").dt.epoch("ms").alias("we"), "card", "n", "total",
    ).sort("ws", "card")


def cli(cwd: Path, *args: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROBATCH_FAULT")}
    env["PYTHONPATH"] = str(REPO)
    if fault:
        env["MICROBATCH_FAULT"] = fault
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=180, env=env, check=False)


@dataclass
class Setup:
    root: Path
    job: Path
    inputs: list[pl.DataFrame]

    def params(self, output: str, cap: int, source: str = "in") -> list[str]:
        return ["--param", f"input={self.root / source}", "--param",
                f"output={self.root / output}", "--param", f"cap={cap}"]

    def writer(self, output: str, cap: int, source: str = "in") -> mb.DataStreamWriter:
        """The job built in this process (as the CLI builds it)."""
        return build_writer(self.job, {"input": str(self.root / source),
                                       "output": str(self.root / output), "cap": str(cap)})

    def replay(self, new: str, output: str, *extra: str, cap: int = 3,
               source: str = "in", fault: str | None = None,
               ) -> subprocess.CompletedProcess[str]:
        return cli(self.root, "replay", str(self.job), "--from", str(self.root / "live-chk"),
                   "--checkpoint", str(self.root / new),
                   *self.params(output, cap, source), *extra, fault=fault)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    """The live run (one file per batch, cap 1), then its replay with cap 3 (the
    replay under SIGKILLs: tests/jobs/test_fraud_alerts_replay.py)."""
    root = tmp_path_factory.mktemp("replay")
    job = root / "job.py"
    job.write_text(JOB)
    inputs = frames(FILES)
    write_parquet_files(root / "in", inputs)
    setup = Setup(root, job, inputs)
    done = cli(root, "run", str(job), "--checkpoint", str(root / "live-chk"),
               "--trigger", "available-now", *setup.params("live", 1))
    assert done.returncode == 0, done.stderr
    replayed = setup.replay("replay-chk", "replay")
    assert replayed.returncode == 0, replayed.stderr
    assert "replay batch 3/3" in replayed.stderr
    return setup


def run_available_now(writer: mb.DataStreamWriter, chk: Path) -> None:
    query = writer.start(chk, trigger="available-now")
    assert query.await_termination(60)


def test_a_replay_with_another_cap_writes_the_live_table_and_a_backfill_does_not(
    live: Setup,
) -> None:
    run_available_now(live.writer("backfill", 3), live.root / "backfill-chk")

    assert_frame_equal(table(live.root / "live"), oracle(live.inputs, cuts=[1, 2, 3]),
                       check_dtypes=False)
    assert_frame_equal(table(live.root / "replay"), table(live.root / "live"))
    assert diff_frames(table(live.root / "live"), table(live.root / "replay"),
                       keys=["ws", "card"], rel_tolerance=0).equal  # `microbatch diff`'s
    # a backfill cuts one batch of three files: the row at 40 s is not late there
    assert_frame_equal(table(live.root / "backfill"), oracle(live.inputs, cuts=[3]),
                       check_dtypes=False)
    assert not diff_frames(table(live.root / "live"), table(live.root / "backfill"),
                           keys=["ws", "card"]).equal
    # the replay's checkpoint records what it replays, with the same batch ids
    meta = (live.root / "replay-chk" / "metadata").read_text()
    assert '"replay_of":{"batches":[0,3]' in meta
    assert str(live.root / "live-chk") in meta
    assert sorted(os.listdir(live.root / "replay-chk" / "commits")) == ["0", "1", "2", "3"]
    shown = status_document(live.root / "replay-chk")
    assert shown["replay_of"]["checkpoint"] == str(live.root / "live-chk")
    view = Console(width=400, record=True)
    view.print(render_status(shown))
    shown_text = " ".join(view.export_text().split())
    assert f"replay of {live.root / 'live-chk'} batches 0..3" in shown_text
    old, new = (Checkpoint(live.root / c) for c in ("live-chk", "replay-chk"))
    for n in range(4):
        was, now = old.offsets.get(n), new.offsets.get(n)
        assert was is not None
        assert now is not None
        assert (now.sources, now.watermark_ms, now.timestamp_ms) == (
            was.sources, was.watermark_ms, was.timestamp_ms)


def test_after_a_replay_run_on_its_checkpoint_continues_live_like_the_old_job(
    live: Setup,
) -> None:
    more = frames(MORE, first=len(FILES))
    write_parquet_files(live.root / "more", more)
    moved = live.root / "more" / "part-00000.parquet"
    stamp = moved.stat().st_mtime_ns
    target = live.root / "in" / "part-00003.parquet"
    moved.rename(target)
    os.utime(target, ns=(stamp + 10**9, stamp + 10**9))

    run_available_now(live.writer("live", 1), live.root / "live-chk")
    new = cli(live.root, "run", str(live.job), "--checkpoint", str(live.root / "replay-chk"),
              "--trigger", "available-now", *live.params("replay", 1))

    assert new.returncode == 0, new.stderr
    want = oracle([*live.inputs, *more], cuts=[1, 2, 3, 4])
    assert_frame_equal(table(live.root / "live"), want, check_dtypes=False)
    assert_frame_equal(table(live.root / "replay"), table(live.root / "live"))
    assert table(live.root / "replay").height > oracle(live.inputs, cuts=[1, 2, 3]).height


def test_batches_a_to_b_warm_the_state_up_on_the_batches_before_a(live: Setup) -> None:
    part = live.replay("part-chk", "part", "--batches", "2..3")

    assert part.returncode == 0, part.stderr
    lines = part.stderr.splitlines()
    warm = [line for line in lines if "[warm-up: state only, sink skipped]" in line]
    assert [line.split(":")[0] for line in warm] == ["replay batch 0/3", "replay batch 1/3"]
    assert any("batches 0..1 warm the state up first" in line for line in lines)
    # batch 2 emits the minute the watermark closed, counted from batch 0's rows
    assert_frame_equal(table(live.root / "part"), oracle(live.inputs, cuts=[1, 2, 3]),
                       check_dtypes=False)
    assert sorted(os.listdir(live.root / "part-chk" / "commits")) == ["0", "1", "2", "3"]


def test_a_refusal_at_the_cli_is_one_paragraph_with_exit_2(live: Setup) -> None:
    (live.root / "other").mkdir(exist_ok=True)

    refused = live.replay("mismatch-chk", "refused", source="other")

    assert refused.returncode == 2, refused.stdout + refused.stderr
    text = " ".join(refused.stderr.split())
    assert text.startswith("error:")
    assert "Traceback" not in text
    assert "other sources" in text
    assert "source 0" in text
    assert "--param" in text
    assert not (live.root / "refused").exists()
    assert not (live.root / "mismatch-chk").exists()


@pytest.mark.parametrize(("new", "batches", "source", "words"), [
    ("mismatch-chk", None, "other", ["other sources", "source 0", "--param"]),
    ("live-chk", None, "in", ["is the checkpoint to replay"]),
    ("backfill-chk", None, "in", ["not a replay", "new directory"]),
    ("replay-chk", "1..2", "in", ["holds a replay of", "batches 0..3", "same --from"]),
    ("past-chk", "1..99", "in", ["no committed batch 99", "--batches 1.."]),
    ("bad-chk", "3..1", "in", ["at most the last"]),
    ("bad-chk", "1-3", "in", ["A..B"]),
])
def test_what_cannot_be_replayed_exactly_is_refused(
    live: Setup, new: str, batches: str | None, source: str, words: list[str],
) -> None:
    (live.root / "other").mkdir(exist_ok=True)
    if new == "backfill-chk" and not (live.root / new).exists():
        run_available_now(live.writer("backfill", 3), live.root / "backfill-chk")
    before = sorted(os.listdir(live.root))

    with pytest.raises(ReplayError) as refused:
        live.writer("refused", 3, source).replay(live.root / "live-chk", live.root / new,
                                                 batches=batches)

    text = " ".join(str(refused.value).split())
    for word in words:
        assert word in text
    assert sorted(os.listdir(live.root)) == before  # nothing created
