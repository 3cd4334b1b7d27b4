"""``FanOutSink(concurrent=True)``: the sinks write a batch at the same time, each
exactly once per batch id, and a failure surfaces only after every sink finished."""

from __future__ import annotations

import threading
from pathlib import Path

import polars as pl
import pytest

from sinks.base import SinkContext
from sinks.delta import DeltaSink
from sinks.exceptions import SinkError
from sinks.fanout import FanOutSink
from sinks.foreach import ForeachBatchSink

pytestmark = pytest.mark.delta


def rows(batch_id: int) -> pl.DataFrame:
    return pl.DataFrame({"batch": [batch_id] * 3, "k": [10 * batch_id + i for i in range(3)]})


def test_concurrent_sinks_write_at_once_fail_after_all_finished_and_replay_once(
    tmp_path: Path,
) -> None:
    both = threading.Barrier(2, timeout=30)  # broken unless the two sinks run at once
    calls: dict[str, list[int]] = {"pages": [], "topic": []}
    down = {1}

    def pages(df: pl.DataFrame, batch_id: int) -> None:
        if batch_id == 0:
            both.wait()
        if batch_id in down:
            down.discard(batch_id)
            raise RuntimeError("receiver down")
        calls["pages"].append(batch_id)

    def topic(df: pl.DataFrame, batch_id: int) -> None:
        if batch_id == 0:
            both.wait()
        calls["topic"].append(batch_id)

    table = DeltaSink(tmp_path / "alerts")
    fan = FanOutSink([ForeachBatchSink(pages), ForeachBatchSink(topic), table], concurrent=True)
    fan.open(SinkContext(query_id="q", checkpoint_dir=tmp_path / "chk"))
    fan.add_batch(0, rows(0))
    assert fan.metrics()[table.label]["ms"] > 0  # each sink's time, per batch
    assert fan.metrics()[table.label]["version"] is not None

    with pytest.raises(SinkError, match="receiver down"):
        fan.add_batch(1, rows(1))
    # NOTE: the error surfaced after the other sinks finished batch 1, never before
    assert calls["topic"] == [0, 1]
    assert pl.read_delta(str(tmp_path / "alerts"))["batch"].to_list().count(1) == 3

    fan.add_batch(1, rows(1))  # the engine's re-run of the failed batch
    fan.add_batch(2, rows(2))
    fan.close()
    assert calls == {"pages": [0, 1, 2], "topic": [0, 1, 2]}
    got = pl.read_delta(str(tmp_path / "alerts")).sort("k")
    assert got.equals(pl.concat([rows(0), rows(1), rows(2)]))  # each batch once
