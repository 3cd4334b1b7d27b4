"""DeltaSource: the table's versions as a replayable log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from delta_helpers import append_versions, transactions
from deltalake import DeltaTable, write_deltalake
from fault_points import raise_at
from polars.testing import assert_frame_equal

import microbatch as mb
from microbatch.sources.base import SourceContext
from microbatch.sources.delta import DeltaSource

pytestmark = pytest.mark.delta


def replay(path: Path | str, chk: Path, **options) -> pl.DataFrame:
    """Run read_delta(path) to the end (available-now) into a Parquet output."""
    out = chk.parent / f"{chk.name}-out"
    query = mb.read_delta(path, **options).write_parquet(out).start(chk, trigger="available-now")
    assert query.await_termination(60)
    return mb.parquet_table(out)


def opened(path: Path, **options) -> DeltaSource:
    source = DeltaSource(path, **options)
    source.open(SourceContext("0", None))
    return source


def test_replay_from_version_zero_equals_the_table(tmp_path: Path) -> None:
    path = tmp_path / "t"
    frames = [transactions(i * 100, 100) for i in range(6)]
    append_versions(str(path), frames, partition_by=["card_id"])
    got = replay(path, tmp_path / "chk", max_files_per_batch=5)
    want = pl.read_delta(str(path))
    assert got.schema == want.schema
    assert_frame_equal(got.sort("event_id"), want.sort("event_id"))
    # one batch per 5 files, 13 files (one per card) per version
    batches = len(list((tmp_path / "chk" / "commits").iterdir()))
    assert batches == -(-6 * 13 // 5)


def test_offsets_cut_versions_into_files_and_replays_read_the_same_rows(tmp_path: Path) -> None:
    path = tmp_path / "t"
    append_versions(str(path), [transactions(0, 30), transactions(30, 30)],
                    partition_by=["merchant"])
    source = opened(path, max_files_per_batch=3)
    start = source.initial_offset()
    assert start == {"version": 0, "index": 0}
    first = source.latest_offset(start)
    assert first == {"version": 0, "index": 3}
    second = source.latest_offset(first)
    assert second == {"version": 1, "index": 1}  # version 0 has 5 files
    again = DeltaSource(path)  # a new process reading the recorded range
    assert again.read(first, second).data.equals(source.read(first, second).data)
    assert source.latest_offset(start, capped=False) == {"version": 2, "index": 0}
    backlog = source.backlog(start, {"version": 2, "index": 0})
    assert (backlog.versions, backlog.files, backlog.rows) == (2, 10, 60)


def test_new_versions_are_picked_up_incrementally(tmp_path: Path, table_name: str) -> None:
    path = tmp_path / "t"
    append_versions(str(path), [transactions(0, 50)])
    query = mb.read_delta(path).write_memory(table_name).start(tmp_path / "chk")
    try:
        query.process_all_available()
        assert mb.table(table_name).height == 50
        append_versions(str(path), [transactions(50, 20), transactions(70, 5)])
        query.process_all_available()
        assert sorted(mb.table(table_name)["event_id"].to_list()) == list(range(75))
    finally:
        query.stop()


@pytest.mark.parametrize("change", ["delete", "overwrite", "merge"])
def test_a_version_rewriting_data_stops_the_query(tmp_path: Path, change: str) -> None:
    path = tmp_path / "t"
    append_versions(str(path), [transactions(0, 40), transactions(40, 40)])
    table = DeltaTable(str(path))
    if change == "delete":
        table.delete("event_id < 10")
        operation = "DELETE"
    elif change == "overwrite":
        write_deltalake(table, transactions(100, 5).to_arrow(), mode="overwrite")
        operation = "WRITE (mode Overwrite)"
    else:
        (table.merge(transactions(0, 3).with_columns(amount=pl.lit(0.0)).to_arrow(),
                     "t.event_id = s.event_id", source_alias="s", target_alias="t")
         .when_matched_update_all().execute())
        operation = "MERGE"
    append_versions(str(path), [transactions(200, 10)])
    out, chk = tmp_path / "out", tmp_path / "chk"
    query = mb.read_delta(path).write_parquet(out).start(chk, trigger="available-now")
    with pytest.raises(mb.QueryTerminatedError):
        query.await_termination(60)
    error = query.exception
    assert isinstance(error, mb.SourceError)
    assert f"version 2 ({operation})" in str(error)
    assert "ignore_changes=True" in str(error)
    # everything before the rewrite was processed, nothing after it
    assert sorted(mb.parquet_table(out)["event_id"].to_list()) == list(range(80))

    # the failed batch is recorded: the same checkpoint goes on with ignore_changes
    query = (mb.read_delta(path, ignore_changes=True).write_parquet(out)
             .start(chk, trigger="available-now"))
    assert query.await_termination(60)
    rows = mb.parquet_table(out)
    rewritten = sum(f.rows or 0 for f in DeltaSource(path).log_commit(2).files)
    assert rewritten == {"delete": 30, "overwrite": 5, "merge": 40}[change]
    assert rows.height == 80 + rewritten + 10


def test_optimize_commits_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "t"
    append_versions(str(path), [transactions(i * 10, 10) for i in range(8)])
    metrics = DeltaTable(str(path)).optimize.compact()
    assert metrics["numFilesRemoved"] == 8
    append_versions(str(path), [transactions(80, 10)])
    got = replay(path, tmp_path / "chk")
    assert sorted(got["event_id"].to_list()) == list(range(90))


def test_restart_midway_resumes_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t"
    append_versions(str(path), [transactions(i * 25, 25) for i in range(8)])
    out, chk = tmp_path / "out", tmp_path / "chk"

    def start() -> mb.StreamingQuery:
        return (mb.read_delta(path, max_files_per_batch=1).write_parquet(out)
                .start(chk, trigger="available-now"))

    for point in ("after_read@1", "after_sink@4", "after_commit@4"):
        raise_at(monkeypatch, point, start)
    assert start().await_termination(60)
    got = mb.parquet_table(out)
    assert sorted(got["event_id"].to_list()) == list(range(200))


def test_starting_version_and_timestamp(tmp_path: Path) -> None:
    path = tmp_path / "t"
    append_versions(str(path), [transactions(i * 10, 10) for i in range(4)])
    got = replay(path, tmp_path / "c1", starting_version=2)
    assert sorted(got["event_id"].to_list()) == list(range(20, 40))
    stamps = {h["version"]: h["timestamp"] for h in DeltaTable(str(path)).history()}
    at = datetime.fromtimestamp(stamps[3] / 1000, tz=UTC)
    got = replay(path, tmp_path / "c2", starting_timestamp=at)
    assert sorted(got["event_id"].to_list()) == list(range(30, 40))
    later = DeltaSource(path, starting_timestamp=at + timedelta(days=1))
    assert later.initial_offset() == {"version": 4, "index": 0}
    with pytest.raises(mb.SourceError, match="after the table's latest version 3"):
        DeltaSource(path, starting_version=9).initial_offset()
    with pytest.raises(mb.PlanError, match="not both"):
        mb.read_delta(path, starting_version=1, starting_timestamp=at)


def test_schema_evolution_keeps_replays_stable(tmp_path: Path) -> None:
    path = tmp_path / "t"
    append_versions(str(path), [transactions(0, 5)])
    wider = transactions(5, 5).with_columns(country=pl.lit("FR"))
    write_deltalake(str(path), wider.to_arrow(), mode="append", schema_mode="merge")
    source = opened(path)
    first = source.read({"version": 0, "index": 0}, {"version": 1, "index": 0}).data
    assert "country" not in first.columns  # the schema as of version 0
    both = source.read({"version": 0, "index": 0}, {"version": 2, "index": 0}).data
    assert both["country"].to_list() == [None] * 5 + ["FR"] * 5


def test_missing_table_and_vacuumed_file_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(mb.SourceError, match="no Delta table"):
        opened(tmp_path / "nothing")
    path = tmp_path / "t"
    append_versions(str(path), [transactions(0, 5)])
    source = opened(path)
    for file in path.glob("*.parquet"):
        file.unlink()
    with pytest.raises(mb.SourceError, match="removed by VACUUM"):
        source.read({"version": 0, "index": 0}, {"version": 1, "index": 0})


def test_checkpoints_and_cleaned_up_log(tmp_path: Path) -> None:
    """Versions are listed from the JSON commit files, which delta-rs keeps next
    to its checkpoints; a cleaned-up start of the log is a clear error."""
    path = tmp_path / "t"
    append_versions(str(path), [transactions(i * 10, 10) for i in range(12)])
    DeltaTable(str(path)).create_checkpoint()
    assert list((path / "_delta_log").glob("*.checkpoint.parquet"))
    got = replay(path, tmp_path / "c1", max_files_per_batch=4)
    assert sorted(got["event_id"].to_list()) == list(range(120))
    for version in range(6):  # what log cleanup does after the retention
        (path / "_delta_log" / f"{version:020d}.json").unlink()
    with pytest.raises(mb.SourceError, match="log starts at version 6"):
        replay(path, tmp_path / "c2")  # refused when the query starts
    got = replay(path, tmp_path / "c3", starting_version=6)
    assert sorted(got["event_id"].to_list()) == list(range(60, 120))
