"""Delta data files written apart from the sink (as Ray workers do), committed by
the sink as one version: the files' statistics and partition values are the ones
delta-rs writes, the commit is idempotent on the batch id, and the sink says when
it cannot let workers write (the driver then writes). No Ray here: the task runs
in this process, exactly as a worker runs it.
"""

from __future__ import annotations

import json
import string
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st

from sinks.base import SinkContext, WrittenBatch
from sinks.delta import DeltaSink
from sinks.delta_files import DeltaWriteTask, delta_stats
from sinks.exceptions import SinkError

pytestmark = pytest.mark.delta


def opened(path: Path | str, mode: str = "append", **options: object) -> DeltaSink:
    sink = DeltaSink(path, **options)  # type: ignore[arg-type]
    sink.open(SinkContext(query_id="q1", output_mode=mode))  # type: ignore[arg-type]
    return sink


def frame(n: int = 6, offset: int = 0) -> pl.DataFrame:
    base = datetime(2026, 1, 1, 1, 2, 3, 4000, tzinfo=UTC)
    return pl.DataFrame({
        "p": ["x y", "a/b", "c%d", None, "é", ""][:n],
        "d": [date(2026, 1, 1 + i % 2) for i in range(n)],
        "ts": [base + timedelta(milliseconds=i) for i in range(n)],
        "flag": [i % 3 == 0 for i in range(n)],
        "v": [offset + i for i in range(n)],
        "amount": [0.5 * i if i != 2 else float("nan") for i in range(n)],
        "label": [f"row-{i}" if i != 1 else None for i in range(n)],
    }).with_columns(pl.col("ts").cast(pl.Datetime("us", "UTC")))


def written(task: DeltaWriteTask, *parts: pl.DataFrame) -> WrittenBatch:
    files = [f for i, part in enumerate(parts) for f in task.write(part, i)]
    return WrittenBatch.gather(files, where="test")


def _adds(table: Path, version: int) -> list[dict[str, object]]:
    entry = (table / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line)["add"] for line in entry.splitlines() if '"add"' in line]


def _app_version(table: Path, version: int) -> int | None:
    entry = (table / "_delta_log" / f"{version:020d}.json").read_text()
    txns = [json.loads(line)["txn"] for line in entry.splitlines() if '"txn"' in line]
    return txns[0]["version"] if txns else None


def test_partitioned_files_read_back_as_delta_rs_writes_them(tmp_path: Path) -> None:
    """Odd partition values (space, slash, percent, null, non-ASCII, empty string, a
    date, a timestamp): the same directories and partition values as delta-rs's own
    write, the same rows back, and a filter on a partition value prunes to its files."""
    ref, table = tmp_path / "ref", tmp_path / "table"
    cols = ["p", "d", "ts"]
    write_deltalake(str(ref), frame().to_arrow(), partition_by=cols)
    sink = opened(table, partition_by=cols)
    sink.add_batch(0, frame())  # the driver creates the table (partition types unknown before)
    task = sink.distributed_writer(1)
    assert isinstance(task, DeltaWriteTask)
    sink.commit_files(1, written(task, frame(offset=10)[:3], frame(offset=10)[3:]))
    assert DeltaTable(str(table)).transaction_version("q1") == 1
    got = pl.read_delta(str(table)).sort("v")
    want = pl.concat([frame(), frame(offset=10)]).sort("v")
    assert got.equals(want)
    last = DeltaTable(str(table)).version()
    assert _app_version(table, last) == 1, "the workers' batch is the last version"
    ours = {(json.dumps(a["partitionValues"], sort_keys=True), str(a["path"]).rsplit("/", 1)[0])
            for a in _adds(table, last)}
    theirs = {(json.dumps(a["partitionValues"], sort_keys=True),
               str(a["path"]).rsplit("/", 1)[0]) for a in _adds(ref, 0)}
    assert ours == theirs
    dt = DeltaTable(str(table))
    assert dt.to_pyarrow_table(filters=[("p", "=", "a/b")]).num_rows == 2
    assert dt.to_pyarrow_table(filters=[("p", "=", "x y")]).num_rows == 2


def test_stats_equal_delta_rs_for_the_same_rows(tmp_path: Path) -> None:
    df = frame().drop("p", "d", "ts").with_columns(
        pl.datetime(2026, 1, 1, time_zone="UTC").dt.cast_time_unit("us").alias("t"),
        pl.Series("x", [3, None, 1, 2, None, 5], dtype=pl.Int32),
    )
    write_deltalake(str(tmp_path / "ref"), df.to_arrow())
    adds = _adds(tmp_path / "ref", 0)
    assert len(adds) == 1
    assert json.loads(str(adds[0]["stats"])) == json.loads(delta_stats(df))


@settings(max_examples=30, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.integers(-(2**40), 2**40)), min_size=1,
                       max_size=40),
       texts=st.lists(st.text(string.printable + "éß", max_size=80), min_size=1, max_size=40),
       micros=st.lists(st.integers(0, 10**12), min_size=1, max_size=40))
def test_stats_bounds_hold_for_every_row(
    values: list[int | None], texts: list[str], micros: list[int]
) -> None:
    """Whatever the rows: min <= every value <= max as a reader compares them (strings
    cut to a prefix, timestamps at millisecond precision), null counts exact."""
    n = min(len(values), len(texts), len(micros))
    df = pl.DataFrame({
        "i": pl.Series(values[:n], dtype=pl.Int64), "s": texts[:n],
        "t": pl.Series(micros[:n], dtype=pl.Int64).cast(pl.Datetime("us")),
    })
    stats = json.loads(delta_stats(df))
    assert stats["numRecords"] == n
    assert stats["nullCount"]["i"] == df["i"].null_count()
    if df["i"].drop_nulls().len():
        assert stats["minValues"]["i"] == df["i"].min()
        assert stats["maxValues"]["i"] == df["i"].max()
    assert stats["minValues"]["s"] <= min(texts[:n])
    if "s" in stats["maxValues"]:
        assert stats["maxValues"]["s"] == max(texts[:n])
    lo = datetime.fromisoformat(stats["minValues"]["t"])
    hi = datetime.fromisoformat(stats["maxValues"]["t"])
    assert lo <= df["t"].min() <= df["t"].max() <= hi  # type: ignore[operator]
    assert hi - df["t"].max() < timedelta(milliseconds=1)  # type: ignore[operator]


def test_a_replayed_commit_is_a_no_op_and_its_files_stay_unreferenced(tmp_path: Path) -> None:
    table = tmp_path / "t"
    sink = opened(table)
    task = sink.distributed_writer(0)
    assert task is not None
    sink.commit_files(0, written(task, frame()[:3], frame()[3:]))
    again = written(task, frame())  # a re-run after a crash past the commit
    sink.commit_files(0, again)
    dt = DeltaTable(str(table))
    assert dt.version() == 1  # CREATE TABLE, then one version for batch 0
    assert sink.skipped_batches == 1
    assert pl.read_delta(str(table)).sort("v").equals(frame().sort("v"))
    referenced = {Path(u).name for u in dt.file_uris()}
    assert {f.path for f in again.files}.isdisjoint(referenced)
    assert all((table / f.path).exists() for f in again.files)
    # a full VACUUM finds them (delta-rs's default "lite" VACUUM only removes files the
    # log removed: it never sees files no commit ever added)
    lite = dt.vacuum(retention_hours=0, dry_run=True, enforce_retention_duration=False)
    assert lite == []
    found = dt.vacuum(retention_hours=0, dry_run=True, enforce_retention_duration=False,
                      full=True)
    assert {Path(f).name for f in found} == {f.path for f in again.files}


def test_a_schema_change_is_refused_before_the_commit(tmp_path: Path) -> None:
    table = tmp_path / "t"
    sink = opened(table)
    task = sink.distributed_writer(0)
    assert task is not None
    sink.commit_files(0, written(task, frame()))
    task = sink.distributed_writer(1)
    assert task is not None
    changed = written(task, frame().with_columns(pl.col("v").cast(pl.String)))
    with pytest.raises(SinkError, match="Nothing was committed"):
        sink.commit_files(1, changed)
    assert DeltaTable(str(table)).transaction_version("q1") == 0


@pytest.mark.parametrize(("mode", "options"), [
    ("update", {"merge_keys": "v"}),
    ("append", {"schema_mode": "merge"}),
    ("append", {"partition_by": "p"}),  # before the table exists
])
def test_the_driver_writes_what_workers_cannot(
    tmp_path: Path, mode: str, options: dict[str, object]
) -> None:
    assert opened(tmp_path / "t", mode, **options).distributed_writer(0) is None


def test_a_table_with_a_check_constraint_is_written_by_the_driver(tmp_path: Path) -> None:
    write_deltalake(str(tmp_path / "t"), frame().select("v").to_arrow())
    DeltaTable(str(tmp_path / "t")).alter.add_constraint({"v_positive": "v >= 0"})
    assert opened(tmp_path / "t").distributed_writer(0) is None
    assert opened(tmp_path / "t2").distributed_writer(0) is not None


def test_stats_cover_the_columns_the_table_asks_for(tmp_path: Path) -> None:
    """``delta.dataSkippingNumIndexedCols``: the workers' files carry statistics for
    that many leading columns, as delta-rs's own files do."""
    df = frame().select("v", "amount", "label")
    write_deltalake(str(tmp_path / "t"), df.to_arrow(),
                    configuration={"delta.dataSkippingNumIndexedCols": "1"})
    sink = opened(tmp_path / "t")
    task = sink.distributed_writer(1)
    assert isinstance(task, DeltaWriteTask)
    assert task.indexed_columns == 1
    sink.commit_files(1, written(task, df))
    last = DeltaTable(str(tmp_path / "t")).version()  # after the writer registry's commit
    ours, theirs = _adds(tmp_path / "t", last)[0], _adds(tmp_path / "t", 0)[0]
    assert json.loads(str(ours["stats"])) == json.loads(str(theirs["stats"]))
    assert set(json.loads(str(ours["stats"]))["nullCount"]) == {"v"}
