"""``start(..., pipelined=True)``: batch N's sink and commit run beside batch N+1's
read and execute, and exactly once still holds.

The oracle is a one-shot Polars computation over all rows. A crash of a
pipelined query can leave two batches uncommitted (N in flight, N+1 written
ahead); ``offsets/N+1`` records N as in flight, and the restart re-runs both.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

import microbatch as mb
from microbatch.engine import execution
from microbatch.engine.faults import InjectedFault
from microbatch.exceptions import CheckpointCorruptError
from tests.engine.test_flush_at_end import SCHEMA, as_ms, events, oracle, windowed


def _ids(directory: Path) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _in_flight(chk: Path, batch_id: int) -> list[int]:
    """What ``offsets/batch_id`` records as in flight when it was written ahead."""
    entry = json.loads((chk / "offsets" / str(batch_id)).read_text())["body"]
    return list(entry.get("in_flight", []))


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    gaps=st.lists(st.integers(0, 90), min_size=1, max_size=40),
    cap=st.integers(1, 8),
    kind=st.sampled_from(["tumbling", "session"]),
)
def test_pipelined_output_equals_the_one_shot_result_for_any_batch_split(
    gaps: list[int], cap: int, kind: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    seconds = [sum(gaps[: i + 1]) for i in range(len(gaps))]
    rows = events(seconds)
    name = f"pipelined_split_{tmp_path_factory.mktemp('n').name}"
    stream = windowed(mb.read_memory(rows, max_records_per_batch=cap), kind)
    q = stream.write_memory(name).start(tmp_path_factory.mktemp("chk"), "available-now",
                                        flush_at_end=True, pipelined=True)
    assert q.await_termination(60)
    assert q.exception is None
    assert_frame_equal(as_ms(mb.table(name)), oracle(kind, rows))
    # every batch reported once, in order, after its commit
    ids = [p["batch_id"] for p in q.recent_progress]
    assert ids == list(range(len(ids)))
    assert sum(p["input_rows"] for p in q.recent_progress) == rows.height


def _files(rows: pl.DataFrame, directory: Path, per_file: int) -> None:
    directory.mkdir()
    for i, part in enumerate(rows.iter_slices(per_file)):
        part.write_parquet(directory / f"part-{i:03d}.parquet")


ROWS = events([0, 10, 50, 70, 130, 200, 205, 290, 300, 340, 400, 460, 470, 520, 600,
               610, 700, 750])


def _writer(tmp_path: Path) -> mb.DataStreamWriter:
    source = mb.read_files(tmp_path / "in", format="parquet", schema=SCHEMA,
                           max_files_per_batch=1)
    return windowed(source, "tumbling").write_parquet(tmp_path / "out")


def _output(tmp_path: Path) -> pl.DataFrame:
    return as_ms(mb.parquet_table(tmp_path / "out"))


@pytest.mark.parametrize("restart_pipelined", [True, False])
def test_a_crash_with_two_batches_uncommitted_reruns_both_exactly_once(
    restart_pipelined: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Batch 2's sink fails on the committer thread only once batch 3 was written
    ahead and executed: the checkpoint then holds offsets 0..3 and commits 0..1,
    the one state pipelining adds. The restart (pipelined or not) re-runs 2 and 3."""
    _files(ROWS, tmp_path / "in", per_file=3)
    original = execution.fault_point
    executed_3 = threading.Event()

    def hooked(name: str, batch_id: int) -> None:
        if (name, batch_id) == ("after_execute", 3):
            executed_3.set()
        if (name, batch_id) == ("after_sink", 2):
            assert executed_3.wait(30), "batch 3 did not run while batch 2 was in flight"
            raise InjectedFault("injected fault at after_sink in batch 2")
        original(name, batch_id)

    monkeypatch.setattr(execution, "fault_point", hooked)
    chk = tmp_path / "chk"
    crashed = _writer(tmp_path).start(chk, "available-now", flush_at_end=True, pipelined=True)
    with pytest.raises(mb.QueryTerminatedError) as info:
        crashed.await_termination(60)
    assert isinstance(info.value.__cause__ or crashed.exception, InjectedFault)
    assert _ids(chk / "offsets") == [0, 1, 2, 3]
    assert _ids(chk / "commits") == [0, 1]
    assert _in_flight(chk, 3) == [2]
    assert json.loads((chk / "last_error").read_text())["body"]["batch_id"] == 2
    assert crashed.status["next_batch_id"] == 2  # where the next start resumes

    monkeypatch.setattr(execution, "fault_point", original)
    with caplog.at_level(logging.WARNING, logger="microbatch.engine.execution"):
        again = _writer(tmp_path).start(chk, "available-now", flush_at_end=True,
                                        pipelined=restart_pipelined)
        assert again.await_termination(60)
    assert again.exception is None
    assert "recovering batch 2 from its write-ahead entry" in caplog.text
    assert "recovering batch 3 from its write-ahead entry" in caplog.text
    assert_frame_equal(_output(tmp_path), oracle("tumbling", ROWS))


def test_missing_commits_are_re_run_only_where_pipelining_explains_them(
    tmp_path: Path,
) -> None:
    """The recovery rule: the last batch and the one it records in flight may lack
    their commits (re-run); any other gap is refused, changing nothing."""
    _files(ROWS, tmp_path / "in", per_file=3)
    chk = tmp_path / "chk"
    done = _writer(tmp_path).start(chk, "available-now", pipelined=True)
    assert done.await_termination(60)
    assert done.exception is None
    final_watermark = ROWS["ts"].dt.epoch("ms").max() - 30_000  # windowed(): delay 30s
    expected = oracle("tumbling", ROWS).filter(pl.col("we") <= final_watermark)
    assert_frame_equal(_output(tmp_path), expected)
    last = _ids(chk / "offsets")[-1]
    assert _in_flight(chk, last) == [last - 1]

    # the commit of the in-flight batch only, the last one kept: a gap, refused
    saved = (chk / "commits" / str(last - 1)).read_bytes()
    (chk / "commits" / str(last - 1)).unlink()
    with pytest.raises(CheckpointCorruptError,
                       match=rf"missing entries for batches \[{last - 1}\]"):
        _writer(tmp_path).start(chk, "available-now", pipelined=True)
    # an older batch: refused as before pipelining
    (chk / "commits" / str(last - 1)).write_bytes(saved)
    older = (chk / "commits" / "1").read_bytes()
    (chk / "commits" / "1").unlink()
    with pytest.raises(CheckpointCorruptError, match=r"missing entries for batches \[1\]"):
        _writer(tmp_path).start(chk, "available-now", pipelined=True)
    (chk / "commits" / "1").write_bytes(older)
    # both trailing commits: the two batches re-run, the output stays exact
    for batch in (last - 1, last):
        (chk / "commits" / str(batch)).unlink()
    again = _writer(tmp_path).start(chk, "available-now", pipelined=True)
    assert again.await_termination(60)
    assert again.exception is None
    assert [p["batch_id"] for p in again.recent_progress if p["run_id"] == again.run_id] == [
        last - 1, last]
    assert_frame_equal(_output(tmp_path), expected)


def test_process_all_available_returns_once_every_batch_is_committed(
    tmp_path: Path, table_name: str
) -> None:
    """Back to back (a trigger of ``None``), batches overlap; ``process_all_available``
    still returns only when the last one's rows are in the sink and committed."""
    source = mb.read_memory(schema=SCHEMA, max_records_per_batch=2)
    q = source.select("card", "amount").write_memory(table_name).start(
        tmp_path / "chk", pipelined=True)
    try:
        total = 0
        for round_ in range(3):
            rows = events(list(range(round_ * 10, round_ * 10 + 7)))
            source.add(rows)
            total += rows.height
            q.process_all_available(timeout=60)
            assert mb.table(table_name).height == total
            last = q.last_progress
            assert last is not None
            assert (tmp_path / "chk" / "commits" / str(last["batch_id"])).exists()
    finally:
        q.stop()
    assert q.exception is None
