"""DeltaSink takes changelogs: one MERGE per batch applies deletes and upserts,
``output_mode="changelog"`` appends the change rows, ``change_data_feed=True``
makes the table's own change feed readable. Real tables on local disk, against
the dict oracle of ``tests/change_oracle.py``."""

from __future__ import annotations

import itertools
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from change_oracle import KEYS, apply_changes, as_frame, change_batches, cuts, operations, oracle
from delta_helpers import operations as commit_operations
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from polars.testing import assert_frame_equal

from sinks.base import OutputMode, SinkContext
from sinks.delta import DeltaSink
from sinks.exceptions import SinkConfigError

pytestmark = pytest.mark.delta


def opened(path: Path, mode: OutputMode, **options: object) -> DeltaSink:
    sink = DeltaSink(path, **options)  # type: ignore[arg-type]
    sink.open(SinkContext(query_id="q-cl", output_mode=mode, key_columns=KEYS))
    return sink


def read(path: Path) -> pl.DataFrame:
    return pl.read_delta(str(path)).sort(list(KEYS))


def change_feed(path: Path, start: int = 0) -> list[pl.DataFrame]:
    """The table's Change Data Feed from version ``start``, one frame per commit version."""
    reader = DeltaTable(str(path)).load_cdf(starting_version=start)
    feed = pl.DataFrame(pa.table(reader.read_all()))
    return [
        part.drop("_commit_version", "_commit_timestamp")
        for _, part in sorted(feed.group_by("_commit_version"), key=lambda kv: kv[0])
    ]


def changes_the_table(before: list[pl.DataFrame], frame: pl.DataFrame) -> bool:
    """Whether applying ``frame`` makes a MERGE write anything: some key's last change
    is an upsert, or a delete of a key the table holds (delta-rs commits nothing for
    a MERGE that changes no row)."""
    held = set(oracle(before).select(KEYS).rows())
    last: dict[tuple[object, ...], str] = {}
    for row in frame.iter_rows(named=True):
        if row["_change_type"] != "update_preimage":
            last[tuple(row[c] for c in KEYS)] = row["_change_type"]
    return any(kind != "delete" or key in held for key, kind in last.items())


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations, cut_at=cuts)
def test_update_mode_applies_each_batch_in_one_merge_commit(
    tmp_path_factory: pytest.TempPathFactory, ops, cut_at
) -> None:
    path = tmp_path_factory.mktemp("cl") / "t"
    batches = change_batches(ops, cut_at)
    sink = opened(path, "update", change_data_feed=True)
    for batch_id, frame in enumerate(batches):
        sink.add_batch(batch_id, frame)
        assert_frame_equal(read(path), oracle(batches[: batch_id + 1]))
    table = DeltaTable(str(path))
    version = table.version()
    changing = [i for i, frame in enumerate(batches) if changes_the_table(batches[:i], frame)]
    assert commit_operations(str(path)) == ["CREATE TABLE"] + ["MERGE"] * len(changing)
    assert table.transaction_version("q-cl") == (changing[-1] if changing else None)
    sink.add_batch(len(batches) - 1, batches[-1])  # a replay of the last batch: no-op
    assert DeltaTable(str(path)).version() == version
    assert_frame_equal(read(path), oracle(batches))
    # the table's own change feed, applied version after version, is the table too
    # (within one MERGE a key has one change: a pre/post pair, an insert or a delete)
    table_from_feed: dict[tuple[object, ...], dict[str, object]] = {}
    for version_changes in change_feed(path):
        apply_changes(table_from_feed, version_changes)
    assert_frame_equal(as_frame(table_from_feed.values()), oracle(batches))


def test_update_mode_with_schema_merge_never_writes_the_delete_marker(tmp_path: Path) -> None:
    sink = opened(tmp_path / "t", "update", schema_mode="merge")
    first = pl.DataFrame({"g": ["a", "a"], "k": [1, 2], "v": [1, 2],
                          "_change_type": ["insert", "insert"]})
    sink.add_batch(0, first)
    sink.add_batch(1, pl.DataFrame({"g": ["a", "a"], "k": [1, 3], "v": [1, 3], "w": [None, 7],
                                    "_change_type": ["delete", "insert"]}))
    assert read(tmp_path / "t").rows() == [("a", 2, 2, None), ("a", 3, 3, 7)]
    assert DeltaTable(str(tmp_path / "t")).schema().to_arrow().names == ["g", "k", "v", "w"]


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations, cut_at=cuts)
def test_changelog_mode_appends_the_change_rows_once(
    tmp_path_factory: pytest.TempPathFactory, ops, cut_at
) -> None:
    path = tmp_path_factory.mktemp("cl") / "t"
    batches = change_batches(ops, cut_at)
    sink = opened(path, "changelog")
    for batch_id, frame in enumerate(batches):
        sink.add_batch(batch_id, frame)
    sink.add_batch(len(batches) - 1, batches[-1])
    stored = pl.read_delta(str(path))
    assert_frame_equal(stored, pl.concat(batches), check_row_order=False)
    writes = sum(1 for frame in batches if frame.height)
    assert commit_operations(str(path)) == ["CREATE TABLE"] + ["WRITE"] * writes
    # each batch with rows is one version holding exactly that batch's rows
    heights = [pl.read_delta(str(path), version=v).height
               for v in range(DeltaTable(str(path)).version() + 1)]
    assert [b - a for a, b in itertools.pairwise(heights)] == [
        frame.height for frame in batches if frame.height
    ]


def test_changelog_mode_refuses_a_keyed_batch_without_change_type(tmp_path: Path) -> None:
    sink = opened(tmp_path / "t", "changelog")
    with pytest.raises(SinkConfigError, match="could be an insert or an update"):
        sink.add_batch(0, pl.DataFrame({"g": ["a"], "k": [1], "v": [1]}))
    assert not (tmp_path / "t").exists()


def test_change_data_feed_needs_a_table_that_has_it(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"g": ["a"], "k": [1], "v": [1]}))
    with pytest.raises(SinkConfigError, match="set_table_properties"):
        opened(path, "update", change_data_feed=True)
    DeltaTable(str(path)).alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    opened(path, "update", change_data_feed=True).add_batch(
        0, pl.DataFrame({"g": ["a"], "k": [1], "v": [1], "_change_type": ["delete"]})
    )
    assert read(path).height == 0
    # NOTE: delta-rs refuses a change feed read that starts before the feed was enabled
    last = DeltaTable(str(path)).version()
    assert change_feed(path, last)[0]["_change_type"].to_list() == ["delete"]


def test_change_data_feed_is_refused_with_changelog_mode(tmp_path: Path) -> None:
    with pytest.raises(SinkConfigError, match="reserves"):
        opened(tmp_path / "t", "changelog", change_data_feed=True)
    sink = opened(tmp_path / "t", "append", change_data_feed=True)
    with pytest.raises(SinkConfigError, match="reserves"):
        sink.add_batch(0, pl.DataFrame({"k": [1], "_commit_version": [3]}))


def test_write_delta_change_data_feed_records_the_query_updates(tmp_path: Path) -> None:
    import microbatch as mb

    table = tmp_path / "t"
    rows = pl.DataFrame({"k": ["a", "b", "a", "b", "a"], "x": [1, 2, 3, 4, 5]})
    query = (
        mb.read_memory(rows, max_records_per_batch=2)
        .group_by("k").agg(pl.col("x").sum())
        .write_delta(table, output_mode="update", change_data_feed=True)
        .start(checkpoint=str(tmp_path / "chk"), trigger="available-now")
    )
    assert query.await_termination()
    config = DeltaTable(str(table)).metadata().configuration
    assert config["delta.enableChangeDataFeed"] == "true"
    feed = pl.DataFrame(pa.table(DeltaTable(str(table)).load_cdf(starting_version=0).read_all()))
    # the last postimage or insert of each key is the one-shot result
    last = (feed.filter(pl.col("_change_type") != "update_preimage")
            .sort("_commit_version").unique("k", keep="last").select("k", "x").sort("k"))
    assert_frame_equal(last, rows.group_by("k").agg(pl.col("x").sum()).sort("k"))
