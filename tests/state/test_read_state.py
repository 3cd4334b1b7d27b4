"""``mb.read_state`` and ``microbatch state``: an operator's state at a committed
batch, read offline, against one-shot Polars oracles."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

import microbatch as mb
from microbatch.checkpoint import Checkpoint
from microbatch.cli.app import app
from microbatch.testing import JoinStreamTest, StreamTest

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MIN = 60_000
SCHEMA = {"k": pl.Int64, "ts": pl.Datetime("ms", "UTC"), "v": pl.Float64}
BATCHES = [
    {"k": [1, 2, 1, 3], "ts": [T0, T0 + timedelta(seconds=10), T0 + timedelta(seconds=70),
                               T0 + timedelta(seconds=100)], "v": [1.0, 2.0, 3.0, 4.0]},
    {"k": [1, 2, 2], "ts": [T0 + timedelta(seconds=80), T0 + timedelta(seconds=150),
                            T0 + timedelta(seconds=170)], "v": [5.0, 6.0, 7.0]},
    {"k": [3], "ts": [T0 + timedelta(seconds=200)], "v": [8.0]},
]


def windowed(s: mb.Stream) -> mb.Stream:
    return s.with_watermark("ts", delay="30s").group_by(mb.window("ts", "1m"), "k").agg(
        pl.len().alias("n"), pl.col("v").sum().alias("total"))


def beats(inp: mb.StateInput) -> mb.StateOutput:
    """Per key: rows seen so far, and an event timer 5 min after its newest row."""
    latest = inp.rows.group_by("k", maintain_order=True).agg(
        pl.len().alias("new"), pl.col("ts").max().dt.epoch("ms").alias("last"))
    state = (latest.join(inp.state, on="k", how="left")
             .select("k", (pl.col("new") + pl.col("n").fill_null(0)).alias("n")))
    return mb.StateOutput(rows=state, upserts=state, timers=latest.select(
        "k", (pl.col("last") + 5 * MIN).alias("timer_ms"), pl.lit("event").alias("timer_kind")))


def _run(build, checkpoint: Path, **kw: object) -> None:
    t = StreamTest(build, schema=SCHEMA, checkpoint=checkpoint, **kw)  # type: ignore[arg-type]
    for rows in BATCHES:
        t.add(rows).process()
    t.close()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One run of each job, shared by the tests of this module."""
    base = tmp_path_factory.mktemp("state")
    out = {"window": base / "window", "transform": base / "transform", "two": base / "two"}
    _run(windowed, out["window"])
    _run(lambda s: s.with_watermark("ts", delay="0s").group_by("k").transform_with_state(
        beats, state_schema={"n": pl.Int64}), out["transform"])
    _run(lambda s: s.with_watermark("ts", delay="30s").drop_duplicates("k", within="10m")
         .group_by("k").agg(pl.len().alias("n")), out["two"], output_mode="update")
    out["join"] = base / "join"
    join = JoinStreamTest(lambda left, right: left.with_watermark("ts", "0s").join_interval(
        right.with_watermark("ts", "0s"), on="k", left_time="ts", lower="0s", upper="1m",
        how="left"), left_schema=SCHEMA, right_schema=SCHEMA, checkpoint=out["join"])
    join.add_left(BATCHES[0]).add_right(BATCHES[1]).process()
    join.close()
    return out


def _rows(upto: int) -> pl.DataFrame:
    return pl.concat([pl.DataFrame(b, schema=SCHEMA) for b in BATCHES[:upto]])


def _batch_rows(chk: Path, batch: int) -> pl.DataFrame:
    """The input rows of batches 0..batch (each StreamTest batch is one added frame,
    no-data batches between them read nothing)."""
    log = Checkpoint(chk).offsets
    spans = [next(iter(log.get(b).sources.values())) for b in range(batch + 1)]  # type: ignore[union-attr]
    return _rows(sum(1 for start, end in spans if start != end))


def test_window_partials_equal_a_one_shot_group_by_of_the_open_windows(checkpoints):
    chk = checkpoints["window"]
    log = Checkpoint(chk)
    for batch in (log.commits.batch_ids()[0], log.commits.batch_ids()[-1]):
        state = mb.read_state(chk, batch=batch)
        wm = log.offsets.get(batch).watermark_ms  # type: ignore[union-attr]
        rows = _batch_rows(chk, batch).with_columns(
            pl.col("ts").dt.truncate("1m").alias("window_start"))
        if wm is not None:  # windows the watermark in force closed were emitted, then dropped
            rows = rows.filter((pl.col("window_start").dt.epoch("ms") + MIN) > wm)
        want = rows.group_by("window_start", "k").agg(
            pl.len().cast(pl.Int64).alias("n"), pl.col("v").sum().alias("total"))
        got = state.group_by("window_start", "k").agg(pl.col("n").sum(), pl.col("total").sum())
        assert got.sort("window_start", "k").equals(want.sort("window_start", "k")), batch
        assert (state["window_end"] - state["window_start"]).eq(timedelta(minutes=1)).all()
        assert not [c for c in state.columns if c.startswith("__")]


def test_transform_state_and_timers_equal_the_one_shot_counts(checkpoints):
    chk = checkpoints["transform"]
    state = mb.read_state(chk)
    assert set(state["store"]) == {"state", "event_timers"}
    rows = _rows(len(BATCHES))
    counts = rows.group_by("k").agg(pl.len().cast(pl.Int64).alias("n"))
    got = state.filter(pl.col("store") == "state").select("k", "n")
    assert got.sort("k").equals(counts.sort("k"))
    # each batch registered, per key, a timer 5 min after the key's newest row of
    # that batch; none fired (the watermark never reached them)
    timers = state.filter(pl.col("store") == "event_timers").select("k", "timer_ms", "fire_at")
    want = pl.concat([
        pl.DataFrame(b, schema=SCHEMA).group_by("k").agg(
            (pl.col("ts").max().dt.epoch("ms") + 5 * MIN).alias("timer_ms"))
        for b in BATCHES]).unique()
    assert timers.select("k", "timer_ms").sort("k", "timer_ms").equals(
        want.sort("k", "timer_ms"))
    assert timers["fire_at"].dt.epoch("ms").equals(timers["timer_ms"], check_names=False)


def test_a_join_keeps_every_row_of_the_first_batch_waiting_with_its_match_flag(checkpoints):
    state = mb.read_state(checkpoints["join"], batch=0)  # no watermark yet: nothing expired
    left, right = (pl.DataFrame(b, schema=SCHEMA) for b in BATCHES[:2])
    pairs = left.join(right, on="k", suffix="_r").filter(
        (pl.col("ts_r") >= pl.col("ts")) & (pl.col("ts_r") <= pl.col("ts") + timedelta(minutes=1)))
    want = left.with_columns(pl.struct("k", "ts").is_in(pairs.select(pl.struct("k", "ts"))
                                                      .to_series().implode()).alias("matched"))
    got = state.filter(pl.col("store") == "left/rows").select("k", "ts", "v", "matched")
    assert got.sort("k", "ts").equals(want.sort("k", "ts"))
    waiting = state.filter(pl.col("store") == "right/rows").select("k", "ts", "v")
    assert waiting.sort("k", "ts").equals(right.sort("k", "ts"))


def test_several_operators_need_a_choice_and_dedupe_keys_are_the_distinct_keys(checkpoints):
    chk = checkpoints["two"]
    with pytest.raises(mb.StateReadError, match=r"2 stateful operators \(agg-0 .*dedupe-1"):
        mb.read_state(chk)
    keys = mb.read_state(chk, operator="dedupe-1")
    assert sorted(keys["k"]) == sorted(_rows(len(BATCHES))["k"].unique())
    assert keys.schema["expire_at"] == pl.Datetime("ms", "UTC")


def test_refusals_name_what_can_be_read(checkpoints, tmp_path):
    chk = checkpoints["window"]
    last = Checkpoint(chk).commits.batch_ids()[-1]
    refusal = rf"batch {last + 1} .* is not committed.*0\.\.{last}"
    with pytest.raises(mb.StateReadError, match=refusal):
        mb.read_state(chk, batch=last + 1)
    with pytest.raises(mb.StateReadError, match=r"no state for operator 'agg-7'.*agg-0"):
        mb.read_state(chk, operator="agg-7")
    with pytest.raises(mb.StateReadError, match="not a microbatch checkpoint"):
        mb.read_state(tmp_path)


def test_cli_prints_the_operators_and_the_state(checkpoints, capsys):
    chk = str(checkpoints["transform"])

    def cli(*args: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as done:
            app([*args], prog_name="microbatch")
        got = capsys.readouterr()
        return int(done.value.code or 0), got.out, got.err

    code, out, err = cli("state", chk, "--format", "csv")
    assert code == 0, err
    assert pl.read_csv(out.encode()).height == mb.read_state(chk).height
    code, out, _ = cli("state", chk)
    assert "transform_with_state" in out
    assert "event_timers" in out
    code, _, err = cli("state", chk, "--batch", "99")
    assert code == 2
    assert "batch 99" in err
    assert "Traceback" not in err
