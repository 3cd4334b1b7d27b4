"""The bad-input corpus of the file source: each kind of bad input has its
documented outcome (dead letter with the reason, late output, accepted, or a
clear stop that resumes after the fix), and no good record is ever lost.

The cases and the behaviour table are in ``corpus.py`` and
``docs/reliability.md``; below them, regression tests for the bugs the
corpus found.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from corpus import Case, cases, run_case

import microbatch as mb
from microbatch.sources.base import SourceContext
from microbatch.sources.files import FileSource

CASES = cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_has_its_documented_outcome_and_loses_no_good_record(
    case: Case, tmp_path: Path
) -> None:
    result = run_case(case, tmp_path)

    assert result.problems == []
    assert result.outcome == case.outcome
    assert result.lost == 0
    assert result.passed_through == result.good_in


def test_the_corpus_covers_every_kind_and_format() -> None:
    kinds = {(c.kind, c.fmt) for c in CASES}
    for fmt in ("json", "csv", "parquet"):
        for kind in ("null event time", "huge record", "empty file", "schema drift: new column",
                     "schema drift: dropped column", "wrong type"):
            assert (kind, fmt) in kinds
    for kind in ("malformed record", "truncated Parquet", "far-future time",
                 "schema drift: type change", "duplicate records", "byte-order mark"):
        assert kind in {k for k, _ in kinds}


# ------------------------------------------------------------------ regressions


def _source(directory: Path, fmt: str, schema: dict[str, pl.DataType]) -> FileSource:
    source = FileSource(directory, format=fmt, schema=schema)  # type: ignore[arg-type]
    source.open(SourceContext("0", None))
    return source


def test_parquet_float_that_does_not_fit_an_integer_is_a_dead_letter(tmp_path: Path) -> None:
    # was: 1.5 silently truncated to 1 (while "1.5" in JSON is a dead letter)
    pl.DataFrame({"id": [1.0, 1.5, None, 3.0]}).write_parquet(tmp_path / "a.parquet")
    source = _source(tmp_path, "parquet", {"id": pl.Int64})

    batch = source.read(0, source.latest_offset(0))

    assert batch.data["id"].to_list() == [1, None, 3]
    assert batch.dead_letters["location"].to_list() == [f"{tmp_path / 'a.parquet'}#row=1"]
    assert "cannot convert 1.5 to Int64" in batch.dead_letters["reason"][0]


def test_json_with_a_byte_order_mark_keeps_its_first_record(tmp_path: Path) -> None:
    # was: the first record became a dead letter ("invalid JSON line ... 'ï'")
    (tmp_path / "a.json").write_bytes(b'\xef\xbb\xbf{"id": 1}\n{"id": 2}\n')
    source = _source(tmp_path, "json", {"id": pl.Int64})

    batch = source.read(0, source.latest_offset(0))

    assert batch.data["id"].to_list() == [1, 2]
    assert batch.dead_letters.height == 0


def _land(directory: Path, frames: list[pl.DataFrame]) -> None:
    directory.mkdir(exist_ok=True)
    for i, frame in enumerate(frames):
        path = directory / f"{i:03d}.parquet"
        frame.write_parquet(path)
        os.utime(path, ns=(10**18 + i * 10**6, 10**18 + i * 10**6))


def _payments(start: int, amount: pl.DataType) -> pl.DataFrame:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    return pl.DataFrame(
        {
            "card_id": [1, 2],
            "amount": pl.Series([1.5, 2.5]).cast(amount),
            "event_time": [t0 + timedelta(seconds=start), t0 + timedelta(seconds=start + 1)],
        }
    ).with_columns(pl.col("event_time").dt.cast_time_unit("ms"))


@pytest.mark.parametrize("agg", ["tumbling", "session"])
def test_a_changed_input_type_is_refused_by_the_aggregation(tmp_path: Path, agg: str) -> None:
    # was: Int64 state, Float64 batch -> 1.5 silently summed as 1 (tumbling and session)
    _land(tmp_path / "in", [_payments(0, pl.Int64), _payments(70, pl.Float64)])
    window = mb.window("event_time", "1m") if agg == "tumbling" else mb.session_window(
        "event_time", gap="10s")
    query = (
        mb.read_files(tmp_path / "in", format="parquet", max_files_per_batch=1)
        .with_watermark("event_time", "5s")
        .group_by(window, "card_id")
        .agg(pl.col("amount").sum())
        .write_memory(f"drift_{agg}")
        .start(tmp_path / "chk", trigger="available-now")
    )
    with pytest.raises(mb.QueryTerminatedError) as info:
        query.await_termination(60)

    cause = info.value.__cause__
    assert isinstance(cause, mb.IncompatibleCheckpointError)
    assert "changed type: sum('amount') is Float64 in batch 1, Int64 in the state" in str(cause)


def test_the_parquet_sink_refuses_a_batch_with_other_columns(tmp_path: Path) -> None:
    # was: accepted, and then read_parquet_output could not read the output
    _land(tmp_path / "in", [pl.DataFrame({"id": [1]}), pl.DataFrame({"id": [2], "x": ["new"]}),
                            pl.DataFrame({"id": [3.5]})])
    source = mb.read_files(tmp_path / "in", format="parquet", max_files_per_batch=1)
    query = source.write_parquet(tmp_path / "out").start(tmp_path / "chk",
                                                        trigger="available-now")
    with pytest.raises(mb.QueryTerminatedError, match="new column 'x' \\(String\\)"):
        query.await_termination(60)
    assert mb.parquet_table(tmp_path / "out")["id"].to_list() == [1]

    pinned = mb.read_files(tmp_path / "in", format="parquet", max_files_per_batch=1,
                           schema={"id": pl.Int64})
    pinned.write_parquet(tmp_path / "out").start(tmp_path / "chk",
                                                 trigger="available-now").await_termination(60)
    assert mb.parquet_table(tmp_path / "out")["id"].to_list() == [1, 2]
    dead = mb.parquet_table(tmp_path / "chk" / "dead_letter")
    assert "cannot convert 3.5 to Int64" in dead["reason"][0]
