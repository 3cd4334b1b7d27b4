"""``start(..., flush_at_end=True)``: the windows still open at the end of a bounded
run are emitted by one more batch, exactly once, and stay closed afterwards.

Also the note of a bounded run that finds nothing new (``status["caught_up"]`` and a
WARNING on the ``microbatch`` logger).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

import microbatch as mb
from microbatch.checkpoint import Checkpoint
from microbatch.engine.faults import InjectedFault
from sinks import MemorySink
from tests.oracles import sessions, tumbling_or_hopping

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SCHEMA = {"card": pl.Int64, "ts": pl.Datetime("ms", "UTC"), "amount": pl.Int64}


def events(seconds: list[int], cards: list[int] | None = None) -> pl.DataFrame:
    """Rows at ``T0 + seconds``, in the order given, amounts 1, 2, 3..."""
    return pl.DataFrame(
        {
            "card": cards if cards is not None else [s % 3 for s in seconds],
            "ts": [T0 + timedelta(seconds=s) for s in seconds],
            "amount": list(range(1, len(seconds) + 1)),
        },
        schema=SCHEMA,
    )


def as_ms(df: pl.DataFrame) -> pl.DataFrame:
    """Streaming output with windows as epoch ms, sorted, for comparing with an oracle."""
    return df.select(
        pl.col("window_start").dt.epoch("ms").alias("ws"),
        pl.col("window_end").dt.epoch("ms").alias("we"),
        "card", "n", "total",
    ).sort("ws", "we", "card")


AGGS = [pl.len().cast(pl.Int64).alias("n"), pl.col("amount").sum().alias("total")]


def window_oracle(rows: pl.DataFrame, size_ms: int, slide_ms: int) -> pl.DataFrame:
    found = tumbling_or_hopping(rows, time="ts", keys=["card"], size_ms=size_ms,
                                slide_ms=slide_ms, aggs=AGGS)
    return found.select("ws", "we", "card", "n", "total").sort("ws", "we", "card")


def session_oracle(rows: pl.DataFrame, gap_ms: int) -> pl.DataFrame:
    found = sessions(rows, time="ts", keys=["card"], gap_ms=gap_ms, aggs=AGGS)
    return found.select("ws", "we", "card", "n", "total").sort("ws", "we", "card")


def windowed(stream: mb.Stream, kind: str, delay: str = "30s") -> mb.Stream:
    marked = stream.with_watermark("ts", delay)
    group = {
        "tumbling": mb.window("ts", "1m"),
        "hopping": mb.window("ts", "2m", slide="1m"),
        "session": mb.session_window("ts", gap="45s"),
    }[kind]
    return marked.group_by(group, "card").agg(pl.len().alias("n"),
                                              pl.col("amount").sum().alias("total"))


def oracle(kind: str, rows: pl.DataFrame) -> pl.DataFrame:
    if kind == "tumbling":
        return window_oracle(rows, 60_000, 60_000)
    if kind == "hopping":
        return window_oracle(rows, 120_000, 60_000)
    return session_oracle(rows, 45_000)


# ------------------------------------------------------------------ the oracle


@pytest.mark.parametrize("kind", ["tumbling", "hopping", "session"])
def test_without_flush_open_windows_stay_open_and_with_flush_all_are_emitted(
    kind: str, tmp_path: Path, table_name: str
) -> None:
    rows = events([0, 10, 50, 70, 130, 200, 205, 290])
    plain = windowed(mb.read_memory(rows, max_records_per_batch=3), kind)
    q = plain.write_memory(f"{table_name}_plain").start(tmp_path / "a", "available-now")
    q.await_termination()
    flushed = windowed(mb.read_memory(rows, max_records_per_batch=3), kind)
    f = flushed.write_memory(table_name).start(tmp_path / "b", "available-now",
                                              flush_at_end=True)
    f.await_termination()

    expected = oracle(kind, rows)
    assert mb.table(f"{table_name}_plain").height < expected.height  # windows left open
    assert_frame_equal(as_ms(mb.table(table_name)), expected)
    last = f.last_progress
    assert last is not None
    assert last["input_rows"] == 0
    assert last["output_rows"] > 0
    assert last["late_rows"] == 0


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    gaps=st.lists(st.integers(0, 90), min_size=1, max_size=40),
    cap=st.integers(1, 12),
    kind=st.sampled_from(["tumbling", "hopping", "session"]),
)
def test_flushed_output_equals_the_one_shot_result_for_any_batch_split(
    gaps: list[int], cap: int, kind: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    seconds = [sum(gaps[: i + 1]) for i in range(len(gaps))]  # in event-time order: none late
    rows = events(seconds)
    name = f"flush_split_{tmp_path_factory.mktemp('n').name}"
    stream = windowed(mb.read_memory(rows, max_records_per_batch=cap), kind)
    q = stream.write_memory(name).start(tmp_path_factory.mktemp("chk"), "available-now",
                                        flush_at_end=True)
    q.await_termination()
    assert_frame_equal(as_ms(mb.table(name)), oracle(kind, rows))


def test_flush_with_fire_once_emits_only_windows_whose_rule_held_and_evicts_the_rest(
    tmp_path: Path, table_name: str
) -> None:
    rows = events([0, 1, 2, 61, 62, 130], cards=[1, 1, 1, 2, 2, 1])
    stream = (mb.read_memory(rows).with_watermark("ts", "1h")
              .group_by(mb.window("ts", "1m"), "card")
              .agg(pl.len().alias("n"), pl.col("amount").sum().alias("total"))
              .fire_once(pl.col("n") >= 3))
    q = stream.write_memory(table_name).start(tmp_path / "chk", "available-now",
                                              flush_at_end=True)
    q.await_termination()
    assert mb.table(table_name).select("card", "n").rows() == [(1, 3)]
    last = q.last_progress
    assert last is not None
    assert last["input_rows"] == 0
    assert last["state_rows"] == 0  # ...and the fired keys' state is gone


# ------------------------------------------------------------------ restarts


def test_rows_for_flushed_windows_arriving_later_are_late_but_newer_windows_still_work(
    tmp_path: Path, table_name: str
) -> None:
    src = mb.read_memory(schema=SCHEMA)
    src.add(events([0, 10, 70]))
    stream = windowed(src, "tumbling").on_late(MemorySink(f"{table_name}_late"))
    chk = tmp_path / "chk"
    stream.write_memory(table_name).start(chk, "available-now",
                                          flush_at_end=True).await_termination()
    assert mb.table(table_name).select("card", "n").rows() == [(0, 1), (1, 1), (1, 1)]

    src.add(events([20, 75, 600], cards=[5, 6, 7]))  # two rows for flushed windows, one new
    again = stream.write_memory(table_name).start(chk, "available-now", flush_at_end=True)
    again.await_termination()

    late = mb.table(f"{table_name}_late")
    assert sorted(late["card"].to_list()) == [5, 6]
    assert all("closed by watermark" in r for r in late["late_reason"].to_list())
    assert sum(p["late_rows"] for p in again.recent_progress
               if p["run_id"] == again.run_id) == 2
    out = mb.table(table_name)
    assert out.filter(pl.col("card") == 7).select("n").rows() == [(1,)]  # a newer window
    assert out.filter(pl.col("card").is_in([5, 6])).height == 0


@pytest.mark.parametrize("point", ["after_write_ahead", "sink.after_data", "after_state_commit"])
def test_a_crash_in_the_flush_batch_replays_it_exactly_once(
    point: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = events([0, 10, 50, 70, 130, 200, 205, 290])
    files = tmp_path / "in"
    files.mkdir()
    for i, part in enumerate(rows.iter_slices(3)):  # files, a durable source: replayable
        part.write_parquet(files / f"part-{i}.parquet")
    source = mb.read_files(files, format="parquet", schema=SCHEMA, max_files_per_batch=1)
    stream = windowed(source, "hopping")
    out, chk = tmp_path / "out", tmp_path / "chk"
    writer = stream.write_parquet(out)
    # rehearse on another checkpoint to learn the flush batch's id
    probe = stream.write_memory("flush_crash_probe").start(tmp_path / "probe", "available-now",
                                                          flush_at_end=True)
    probe.await_termination()
    assert probe.last_progress is not None
    flush_id = probe.last_progress["batch_id"]

    monkeypatch.setenv("MICROBATCH_FAULT", f"{point}@{flush_id}")
    monkeypatch.setenv("MICROBATCH_FAULT_ACTION", "raise")
    crashed = writer.start(chk, "available-now", flush_at_end=True)
    with pytest.raises(mb.QueryTerminatedError) as info:
        crashed.await_termination()
    assert isinstance(info.value.__cause__, InjectedFault)
    monkeypatch.delenv("MICROBATCH_FAULT")

    # restarted WITHOUT flush_at_end: the flush batch is in the write-ahead log, so it is
    # re-run as recorded (or, committed already, not again)
    restarted = writer.start(chk, "available-now")
    restarted.await_termination()
    assert_frame_equal(as_ms(mb.parquet_table(out)), oracle("hopping", rows))
    assert restarted.status["next_batch_id"] == flush_id + 1
    # the flushed watermark is what the checkpoint keeps, as in the uncrashed run
    committed = Checkpoint(chk).commits.latest()
    assert committed is not None
    assert committed.next_watermark_ms == probe.last_progress["next_watermark_ms"]


def test_flush_at_end_is_refused_with_an_interval_trigger(tmp_path: Path) -> None:
    stream = windowed(mb.read_memory(events([0])), "tumbling")
    with pytest.raises(mb.TriggerError, match=r"flush_at_end=True .*bounded trigger.*'10s'"):
        stream.write_memory("flush_refused").start(tmp_path / "chk", "10s", flush_at_end=True)
    assert not (tmp_path / "chk").exists()  # refused before anything was created


def test_flush_on_an_already_flushed_caught_up_checkpoint_runs_no_batch(
    tmp_path: Path, table_name: str
) -> None:
    stream = windowed(mb.read_memory(events([0, 70])), "tumbling")
    writer = stream.write_memory(table_name)
    writer.start(tmp_path / "chk", "available-now", flush_at_end=True).await_termination()
    n = mb.table(table_name).height
    again = writer.start(tmp_path / "chk", "available-now", flush_at_end=True)
    again.await_termination()
    assert again.status["caught_up"] is True
    assert mb.table(table_name).height == n == 2


# ------------------------------------------------------------------ caught up


def test_a_caught_up_rerun_says_so_on_the_microbatch_logger_and_in_status(
    tmp_path: Path, table_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    writer = windowed(mb.read_memory(events([0, 70, 200])), "tumbling").write_memory(table_name)
    first = writer.start(tmp_path / "chk", "available-now")
    first.await_termination()
    assert first.status["caught_up"] is False
    assert first.status["message"] == "stopped"

    with caplog.at_level(logging.WARNING, logger="microbatch"):
        again = writer.start(tmp_path / "chk", "available-now")
        again.await_termination()

    notes = [r for r in caplog.records if r.name.startswith("microbatch")
             and r.levelno == logging.WARNING and "nothing new" in r.getMessage()]
    assert len(notes) == 1
    text = notes[0].getMessage()
    last = first.status["next_batch_id"] - 1
    assert f"nothing new since batch {last}" in text
    assert str(tmp_path / "chk") in text
    assert "new checkpoint directory" in text
    assert again.status["caught_up"] is True
    assert again.status["message"].startswith(f"stopped: nothing new since batch {last}")
