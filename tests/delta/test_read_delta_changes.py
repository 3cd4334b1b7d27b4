"""read_delta(changes=True): a Delta table's Change Data Feed as a changelog stream.

The oracles: deltalake's own one-shot ``DeltaTable.load_cdf()`` for the change
rows, and the table's final state (``DeltaTable.to_pyarrow_table()``) for what
applying the changes in order to an empty table must give.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

import microbatch as mb
from microbatch.engine.faults import InjectedFault
from microbatch.sources.base import SourceContext
from microbatch.sources.delta_changes import DeltaChangesSource

pytestmark = pytest.mark.delta

CDF = {"delta.enableChangeDataFeed": "true"}
TABLE = ["id", "region", "amount"]
CHANGE = ["_change_type", "_commit_version", "_commit_timestamp"]
_names = itertools.count()


def rows(ids: range | list[int], *, amount: float = 1.0) -> pa.Table:
    ids = list(ids)
    return pl.DataFrame(
        {"id": ids, "region": [f"r{i % 3}" for i in ids],
         "amount": [amount * (i + 1) for i in ids]},
        schema={"id": pl.Int64, "region": pl.String, "amount": pl.Float64},
    ).to_arrow()


def merge(path: Path, source: pa.Table, *, delete_matched: bool = False) -> None:
    builder = DeltaTable(str(path)).merge(
        source, "t.id = s.id", source_alias="s", target_alias="t"
    )
    builder = (builder.when_matched_delete() if delete_matched
               else builder.when_matched_update_all())
    builder.when_not_matched_insert_all().execute()


def build_history(path: Path) -> list[str]:
    """A partitioned CDF table: appends, MERGE (insert + update), UPDATE, DELETE,
    a compaction, a MERGE that deletes, a whole-partition DELETE; the operations."""
    write_deltalake(str(path), rows(range(12)), partition_by=["region"], configuration=CDF)
    write_deltalake(str(path), rows(range(12, 18)), mode="append")  # 1
    merge(path, rows([2, 5, 30, 31], amount=10.0))  # 2: update 2 and 5, insert 30, 31
    DeltaTable(str(path)).update(updates={"amount": "amount + 100"}, predicate="id < 4")  # 3
    DeltaTable(str(path)).delete("id = 7 OR id = 13")  # 4
    write_deltalake(str(path), rows(range(40, 44)), mode="append")  # 5
    DeltaTable(str(path)).optimize.compact()  # 6: no data change
    merge(path, rows([0, 41, 50]), delete_matched=True)  # 7: delete 0 and 41, insert 50
    DeltaTable(str(path)).delete("region = 'r1'")  # 8: whole files of one partition
    write_deltalake(str(path), rows([60, 61]), mode="append")  # 9
    history = DeltaTable(str(path)).history()
    return [h["operation"] for h in sorted(history, key=lambda h: h["version"])]


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cdf") / "t"
    operations = build_history(path)
    assert operations == ["WRITE", "WRITE", "MERGE", "UPDATE", "DELETE", "WRITE", "OPTIMIZE",
                          "MERGE", "DELETE", "WRITE"]
    return path


def load_cdf(path: Path, starting_version: int = 0) -> pl.DataFrame:
    """deltalake's one-shot read of the feed, in our column types."""
    reader = DeltaTable(str(path)).load_cdf(starting_version=starting_version)
    frame = pl.from_arrow(pa.RecordBatchReader.from_stream(reader).read_all())
    assert isinstance(frame, pl.DataFrame)
    return frame.select(
        pl.col("id"), pl.col("region").cast(pl.String), pl.col("amount"),
        pl.col("_change_type").cast(pl.String), pl.col("_commit_version").cast(pl.Int64),
        pl.col("_commit_timestamp").dt.replace_time_zone("UTC"),
    )


def apply_changes(changes: pl.DataFrame) -> pl.DataFrame:
    """The oracle: apply every version's changes in order to an empty table, as a
    multiset of rows (no key needed): preimages and deletes must be present and
    are removed, then postimages and inserts are added."""
    state = pl.DataFrame(schema=changes.select(TABLE).schema)
    for version in changes["_commit_version"].unique(maintain_order=True).to_list():
        step = changes.filter(pl.col("_commit_version") == version)
        kind = pl.col("_change_type")
        gone = step.filter(kind.is_in(["delete", "update_preimage"])).select(TABLE)
        missing = gone.join(state, on=TABLE, how="anti", nulls_equal=True)
        assert missing.is_empty(), f"version {version} removes rows the table lacks"
        state = state.join(gone, on=TABLE, how="anti", nulls_equal=True)
        state = pl.concat([state, step.filter(kind.is_in(["insert", "update_postimage"]))
                           .select(TABLE)])
    return state


def final_state(path: Path) -> pl.DataFrame:
    frame = pl.from_arrow(DeltaTable(str(path)).to_pyarrow_table())
    assert isinstance(frame, pl.DataFrame)
    return frame.select(pl.col("id"), pl.col("region").cast(pl.String), pl.col("amount"))


def stream_changes(path: Path, chk: Path, **options: object) -> pl.DataFrame:
    name = f"cdf{next(_names)}"
    query = (mb.read_delta(path, changes=True, **options)  # type: ignore[arg-type]
             .write_memory(name).start(chk, trigger="available-now"))
    assert query.await_termination(60)
    return mb.table(name)


def by_rows(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.sort([*TABLE, *CHANGE])


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cap=st.one_of(st.none(), st.integers(1, 6)), start=st.sampled_from([0, 0, 2, 5]))
def test_stream_equals_load_cdf_and_applies_to_the_table(
    table: Path, tmp_path_factory: pytest.TempPathFactory, cap: int | None, start: int
) -> None:
    got = stream_changes(table, tmp_path_factory.mktemp("chk"), max_files_per_batch=cap,
                         starting_version=start)
    assert got.columns == [*TABLE, *CHANGE]
    assert got.schema == mb.read_delta(table, changes=True).schema
    # (a) the same change rows as deltalake's one-shot read
    assert_frame_equal(by_rows(got), by_rows(load_cdf(table, start)))
    # versions in order; within one, deletes, preimages, postimages, inserts
    order = {"delete": 0, "update_preimage": 1, "update_postimage": 2, "insert": 3}
    rank = got.select(pl.col("_commit_version"),
                      pl.col("_change_type").replace_strict(order, return_dtype=pl.Int8))
    assert rank.equals(rank.sort(["_commit_version", "_change_type"]))
    if start == 0:
        # (b) applied in order to an empty table, the feed gives the table
        assert_frame_equal(apply_changes(got).sort("id"), final_state(table).sort("id"))


def test_every_kind_of_change_is_read(table: Path, tmp_path: Path) -> None:
    got = stream_changes(table, tmp_path / "chk")
    kinds = got.group_by("_commit_version").agg(pl.col("_change_type").unique().sort())
    seen = dict(zip(kinds["_commit_version"].to_list(), kinds["_change_type"].to_list(),
                    strict=True))
    assert seen[2] == ["insert", "update_postimage", "update_preimage"]
    assert seen[3] == ["update_postimage", "update_preimage"]
    assert seen[4] == ["delete"]
    assert seen[8] == ["delete"]  # whole files removed: no cdc files, removes read
    assert seen[7] == ["delete", "insert"]
    assert 6 not in seen  # compaction changes nothing
    updated = got.filter(pl.col("_commit_version") == 3, pl.col("id") == 2).sort("_change_type")
    assert updated["amount"].to_list() == [130.0, 30.0]  # postimage, preimage


def test_batches_hold_whole_versions(table: Path) -> None:
    source = DeltaChangesSource(table, max_files_per_batch=1)
    source.open(SourceContext("0", None))
    start = source.initial_offset()
    ends = []
    while (end := source.latest_offset(start)) != start:
        ends.append(end["version"])
        assert end["index"] == 0
        start = end
    # one batch per version with changes; the compaction (6) rides with version 7
    assert ends == [1, 2, 3, 4, 5, 6, 8, 9, 10]
    again = DeltaChangesSource(table)  # another process reads the recorded range alike
    first, last = {"version": 2, "index": 0}, {"version": 8, "index": 0}
    assert again.read(first, last).data.equals(source.read(first, last).data)
    backlog = source.backlog({"version": 0, "index": 0}, {"version": 10, "index": 0})
    assert backlog.versions == 9


def test_restart_midway_gives_the_same_output(
    table: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run(out: Path, chk: Path) -> mb.StreamingQuery:
        return (mb.read_delta(table, changes=True, max_files_per_batch=2).write_parquet(out)
                .start(chk, trigger="available-now"))

    assert run(tmp_path / "once", tmp_path / "chk-once").await_termination(60)
    out, chk = tmp_path / "out", tmp_path / "chk"
    for point in ("after_read", "after_sink", "after_commit"):
        monkeypatch.setenv("MICROBATCH_FAULT", f"{point}@{ {'after_read': 1}.get(point, 3)}")
        monkeypatch.setenv("MICROBATCH_FAULT_ACTION", "raise")
        query = run(out, chk)
        with pytest.raises(mb.QueryTerminatedError):
            query.await_termination(60)
        assert isinstance(query.exception, InjectedFault)
    monkeypatch.delenv("MICROBATCH_FAULT")
    assert run(out, chk).await_termination(60)
    got, want = mb.parquet_table(out), mb.parquet_table(tmp_path / "once")
    assert_frame_equal(got, want)
    assert_frame_equal(by_rows(got), by_rows(load_cdf(table)))


def test_a_version_without_the_feed_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "plain"
    write_deltalake(str(path), rows(range(5)))  # 0: no CDF, an append: readable
    write_deltalake(str(path), rows(range(5, 8)), mode="append")  # 1
    DeltaTable(str(path)).delete("id = 1")  # 2: no feed
    DeltaTable(str(path)).alter.set_table_properties(CDF)  # 3
    merge(path, rows([2, 9], amount=5.0))  # 4: with a feed
    name = f"cdf{next(_names)}"
    query = (mb.read_delta(path, changes=True).write_memory(name)
             .start(tmp_path / "chk", trigger="available-now"))
    with pytest.raises(mb.QueryTerminatedError):
        query.await_termination(60)
    error = query.exception
    assert isinstance(error, mb.ChangeDataFeedError)
    assert isinstance(error, mb.SourceError)
    assert "version 2 (DELETE)" in str(error)
    assert "delta.enableChangeDataFeed = true" in str(error)
    assert "set_table_properties" in str(error)
    # the appends before it were read, as inserts
    got = mb.table(name)
    assert got["id"].sort().to_list() == list(range(8))
    assert set(got["_change_type"]) == {"insert"}
    # from the version that turned the feed on, the stream goes on
    after = stream_changes(path, tmp_path / "chk2", starting_version=3)
    assert_frame_equal(by_rows(after), by_rows(load_cdf(path, 3)))
    assert set(after["_change_type"]) == {"insert", "update_preimage", "update_postimage"}


def test_the_schema_is_known_when_the_query_is_built(table: Path, tmp_path: Path) -> None:
    stream = mb.read_delta(table, changes=True)
    assert stream.schema == pl.Schema({
        "id": pl.Int64, "region": pl.String, "amount": pl.Float64,
        "_change_type": pl.String, "_commit_version": pl.Int64,
        "_commit_timestamp": pl.Datetime("ms", "UTC"),
    })
    with pytest.raises(mb.UnknownColumnError):
        stream.select("_change_kind")
    # stateless steps carry _change_type through
    deletes = stream_changes_of(
        stream.filter(pl.col("_change_type") == "delete").select("id", "_change_type"),
        tmp_path / "chk",
    )
    want = load_cdf(table).filter(pl.col("_change_type") == "delete")
    assert sorted(deletes["id"].to_list()) == sorted(want["id"].to_list())
    with pytest.raises(mb.PlanError, match="ignore_changes"):
        mb.read_delta(table, changes=True, ignore_changes=True)


def stream_changes_of(stream: mb.Stream, chk: Path) -> pl.DataFrame:
    name = f"cdf{next(_names)}"
    assert stream.write_memory(name).start(chk, trigger="available-now").await_termination(60)
    return mb.table(name)
