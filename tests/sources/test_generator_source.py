"""GeneratorSource: determinism, split invariance, skew, disorder, partitions, rate."""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from microbatch.exceptions import DurationError, PlanError, SourceError
from microbatch.sources.generator import CHUNK_ROWS, GENERATOR_SCHEMA, GeneratorSource

START = datetime(2024, 1, 1, tzinfo=UTC)
START_MS = 1_704_067_200_000


def bounded(total: int = 10_000, **options) -> GeneratorSource:
    options.setdefault("start", START)
    return GeneratorSource(rows_per_second=None, total_rows=total, **options)


def read_all(source: GeneratorSource) -> pl.DataFrame:
    start = source.initial_offset()
    return source.read(start, source.latest_offset(start, capped=False)).data


def nominal_ms(frame: pl.DataFrame, per_second: float = 1000.0) -> np.ndarray:
    ids = frame["event_id"].to_numpy()
    return START_MS + np.floor(ids * 1000.0 / per_second).astype(np.int64)


def event_ms(frame: pl.DataFrame) -> np.ndarray:
    return frame["event_time"].dt.epoch("ms").to_numpy()


def test_rows_have_the_schema_and_are_deterministic() -> None:
    frame = read_all(bounded(seed=7))
    assert frame.schema == GENERATOR_SCHEMA
    assert frame["event_id"].to_list() == list(range(10_000))
    assert frame.equals(read_all(bounded(seed=7)))
    assert not frame.equals(read_all(bounded(seed=8)))
    assert frame["merchant"].str.contains(r"^m-\d{4}$").all()
    assert frame["amount"].min() > 0
    assert (frame["amount"] * 100).round(6).equals((frame["amount"] * 100).round(0))


TOTAL = 2 * CHUNK_ROWS + 1_000
WHOLE = bounded(TOTAL, partitions=3, late_fraction=0.1, seed=3)
WHOLE_BATCH = WHOLE.read(WHOLE.initial_offset(), WHOLE.latest_offset(WHOLE.initial_offset()))


@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=TOTAL), max_size=6))
def test_any_split_of_the_log_gives_the_same_rows(cuts: list[int]) -> None:
    source = bounded(TOTAL, partitions=3, late_fraction=0.1, seed=3)  # a fresh cache
    start = source.initial_offset()
    points = [0, *sorted(cuts), TOTAL]
    batches = [
        source.read({**start, "rows": a}, {**start, "rows": b})
        for a, b in itertools.pairwise(points)
    ]
    assert pl.concat([b.data for b in batches]).equals(WHOLE_BATCH.data)
    parts = pl.concat([b.partitions for b in batches if b.partitions is not None])
    assert WHOLE_BATCH.partitions is not None
    assert parts.equals(WHOLE_BATCH.partitions)


def test_replay_takes_the_origin_from_the_offsets() -> None:
    live = GeneratorSource(rows_per_second=None, total_rows=500, start="now", seed=1)
    start = live.initial_offset()
    end = live.latest_offset(start)
    first = live.read(start, end).data

    time.sleep(0.01)
    restarted = GeneratorSource(rows_per_second=None, total_rows=500, start="now", seed=1)
    assert restarted.read(start, end).data.equals(first)
    # a fresh query has its own origin
    fresh = restarted.initial_offset()
    assert fresh["start_ms"] > start["start_ms"]
    assert first["event_time"].dt.epoch("ms").max() <= start["start_ms"] + 500


def test_card_ids_are_zipf_skewed() -> None:
    frame = read_all(bounded(100_000, cards=1_000, zipf=1.1))
    counts = frame["card_id"].value_counts()["count"].to_numpy()
    assert frame["card_id"].min() >= 0
    assert frame["card_id"].max() < 1_000
    assert counts.max() > 50 * np.median(counts)
    assert frame["card_id"].mode().to_list() == [0]


def test_disorder_is_bounded_by_max_delay() -> None:
    frame = read_all(bounded(50_000, max_delay="2s"))
    lag = nominal_ms(frame) - event_ms(frame)
    assert lag.min() >= 0
    assert lag.max() <= 2_000
    assert lag.max() > 1_900  # the whole range is used


def test_late_fraction_is_about_right_and_late_by_is_respected() -> None:
    frame = read_all(bounded(50_000, max_delay="5s", late_fraction=0.2, late_by=("1m", "2m")))
    lag = nominal_ms(frame) - event_ms(frame)
    late = lag > 5_000
    assert late.mean() == pytest.approx(0.2, abs=0.01)
    assert lag[late].min() >= 60_000
    assert lag[late].max() <= 125_000
    assert lag[~late].max() <= 5_000


def test_event_time_follows_rows_per_second() -> None:
    source = GeneratorSource(rows_per_second=10, total_rows=100, start=START, max_delay="0s")
    start = source.initial_offset()
    assert source.latest_offset(start)["rows"] < 100  # 10 s of wall clock have not passed
    frame = source.read(start, {**start, "rows": 100}).data  # any recorded range reads
    assert (event_ms(frame) == nominal_ms(frame, per_second=10)).all()
    assert frame["event_time"][-1] == datetime(2024, 1, 1, 0, 0, 9, 900_000, tzinfo=UTC)


def test_partition_ids() -> None:
    source = bounded(1_000, partitions=4)
    start = source.initial_offset()
    batch = source.read({**start, "rows": 10}, {**start, "rows": 20})
    assert batch.partitions is not None
    assert batch.partitions.dtype == pl.Int32
    assert batch.partitions.to_list() == [i % 4 for i in range(10, 20)]
    assert len(batch.partitions) == batch.data.height


def test_rate_limited_availability_grows_with_time() -> None:
    source = GeneratorSource(rows_per_second=20_000, total_rows=3_000, start=START)
    start = source.initial_offset()
    first = source.latest_offset(start)["rows"]
    time.sleep(0.06)
    second = source.latest_offset(start)["rows"]
    assert 0 <= first < second
    time.sleep(0.12)
    assert source.latest_offset(start)["rows"] == 3_000  # capped by total_rows


def test_max_records_per_batch_caps_only_when_capped() -> None:
    source = bounded(1_000, max_records_per_batch=300)
    start = source.initial_offset()
    end = source.latest_offset(start)
    assert end["rows"] == 300
    assert source.latest_offset(end)["rows"] == 600
    assert source.latest_offset(start, capped=False)["rows"] == 1_000
    done = {**start, "rows": 1_000}
    assert source.latest_offset(done) == done
    assert source.compare(start, end) == -1
    assert source.compare(end, end) == 0
    assert source.read(done, done).data.height == 0


def test_bad_parameters_and_offsets_are_refused() -> None:
    with pytest.raises(PlanError, match="total_rows"):
        GeneratorSource(rows_per_second=None)
    with pytest.raises(PlanError, match="rows_per_second"):
        GeneratorSource(rows_per_second=0)
    with pytest.raises(PlanError, match="late_fraction"):
        GeneratorSource(late_fraction=1.5)
    with pytest.raises(PlanError, match="late_by"):
        GeneratorSource(late_by=("1h", "1m"))
    with pytest.raises(DurationError, match="max_delay"):
        GeneratorSource(max_delay="soon")
    with pytest.raises(PlanError, match="start"):
        GeneratorSource(start="yesterday")
    source = bounded(100)
    start = source.initial_offset()
    with pytest.raises(SourceError, match="not a generator offset"):
        source.read(0, 10)
    with pytest.raises(SourceError, match="rows"):
        source.read(start, {**start, "rows": 101})
    with pytest.raises(SourceError, match="different origins"):
        source.read(start, {**start, "rows": 5, "start_ms": 0})


def test_identity_covers_every_parameter_but_the_batch_cap() -> None:
    base = bounded(100).identity()
    assert base["kind"] == "generator"
    assert base["start"] == "2024-01-01T00:00:00+00:00"
    assert bounded(100, max_records_per_batch=5).identity() == base
    assert bounded(100, max_records_per_batch=5).describe()["max_records_per_batch"] == 5
    for change in [
        {"seed": 1},
        {"cards": 5},
        {"zipf": 2.0},
        {"late_fraction": 0.5},
        {"max_delay": "1s"},
        {"partitions": 2},
        {"merchants": 3},
    ]:
        assert bounded(100, **change).identity() != base, change
    assert GeneratorSource().identity()["start"] == "now"
