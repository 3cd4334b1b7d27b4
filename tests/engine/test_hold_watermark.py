"""``start(..., hold_watermark=True)``: no row is late and nothing closes before
the end of input, so the result equals the one-shot oracle over *every* row,
out-of-order ones included, for any batch cap (the restatement's rule)."""

from __future__ import annotations

from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

import microbatch as mb
from sinks import MemorySink
from tests.engine.test_flush_at_end import as_ms, events, oracle, windowed

# 400 s arrives before 10 s, 50 s and 70 s: with a 30 s delay those three are
# late for a moving watermark (for a small enough cap), never for a held one
SECONDS = [0, 400, 10, 50, 130, 70, 200, 205, 290]


@pytest.mark.parametrize("cap", [1, 3])
@pytest.mark.parametrize("kind", ["tumbling", "hopping", "session"])
def test_a_held_watermark_gives_the_one_shot_result_with_out_of_order_rows(
    kind: str, cap: int, tmp_path: Path, table_name: str
) -> None:
    rows = events(SECONDS)
    late = MemorySink(f"{table_name}_late")
    stream = windowed(mb.read_memory(rows, max_records_per_batch=cap).on_late(late), kind)
    q = stream.write_memory(table_name).start(tmp_path / "chk", "available-now",
                                              hold_watermark=True)
    q.await_termination()
    assert_frame_equal(as_ms(mb.table(table_name)), oracle(kind, rows))
    progress = q.recent_progress
    assert sum(p["late_rows"] for p in progress) == 0
    # every data batch ran without a watermark; the flush batch released it
    assert [p["watermark_ms"] for p in progress[:-1]] == [None] * (len(progress) - 1)
    assert progress[-1]["input_rows"] == 0
    assert progress[-1]["watermark_ms"] is not None

    # the same input with a moving watermark loses the out-of-order rows
    moving = windowed(mb.read_memory(rows, max_records_per_batch=cap), kind)
    m = moving.write_memory(f"{table_name}_moving").start(tmp_path / "m", "available-now",
                                                          flush_at_end=True)
    m.await_termination()
    assert sum(p["late_rows"] for p in m.recent_progress) > 0


def test_hold_watermark_is_refused_with_an_interval_trigger(tmp_path: Path) -> None:
    stream = windowed(mb.read_memory(events([0])), "tumbling")
    with pytest.raises(mb.TriggerError, match=r"hold_watermark=True .*bounded trigger.*'10s'"):
        stream.write_memory("hold_refused").start(tmp_path / "chk", "10s", hold_watermark=True)
    assert not (tmp_path / "chk").exists()
