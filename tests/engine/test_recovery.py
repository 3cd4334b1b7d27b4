"""Exactly-once output across failures at every lifecycle step.

A deterministic injected failure between each two steps, then a restart on
the same checkpoint: the sink ends with exactly the rows of one clean run.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import microbatch as mb
from microbatch.engine.faults import InjectedFault
from microbatch.sources.generator import GeneratorSource

PARAMS = {
    "total_rows": 20_000,
    "rows_per_second": None,
    "seed": 11,
    "cards": 100,
    "max_records_per_batch": 3_000,
    "start": "2026-01-01T00:00:00+00:00",
}

LIFECYCLE_POINTS = [
    "after_plan",
    "after_write_ahead",
    "after_read",
    "after_execute",
    "sink.after_data",
    "after_sink",
    "after_commit",
    "after_report",
]


def expected_rows() -> pl.DataFrame:
    source = GeneratorSource(**PARAMS)
    start = source.initial_offset()
    rows = source.read(start, source.latest_offset(start, capped=False)).data
    return rows.filter(pl.col("amount") > 20).select("event_id", "card_id", "amount")


def writer(out: Path) -> mb.DataStreamWriter:
    return (
        mb.generate(**PARAMS)
        .filter(pl.col("amount") > 20)
        .select("event_id", "card_id", "amount")
        .write_parquet(out)
    )


@pytest.mark.parametrize("point", LIFECYCLE_POINTS)
@pytest.mark.parametrize("batch", [0, 3])
def test_injected_failure_then_restart_is_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str, batch: int
) -> None:
    out, chk = tmp_path / "out", tmp_path / "chk"
    monkeypatch.setenv("MICROBATCH_FAULT", f"{point}@{batch}")
    monkeypatch.setenv("MICROBATCH_FAULT_ACTION", "raise")
    query = writer(out).start(chk, trigger="available-now")
    with pytest.raises(mb.QueryTerminatedError):
        query.await_termination(60)
    assert isinstance(query.exception, InjectedFault)
    monkeypatch.delenv("MICROBATCH_FAULT")
    query = writer(out).start(chk, trigger="available-now")
    assert query.await_termination(60)
    got = mb.parquet_table(out).sort("event_id")
    assert got.equals(expected_rows())
    committed = sorted(int(p.name) for p in (chk / "commits").iterdir())
    assert committed == list(range(7))


def test_recovered_batch_reuses_recorded_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch written ahead with a small cap is re-run with that range even
    when the restarted job would plan a bigger batch."""
    out, chk = tmp_path / "out", tmp_path / "chk"
    monkeypatch.setenv("MICROBATCH_FAULT", "after_write_ahead@0")
    monkeypatch.setenv("MICROBATCH_FAULT_ACTION", "raise")
    query = writer(out).start(chk, trigger="available-now")
    with pytest.raises(mb.QueryTerminatedError):
        query.await_termination(60)
    monkeypatch.delenv("MICROBATCH_FAULT")
    bigger = {**PARAMS, "max_records_per_batch": 50_000}
    stream = mb.generate(**bigger).filter(pl.col("amount") > 20)
    query = (
        stream.select("event_id", "card_id", "amount")
        .write_parquet(out)
        .start(chk, trigger="available-now")
    )
    query.await_termination(60)
    first = query.recent_progress[0]
    assert first["batch_id"] == 0
    assert first["recovered"] is True
    assert first["input_rows"] == 3_000
    assert mb.parquet_table(out).sort("event_id").equals(expected_rows())
