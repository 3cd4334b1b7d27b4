"""Read splits: a recorded range cut into pieces that other processes read.

For every source that offers splits, the pieces of ``[start, end)`` read one
after the other are exactly ``read(start, end)``: the same rows in the same
order, the same columns and the same dead letters, for every way of cutting
(hypothesis draws the range and the number of pieces); and a split survives
pickling (it is what travels to a worker).
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from microbatch.sources.base import SourceBatch, SourceContext, balanced_runs
from microbatch.sources.delta import DeltaSource
from microbatch.sources.files import FileSource
from microbatch.sources.kafka import KafkaSource, KafkaSplit
from tests.delta.delta_helpers import append_versions, transactions

SCHEMA = {"id": pl.Int64, "card": pl.Int64, "amount": pl.Float64}


def _joined(reads: list[SourceBatch]) -> tuple[pl.DataFrame, pl.DataFrame]:
    data = pl.concat([r.data for r in reads], how="vertical")
    dead = pl.concat([r.dead_letters for r in reads], how="vertical")
    return data, dead


def _assert_same(whole: SourceBatch, pieces: list[SourceBatch]) -> None:
    data, dead = _joined(pieces)
    assert data.schema == whole.data.schema
    assert data.equals(whole.data), "the pieces' rows differ from the whole read"
    assert dead.equals(whole.dead_letters)


@given(sizes=st.lists(st.integers(0, 1_000), max_size=30), pieces=st.integers(1, 9))
def test_balanced_runs_cover_the_items_in_order(sizes: list[int], pieces: int) -> None:
    runs = balanced_runs(sizes, pieces)
    assert len(runs) == pieces
    assert runs[0][0] == 0
    assert runs[-1][1] == len(sizes)
    assert all(lo <= hi for lo, hi in runs)
    assert all(runs[i][1] == runs[i + 1][0] for i in range(pieces - 1))
    assert balanced_runs(sizes, pieces) == runs  # a function of its arguments
    if sizes and pieces <= len(sizes):
        # no run holds more than its share plus one item
        weights = [max(s, 1) for s in sizes]
        share = sum(weights) / pieces
        assert max(sum(weights[lo:hi]) for lo, hi in runs) <= share + max(weights)


@pytest.fixture(scope="module")
def json_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Nine JSON-lines files (one empty, two with a malformed line) in arrival order."""
    root = tmp_path_factory.mktemp("splits-json")
    next_id = 0
    for i in range(9):
        lines = []
        for _ in range(0 if i == 4 else 3 + 5 * (i % 3)):
            lines.append(json.dumps({"id": next_id, "card": next_id % 4,
                                     "amount": next_id * 1.25}))
            next_id += 1
        if i in (2, 7):
            lines.insert(1, '{"id": "not a number", "card": 1}')
        path = root / f"part-{i}.json"
        path.write_text("\n".join(lines) + ("\n" if lines else ""))
        os.utime(path, ns=(1_700_000_000_000_000_000 + i * 10**6,) * 2)
    return root


def _opened(source: FileSource, tmp: Path) -> FileSource:
    source.open(SourceContext("0", tmp / "state"))
    source.latest_offset(0)
    return source


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=st.integers(0, 9), length=st.integers(1, 9), pieces=st.integers(1, 5))
def test_file_splits_read_the_range(json_dir: Path, tmp_path: Path, start: int, length: int,
                                    pieces: int) -> None:
    source = _opened(FileSource(json_dir, format="json", schema=SCHEMA), tmp_path)
    end = min(start + length, 9)
    splits = source.read_splits(start, end, pieces)
    assert splits is not None
    assert len(splits) == pieces
    moved = [pickle.loads(pickle.dumps(s)) for s in splits]
    whole = source.read(start, end)
    _assert_same(whole, [s.read() for s in moved])
    if start <= 2 < end:
        assert whole.dead_letters.height >= 1  # the malformed line is among them


def test_files_without_a_schema_are_read_by_the_driver(tmp_path: Path) -> None:
    directory = tmp_path / "in"
    directory.mkdir()
    pl.DataFrame({"a": [1, 2]}).write_parquet(directory / "a.parquet")
    source = _opened(FileSource(directory, format="parquet"), tmp_path)
    assert source.read_splits(0, 1, 2) is None


@pytest.mark.delta
@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 5), pieces=st.integers(1, 4))
def test_delta_splits_read_the_range(delta_table: str, cut: int, pieces: int) -> None:
    source = DeltaSource(delta_table)
    source.open(SourceContext("0", None))
    start = {"version": 0, "index": 0}
    end = {"version": cut + 1, "index": 0}
    splits = source.read_splits(start, end, pieces)
    assert splits is not None
    assert len(splits) == pieces
    whole = source.read(start, end)
    assert whole.data.height > 0
    _assert_same(whole, [pickle.loads(pickle.dumps(s)).read() for s in splits])


@pytest.fixture(scope="module")
def delta_table(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Six appended versions, one partitioned by merchant (several files each)."""
    path = str(tmp_path_factory.mktemp("splits-delta") / "table")
    append_versions(path, [transactions(100 * v, 40 + v) for v in range(6)],
                    partition_by=["merchant"])
    return path


@pytest.mark.parametrize("topics", [["t"], ["t", "u"]])
def test_an_empty_kafka_split_has_the_columns_of_a_read(topics: list[str]) -> None:
    """More workers than partitions with records: a worker's split is empty, and
    its rows (none, no broker asked) have the columns and types of any read's,
    partition ids included, so the workers' pieces concatenate."""
    source = KafkaSource(topics, bootstrap="127.0.0.1:1", schema=SCHEMA)
    assert [split.ranges for split in source.read_splits({}, {}, 3)] == [(), (), ()]
    empty = pickle.loads(pickle.dumps(KafkaSplit(source._options, ()))).read()
    assert empty.data.schema == source.schema
    assert empty.data.height == 0
    assert empty.partitions is not None
    assert empty.partitions.dtype == (pl.Int32 if len(topics) == 1 else pl.String)
    assert empty.dead_letters.height == 0


def test_kafka_splits_are_runs_of_partitions_in_read_order() -> None:
    """The partitions with records, in the (topic, partition) order of a read's
    rows, cut into runs of about equal offsets; a partition missing from the
    start is at 0, one without records in the range is left out."""
    source = KafkaSource(["b", "a"], bootstrap="127.0.0.1:1", format="raw")
    start = {"b:0": 5, "a:1": 100}
    end = {"b:0": 25, "b:10": 30, "b:2": 12, "a:1": 100, "a:0": 10}
    splits = source.read_splits(start, end, 2)
    assert [split.ranges for split in splits] == [
        ((("a", 0), 0, 10), (("b", 0), 5, 25), (("b", 2), 0, 12)),  # 42 offsets
        ((("b", 10), 0, 30),),  # 30
    ]
