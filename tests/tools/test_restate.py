"""``Restatement`` (``backfill --replace-where``) in process: the staged writer
writes its output and every side output to memory, never to the job's tables."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import microbatch as mb
from microbatch.cli.queries import _side_note
from microbatch.tools.restate import Restatement
from sinks.delta import DeltaSink
from sinks.memory import MemorySink
from tests.engine.test_flush_at_end import as_ms, events, oracle, windowed

pytestmark = pytest.mark.delta

SECONDS = [0, 400, 10, 50, 130, 70, 200]  # 10, 50 and 70 late for a moving watermark


def restatement(tmp_path: Path) -> Restatement:
    stream = (mb.read_memory(events(SECONDS), max_records_per_batch=1)
              .on_late(DeltaSink(tmp_path / "late"))
              .on_dead_letters(DeltaSink(tmp_path / "dead")))
    writer = windowed(stream, "tumbling").write_delta(tmp_path / "out")
    return Restatement.of(writer, "card = 1")


@pytest.mark.parametrize("hold", [True, False])
def test_side_outputs_are_staged_and_counted_never_written(
    tmp_path: Path, hold: bool
) -> None:
    restate = restatement(tmp_path)
    staged = restate.staged
    assert isinstance(staged.late_sink, MemorySink)
    assert isinstance(staged.dead_letter, MemorySink)
    q = staged.start(tmp_path / "chk", "available-now", hold_watermark=hold, flush_at_end=True)
    q.await_termination()
    late = sum(p["late_rows"] for p in q.recent_progress)
    rows = as_ms(restate.rows())
    counts = restate.side_rows()
    assert counts == {"dead_letter": 0, "late_sink": late}
    assert not any((tmp_path / t).exists() for t in ("out", "late", "dead"))  # never opened
    want = oracle("tumbling", events(SECONDS)).filter(pl.col("card") == 1)
    if hold:  # the restatement's rule: every row counts
        assert late == 0
        assert_frame_equal(rows, want)
        assert _side_note(counts) == ""
    else:  # a moving watermark drops the out-of-order rows, into the staged side output
        assert late > 0
        assert rows["total"].sum() < want["total"].sum()
        assert _side_note(counts) == f"; kept out of the job's side outputs: {late} late rows"
