"""The Nexmark generator follows the reference's data model, and every Nexmark query,
over a small generated input cut into random batches, equals its one-shot oracle."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.nexmark.generator import (
    AUCTION,
    BID,
    PERSON,
    STREAMS,
    NexmarkConfig,
    NexmarkGenerator,
)
from benchmarks.nexmark.queries import QUERIES
from benchmarks.nexmark.run import run_engine, verdict

EVENTS = 3_000
CONFIG = NexmarkConfig(rate=200, seed=3)
"""3,000 events over 15 s of event time: 10-second windows close during the run."""


@pytest.fixture(scope="module")
def events() -> dict[str, pl.DataFrame]:
    return NexmarkGenerator(CONFIG).events(0, EVENTS)


def test_proportions_ids_and_event_time_follow_the_reference(
        events: dict[str, pl.DataFrame]) -> None:
    persons, auctions, bids = events[PERSON], events[AUCTION], events[BID]
    assert (persons.height, auctions.height, bids.height) == (60, 180, 2760)  # 1:3:46
    # ids are consecutive from 1000, in event order
    assert persons["id"].to_list() == list(range(1000, 1060))
    assert auctions["id"].to_list() == list(range(1000, 1180))
    # event n happens at base + n * 1000 / rate ms: person k is event 50 k
    start = CONFIG.base_time_ms
    assert persons["dateTime"].dt.epoch("ms").to_list() == [start + 50 * k * 5 for k in range(60)]
    for frame in (persons, auctions, bids):
        assert frame["dateTime"].is_sorted()
    # a seller is the hot one (first of the last block of 100 people), or one of the
    # last 1,000 people, or one of the next 10 (the lead): auction k is in epoch k // 3,
    # whose last person is number k // 3
    last_person = (pl.col("id") - 1000) // 3
    seller = pl.col("seller") - 1000
    assert auctions.select(
        ((seller <= last_person + 10) & (seller >= last_person - 999)).all()).item()
    assert 0.6 < auctions.select((seller == last_person // 100 * 100).mean()).item() < 0.9
    # a bid's auction exists already or is one of the next 10
    assert bids.select(pl.col("auction").max()).item() <= auctions["id"].to_list()[-1] + 10
    assert bids.select(pl.col("auction").min()).item() >= 1000
    # prices: round(10 ** U(0, 6) * 100) cents; categories 10..14
    assert bids.select(pl.col("price").is_between(100, 100_000_000).all()).item()
    assert set(auctions["category"].unique()) <= set(range(10, 15))
    assert (auctions["expires"] > auctions["dateTime"]).all()


def test_the_generator_is_deterministic_and_the_bidder_quirk_is_optional(
        events: dict[str, pl.DataFrame]) -> None:
    again = NexmarkGenerator(CONFIG).events(0, EVENTS)
    assert all(again[s].equals(events[s]) for s in STREAMS)
    quirky = NexmarkConfig(rate=200, seed=3, bidder_id_quirk=True)
    quirk = NexmarkGenerator(quirky).events(0, EVENTS)
    assert (quirk[BID]["bidder"] - events[BID]["bidder"] == 1000).all()
    # bidders are people (ids up to the last person plus the lead of 10) without the quirk
    most = events[PERSON]["id"].to_list()[-1] + 10
    assert events[BID].select(pl.col("bidder").max()).item() <= most


@dataclass(frozen=True)
class SplitEvents:
    """The events written as files cut at the same event times on every stream."""

    root: Path
    config: NexmarkConfig
    frames: dict[str, pl.DataFrame]

    def stream_dir(self, stream: str) -> Path:
        return self.root / stream

    def schema(self, stream: str) -> pl.Schema:
        return self.frames[stream].schema

    def scan(self, stream: str) -> pl.LazyFrame:
        return self.frames[stream].lazy()


def write_split(root: Path, frames: dict[str, pl.DataFrame], cuts_ms: list[int]) -> SplitEvents:
    import os

    bounds = [None, *sorted(set(cuts_ms)), None]
    for stream, frame in frames.items():
        (root / stream).mkdir(parents=True)
        t = frame["dateTime"].dt.epoch("ms")
        for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            keep = pl.Series(np.ones(frame.height, dtype=bool))
            if lo is not None:
                keep &= t >= lo
            if hi is not None:
                keep &= t < hi
            path = root / stream / f"part-{i:03d}.parquet"
            frame.filter(keep).write_parquet(path)
            os.utime(path, (1_000_000 + i, 1_000_000 + i))
    return SplitEvents(root, CONFIG, frames)


SPAN_MS = EVENTS * 1000 // CONFIG.rate


@settings(max_examples=2, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(1, SPAN_MS - 1), min_size=1, max_size=5))
def test_every_query_equals_its_oracle_over_random_batches(
        cuts: list[int], events: dict[str, pl.DataFrame],
        tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("nexmark")
    split = write_split(root / "data", events, [CONFIG.base_time_ms + c for c in cuts])
    wrong = {}
    for name, query in QUERIES.items():
        run = run_engine(query, split, root / f"chk-{name}")
        oracle = query.oracle({s: split.scan(s) for s in query.inputs}, CONFIG).collect()
        assert oracle.height > 0, name
        if (why := verdict(query, run.output, oracle)) is not None:
            wrong[name] = why
    assert wrong == {}
