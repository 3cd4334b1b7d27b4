"""``DataStreamWriter.replay`` in process, over hypothesis' random batch cuts: the
replayed batches are the recorded ones whatever the replay's own cap, a range
``A..B`` writes exactly those batches (the earlier ones only warm the state
up), changed code writes exactly the change's effect, and a purged offsets log
is refused naming ``retention``."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import microbatch as mb
from microbatch.checkpoint import Checkpoint
from microbatch.exceptions import ReplayError
from tests.oracles import cut_into_batches

DELAY_MS, MINUTE_MS = 5_000, 60_000
SCHEMA = {"card": pl.Int64, "ts": pl.Datetime("ms", "UTC"), "amount": pl.Int64}


def alerts(rows: pl.DataFrame, cap: int | None, *, min_n: int | None = None) -> mb.Stream:
    """Counts per card and minute; ``min_n``: the changed code keeps only n >= min_n."""
    stream = (mb.read_memory(rows, schema=SCHEMA, max_records_per_batch=cap)
              .with_watermark("ts", "5s")
              .group_by(mb.window("ts", "1m"), "card")
              .agg(pl.len().alias("n"), pl.col("amount").sum().alias("total")))
    return stream if min_n is None else stream.filter(pl.col("n") >= min_n)


def collect(stream: mb.Stream) -> tuple[dict[int, pl.DataFrame], mb.DataStreamWriter]:
    got: dict[int, pl.DataFrame] = {}

    def keep(df: pl.DataFrame, batch_id: int) -> None:
        if df.height:
            got[batch_id] = df.sort("window_start", "card")

    return got, stream.foreach_batch(keep)


def oracle(rows: pl.DataFrame, cap: int) -> pl.DataFrame:
    """What a run cut every ``cap`` rows emits in all (a one-shot computation)."""
    found = cut_into_batches(
        rows, batch=pl.int_range(pl.len()) // cap, time="ts", keys=["card"],
        size_ms=MINUTE_MS, delay_ms=DELAY_MS,
        aggs=[pl.len().cast(pl.UInt32).alias("n"), pl.col("amount").sum().alias("total")])
    return found.select("ws", "card", "n", "total").sort("ws", "card")


def flat(batches: dict[int, pl.DataFrame]) -> pl.DataFrame:
    frames = list(batches.values())
    if not frames:
        return pl.DataFrame(schema={"ws": pl.Int64, "card": pl.Int64, "n": pl.UInt32,
                                    "total": pl.Int64})
    return pl.concat(frames).select(
        pl.col("window_start").dt.epoch("ms").alias("ws"), "card", "n", "total",
    ).sort("ws", "card")


events = st.lists(
    st.tuples(st.integers(1, 3), st.integers(0, 400)), min_size=4, max_size=30,
).map(lambda xs: pl.DataFrame(
    {"card": [c for c, _ in xs], "ts": [s * 1000 for _, s in xs],
     "amount": list(range(len(xs)))},
).with_columns(pl.col("ts").cast(pl.Datetime("ms", "UTC"))))


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=events, cap=st.integers(1, 6), replay_cap=st.none() | st.integers(1, 9),
       data=st.data())
def test_a_replay_writes_the_recorded_batches_and_new_code_only_its_change(
    tmp_path_factory: pytest.TempPathFactory, rows: pl.DataFrame, cap: int,
    replay_cap: int | None, data: st.DataObject,
) -> None:
    root = tmp_path_factory.mktemp("replay")
    live, writer = collect(alerts(rows, cap))
    assert writer.start(root / "old", trigger="available-now").await_termination(30)
    last = Checkpoint(root / "old").commits.batch_ids()[-1]
    first = data.draw(st.integers(0, last), label="first")
    end = data.draw(st.integers(first, last), label="last")

    same, same_writer = collect(alerts(rows, replay_cap))
    assert same_writer.replay(root / "old", root / "same").await_termination(30)
    part, part_writer = collect(alerts(rows, replay_cap))
    assert part_writer.replay(root / "old", root / "part",
                              batches=f"{first}..{end}").await_termination(30)
    changed, changed_writer = collect(alerts(rows, replay_cap, min_n=2))
    assert changed_writer.replay(root / "old", root / "changed").await_termination(30)

    assert flat(live).equals(oracle(rows, cap))
    assert same.keys() == live.keys()
    assert all(same[b].equals(live[b]) for b in live)
    assert part.keys() == {b for b in live if first <= b <= end}
    assert all(part[b].equals(live[b]) for b in part)
    assert Checkpoint(root / "part").commits.batch_ids()[-1] == end  # warm-up committed too
    effect = {b: df.filter(pl.col("n") >= 2) for b, df in live.items()}
    assert changed.keys() == {b for b, df in effect.items() if df.height}
    assert all(changed[b].equals(effect[b]) for b in changed)


def test_a_purged_batch_0_is_refused_naming_retention(tmp_path: Path) -> None:
    rows = pl.DataFrame({"card": [1] * 6, "ts": [i * 20_000 for i in range(6)],
                         "amount": list(range(6))}).with_columns(
        pl.col("ts").cast(pl.Datetime("ms", "UTC")))
    _, writer = collect(alerts(rows, 1))
    assert writer.start(tmp_path / "old", trigger="available-now",
                        retention=2).await_termination(30)

    with pytest.raises(ReplayError, match=r"no longer holds batch 0.*`retention`"):
        collect(alerts(rows, 1))[1].replay(tmp_path / "old", tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_an_interrupted_replay_is_resumed_by_replay_and_refused_by_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = pl.DataFrame({"card": [1, 2, 1, 2, 1, 1], "ts": [0, 5, 70, 75, 150, 20],
                         "amount": list(range(6))}).with_columns(
        (pl.col("ts") * 1000).cast(pl.Datetime("ms", "UTC")))
    live, writer = collect(alerts(rows, 1))
    assert writer.start(tmp_path / "old", trigger="available-now").await_termination(30)
    got, again = collect(alerts(rows, None))
    monkeypatch.setenv("MICROBATCH_FAULT", "after_commit@2")
    monkeypatch.setenv("MICROBATCH_FAULT_ACTION", "raise")
    with pytest.raises(mb.QueryTerminatedError):
        again.replay(tmp_path / "old", tmp_path / "new").await_termination(30)
    monkeypatch.delenv("MICROBATCH_FAULT")

    with pytest.raises(ReplayError, match=r"stopped before batch 3 .*Finish it first"):
        again.start(tmp_path / "new", trigger="available-now")
    assert again.replay(tmp_path / "old", tmp_path / "new").await_termination(30)
    assert again.start(tmp_path / "new", trigger="available-now").await_termination(30)

    assert got.keys() == live.keys()
    assert all(got[b].equals(live[b]) for b in live)


def test_the_flush_batch_is_replayed_as_recorded_and_no_other_is_added(tmp_path: Path) -> None:
    rows = pl.DataFrame({"card": [1, 2, 1, 1], "ts": [0, 5, 70, 20],
                         "amount": list(range(4))}).with_columns(
        (pl.col("ts") * 1000).cast(pl.Datetime("ms", "UTC")))
    live, writer = collect(alerts(rows, 1))
    assert writer.start(tmp_path / "old", trigger="available-now",
                        flush_at_end=True).await_termination(30)
    got, again = collect(alerts(rows, None))

    assert again.replay(tmp_path / "old", tmp_path / "new").await_termination(30)

    last = Checkpoint(tmp_path / "old").commits.batch_ids()[-1]
    assert max(live) == last  # the flush batch emitted the minute [60, 120)
    assert got.keys() == live.keys()
    assert all(got[b].equals(live[b]) for b in live)
    assert Checkpoint(tmp_path / "new").commits.batch_ids()[-1] == last
