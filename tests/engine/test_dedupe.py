"""drop_duplicates(within=...) against the one-shot ``unique``, under random splits."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import microbatch as mb
from microbatch.testing import StreamTest

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SCHEMA = {"ts": pl.Datetime("ms", "UTC"), "id": pl.Int64, "v": pl.Int64}


def frame(rows):
    return pl.DataFrame(
        {
            "ts": [T0 + timedelta(seconds=t) for t, _ in rows],
            "id": [i for _, i in rows],
            "v": list(range(len(rows))),
        },
        schema=SCHEMA,
    )


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 15)), min_size=1, max_size=50),
    cuts=st.lists(st.integers(0, 50), max_size=6),
)
def test_dedupe_split_invariance(tmp_path_factory, rows, cuts) -> None:
    test = StreamTest(
        lambda s: s.with_watermark("ts", "30s").drop_duplicates("id", within="1h"),
        schema=SCHEMA,
        checkpoint=tmp_path_factory.mktemp("d"),
    )
    data = frame(rows)
    bounds = [0, *sorted({c for c in cuts if c < len(rows)}), len(rows)]
    for lo, hi in itertools.pairwise(bounds):
        if hi > lo:
            test.add(data.slice(lo, hi - lo)).process()
    late_v = test.late_rows["v"] if test.late_rows.height else pl.Series("v", [], pl.Int64)
    kept = data.filter(~pl.col("v").is_in(late_v.implode()))
    want = kept.unique("id", keep="first", maintain_order=True)
    assert test.output.select(list(SCHEMA)).equals(want)
    wms = {p["batch_id"]: p["watermark_ms"] for p in test.progress}
    for row in test.late_rows.iter_rows(named=True):
        assert int(row["ts"].timestamp() * 1000) <= wms[row["batch_id"]]
    test.close()


def test_keys_are_forgotten_after_within(tmp_path: Path) -> None:
    test = StreamTest(
        lambda s: s.with_watermark("ts", "0s").drop_duplicates("id", within="1m"),
        schema=SCHEMA,
        checkpoint=tmp_path,
    )
    test.add(frame([(0, 1), (1, 1)])).process()
    assert test.output["v"].to_list() == [0]
    test.add(frame([(30, 1)])).process()  # still within a minute: a duplicate
    test.add(frame([(200, 2)])).process()  # moves the watermark past 0 + 1m
    test.add(frame([(201, 1)])).process()  # key 1 forgotten: kept again
    assert test.output["id"].to_list() == [1, 2, 1]
    op = test.execution.executor.operators[0]
    assert op.store is not None
    assert op.store.num_rows == 2
    test.close()


def test_dedupe_needs_a_watermark() -> None:
    with pytest.raises(mb.PlanError, match=r"needs \.with_watermark"):
        mb.read_memory(schema=SCHEMA).drop_duplicates("id", within="1m")
