"""DeltaSink: exactly once per batch id through app transactions, under crashes,
replays and concurrent writers; schema checks; modes; compaction."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import polars as pl
import pytest
from delta_helpers import operations
from deltalake import DeltaTable
from polars.testing import assert_frame_equal

import microbatch as mb
from microbatch.engine.faults import InjectedFault
from microbatch.sources.generator import GeneratorSource
from sinks.base import SinkContext
from sinks.delta import DeltaSink
from sinks.exceptions import SinkConfigError, SinkError

pytestmark = pytest.mark.delta

ROOT = Path(__file__).resolve().parents[2]
PARAMS = {"total_rows": 12_000, "rows_per_second": None, "seed": 5, "cards": 50,
          "max_records_per_batch": 2_000, "start": "2026-01-01T00:00:00+00:00"}
BATCHES = 6
POINTS = ["after_write_ahead", "after_execute", "sink.after_commit", "after_sink", "after_commit"]


def all_rows() -> pl.DataFrame:
    source = GeneratorSource(**PARAMS)
    start = source.initial_offset()
    return source.read(start, source.latest_offset(start, capped=False)).data


def append_stream() -> mb.Stream:
    return (mb.generate(**PARAMS).filter(pl.col("amount") > 20)
            .select("event_id", "card_id", "amount", "event_time"))


def expected_append() -> pl.DataFrame:
    return (all_rows().filter(pl.col("amount") > 20)
            .select("event_id", "card_id", "amount", "event_time")
            .with_columns(pl.col("event_time").dt.cast_time_unit("us")).sort("event_id"))


def update_stream() -> mb.Stream:
    return (mb.generate(**PARAMS)
            .group_by(mb.window("event_time", "1m"), "card_id")
            .agg(pl.len().alias("n"), pl.col("amount").sum().alias("total")))


def expected_update() -> pl.DataFrame:
    return (
        all_rows()
        .group_by(pl.col("event_time").dt.truncate("1m").alias("window_start"), "card_id")
        .agg(pl.len().cast(pl.Int64).alias("n"), pl.col("amount").sum().alias("total"))
        .with_columns(
            pl.col("window_start").dt.cast_time_unit("us"),
            (pl.col("window_start") + pl.duration(minutes=1)).dt.cast_time_unit("us")
            .alias("window_end"),
        )
        .select("window_start", "window_end", "card_id", "n", "total")
        .sort("window_start", "card_id")
    )


def read_table(path: Path) -> pl.DataFrame:
    return pl.read_delta(str(path))


def opened(path: Path | str, query_id: str = "q1", mode: str = "append",
           keys: tuple[str, ...] = (), fault=None, **options) -> DeltaSink:
    sink = DeltaSink(path, **options)
    sink.open(SinkContext(query_id=query_id, output_mode=mode,  # type: ignore[arg-type]
                          key_columns=keys, fault_point=fault))
    return sink


# --------------------------------------------------------------- crash at every step


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("mode", ["append", "update"])
def test_crash_at_every_step_then_restart_is_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str, mode: str
) -> None:
    table, chk = tmp_path / "table", tmp_path / "chk"
    stream = append_stream() if mode == "append" else update_stream()

    def start() -> mb.StreamingQuery:
        return stream.write_delta(table, output_mode=mode).start(chk, trigger="available-now")

    monkeypatch.setenv("MICROBATCH_FAULT", f"{point}@2")
    monkeypatch.setenv("MICROBATCH_FAULT_ACTION", "raise")
    query = start()
    with pytest.raises(mb.QueryTerminatedError):
        query.await_termination(60)
    assert isinstance(query.exception, InjectedFault)
    monkeypatch.delenv("MICROBATCH_FAULT")
    assert start().await_termination(60)

    got = read_table(table)
    if mode == "append":
        assert_frame_equal(got.sort("event_id"), expected_append())
    else:
        assert_frame_equal(got.sort("window_start", "card_id"), expected_update(),
                           check_exact=False)
    ops = operations(str(table))
    assert ops.count("CREATE TABLE") == 1
    assert ops.count("WRITE" if mode == "append" else "MERGE") == BATCHES
    assert len(ops) == BATCHES + 1
    assert DeltaTable(str(table)).transaction_version(_query_id(chk)) == BATCHES - 1


def test_replayed_batch_after_delta_commit_is_skipped(tmp_path: Path) -> None:
    """The sink alone: the crash window between the Delta commit and commits/N."""
    sink = opened(tmp_path / "t")
    df = pl.DataFrame({"id": [1, 2, 3]})
    sink.add_batch(0, df)
    assert not sink.last_commit["skipped"]
    again = opened(tmp_path / "t")  # a restarted process
    again.add_batch(0, df)
    assert again.last_commit["skipped"]
    assert read_table(tmp_path / "t").height == 3
    assert DeltaTable(str(tmp_path / "t")).transaction_version("q1") == 0
    again.add_batch(1, df)
    again.add_batch(0, df)  # an older batch id is never written again either
    assert read_table(tmp_path / "t").height == 6
    assert operations(str(tmp_path / "t")) == ["CREATE TABLE", "WRITE", "WRITE"]


JOB = """
import polars as pl
import microbatch as mb

def build(params):
    return (mb.generate(total_rows=12_000, rows_per_second=None, seed=5, cards=50,
                        max_records_per_batch=2_000, start="2026-01-01T00:00:00+00:00")
            .filter(pl.col("amount") > 20)
            .select("event_id", "card_id", "amount", "event_time")
            .write_delta(params["output"]))
"""


def test_sigkill_right_after_the_delta_commit(tmp_path: Path) -> None:
    """A real process killed (SIGKILL) between the Delta commit and commits/N."""
    job = tmp_path / "job.py"
    job.write_text(JOB)
    table, chk = tmp_path / "table", tmp_path / "chk"
    cmd = [sys.executable, "-m", "microbatch.cli", "run", str(job), "--checkpoint", str(chk),
           "--trigger", "available-now", "--param", f"output={table}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROBATCH_FAULT")}
    killed = subprocess.run(cmd, env={**env, "MICROBATCH_FAULT": "sink.after_commit@3"},
                            capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert killed.returncode == -9, killed.stderr
    assert DeltaTable(str(table)).transaction_version(_query_id(chk)) == 3
    assert not (chk / "commits" / "3").exists()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd=ROOT,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert_frame_equal(read_table(table).sort("event_id"), expected_append())
    assert operations(str(table)).count("WRITE") == BATCHES


def _query_id(chk: Path) -> str:
    from microbatch.checkpoint import Checkpoint

    return Checkpoint(chk).read_metadata()["query_id"]


# ------------------------------------------------------------------ concurrent writers


def test_two_writers_with_the_same_app_id_racing_land_one_copy(tmp_path: Path) -> None:
    """Both see batch 1 missing, both commit at once: one wins, the other
    conflicts, reloads, and finds batch 1 there."""
    path = tmp_path / "t"
    opened(path).add_batch(0, pl.DataFrame({"id": [0]}))
    barrier = threading.Barrier(2, timeout=30)

    def meet(name: str, batch_id: int) -> None:
        if name == "sink.before_commit":
            barrier.wait()

    sinks = [opened(path, fault=meet) for _ in range(2)]
    errors: list[BaseException] = []

    def write(sink: DeltaSink) -> None:
        try:
            sink.add_batch(1, pl.DataFrame({"id": [1, 2]}))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(s,)) for s in sinks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert read_table(path).sort("id")["id"].to_list() == [0, 1, 2]
    outcomes = sorted((s.last_commit["skipped"], s.last_commit["attempts"]) for s in sinks)
    assert outcomes == [(False, 1), (True, 2)]


RACER = """
import sys, polars as pl
from sinks.base import SinkContext
from sinks.delta import DeltaSink
sink = DeltaSink(sys.argv[1])
sink.open(SinkContext(query_id="shared"))
for b in range(int(sys.argv[2])):
    sink.add_batch(b, pl.DataFrame({"batch": [b] * 3, "row": [0, 1, 2]}))
"""


def test_two_processes_with_the_same_app_id_write_each_batch_once(tmp_path: Path) -> None:
    path = tmp_path / "t"
    opened(path, query_id="shared").add_batch(0, pl.DataFrame({"batch": [0] * 3,
                                                               "row": [0, 1, 2]}))
    batches = 12
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(path), str(batches)], cwd=ROOT,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    got = read_table(path)
    assert got.height == batches * 3
    assert got.select("batch", "row").n_unique() == batches * 3
    assert operations(str(path)).count("WRITE") == batches


# ---------------------------------------------------------------------------- schema


def test_schema_mismatch_is_refused_before_writing(tmp_path: Path) -> None:
    path = tmp_path / "t"
    sink = opened(path)
    sink.add_batch(0, pl.DataFrame({"id": [1], "name": ["a"]}))
    version = DeltaTable(str(path)).version()
    bad = pl.DataFrame({"id": ["x"], "extra": [1.5]})
    with pytest.raises(SinkError) as info:
        sink.add_batch(1, bad)
    message = str(info.value)
    for part in ("batch 1", "'id' has type string in the batch but long in the table",
                 "'name' (string) is in the table but not in the batch",
                 "'extra' (double) is in the batch but not in the table", "Nothing was written",
                 "new table"):
        assert part in message
    assert DeltaTable(str(path)).version() == version
    with pytest.raises(SinkError, match="schema_mode='merge'"):
        sink.add_batch(1, pl.DataFrame({"id": [2], "name": ["b"], "extra": [1.5]}))


def test_schema_merge_adds_columns_and_fills_missing_ones(tmp_path: Path) -> None:
    path = tmp_path / "t"
    sink = opened(path, schema_mode="merge")
    sink.add_batch(0, pl.DataFrame({"id": [1], "name": ["a"]}))
    sink.add_batch(1, pl.DataFrame({"id": [2], "name": ["b"], "score": [0.5]}))
    sink.add_batch(2, pl.DataFrame({"id": [3], "score": [0.7]}))
    got = read_table(path).sort("id")
    assert got.columns == ["id", "name", "score"]
    assert got.rows() == [(1, "a", None), (2, "b", 0.5), (3, None, 0.7)]
    with pytest.raises(SinkError, match="does not change a column's type"):
        sink.add_batch(3, pl.DataFrame({"id": ["four"]}))


def test_types_delta_cannot_hold_are_converted_or_refused(tmp_path: Path) -> None:
    path = tmp_path / "t"
    sink = opened(path)
    df = pl.DataFrame({"n": pl.Series([1, 2], dtype=pl.UInt32),
                       "c": pl.Series(["x", "y"], dtype=pl.Categorical),
                       "t": pl.Series(["2026-01-01 10:00"]).str.to_datetime(time_unit="ms")
                       .dt.replace_time_zone("Europe/Paris").extend_constant(None, 1)})
    sink.add_batch(0, df)
    got = read_table(path)
    assert got.schema == pl.Schema({"n": pl.Int64, "c": pl.String,
                                    "t": pl.Datetime("us", "UTC")})
    assert got["t"][0].isoformat() == "2026-01-01T09:00:00+00:00"
    with pytest.raises(SinkError, match="'d' has type Duration"):
        sink.add_batch(1, pl.DataFrame({"d": pl.Series([1], dtype=pl.Duration("us"))}))


# ----------------------------------------------------------------------------- modes


def test_update_mode_merges_by_keys_with_null_keys(tmp_path: Path) -> None:
    path = tmp_path / "t"
    sink = opened(path, mode="update", keys=("k", "g"))
    sink.add_batch(0, pl.DataFrame({"k": [1, 2, None], "g": ["a", "a", "b"], "v": [1, 2, 3]}))
    sink.add_batch(1, pl.DataFrame({"k": [2, None, 4], "g": ["a", "b", "c"], "v": [20, 30, 4]}))
    sink.add_batch(1, pl.DataFrame({"k": [9], "g": ["z"], "v": [9]}))  # replay: no-op
    got = read_table(path).sort("v")
    assert got.rows() == [(1, "a", 1), (4, "c", 4), (2, "a", 20), (None, "b", 30)]
    assert operations(str(path)).count("MERGE") == 2
    with pytest.raises(SinkError, match="merge key value"):
        sink.add_batch(2, pl.DataFrame({"k": [5, 5], "g": ["a", "a"], "v": [1, 2]}))


def test_update_mode_needs_keys(tmp_path: Path) -> None:
    with pytest.raises(mb.PlanError, match="merge_keys"):
        mb.read_memory(schema={"x": pl.Int64}).write_delta(tmp_path / "t", output_mode="update")
    with pytest.raises(SinkConfigError, match="merge_keys"):
        opened(tmp_path / "t", mode="update")


def test_complete_mode_overwrites_with_the_whole_result(tmp_path: Path) -> None:
    path = tmp_path / "t"
    src = mb.read_memory(schema={"card": pl.Int64, "amount": pl.Float64})
    query = (src.group_by("card").agg(pl.col("amount").sum())
             .write_delta(path, output_mode="complete").start(tmp_path / "chk"))
    src.add({"card": [1, 2, 1], "amount": [1.0, 2.0, 3.0]})
    query.process_all_available()
    src.add({"card": [2, 3], "amount": [5.0, 1.0]})
    query.process_all_available()
    query.stop()
    assert read_table(path).sort("card").rows() == [(1, 4.0), (2, 7.0), (3, 1.0)]
    assert operations(str(path))[1:] == ["WRITE", "WRITE"]


def test_partitioned_table_and_partitioning_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "t"
    sink = opened(path, partition_by=["day"])
    sink.add_batch(0, pl.DataFrame({"day": ["d1", "d2", "d1"], "v": [1, 2, 3]}))
    assert DeltaTable(str(path)).metadata().partition_columns == ["day"]
    assert sorted(read_table(path)["v"].to_list()) == [1, 2, 3]
    with pytest.raises(SinkConfigError, match="partitioned by"):
        opened(path, partition_by=["v"])
    opened(path).add_batch(1, pl.DataFrame({"day": ["d3"], "v": [4]}))  # keeps the table's


def test_optimize_every_compacts_small_files(tmp_path: Path) -> None:
    path = tmp_path / "t"
    sink = opened(path, optimize_every=5)
    for b in range(10):
        sink.add_batch(b, pl.DataFrame({"b": [b] * 10, "i": list(range(10))}))
    ops = operations(str(path))
    assert ops.count("OPTIMIZE") == 2
    assert ops.count("WRITE") == 10
    table = DeltaTable(str(path))
    assert len(table.file_uris()) == 1
    assert read_table(path).height == 100
    assert sink.last_commit["optimize"]["files_removed"] == 6


def test_empty_batches_write_nothing_but_the_first_creates_the_table(tmp_path: Path) -> None:
    path = tmp_path / "t"
    sink = opened(path)
    sink.add_batch(0, pl.DataFrame(schema={"id": pl.Int64}))
    assert read_table(path).schema == pl.Schema({"id": pl.Int64})
    sink.add_batch(1, pl.DataFrame(schema={"id": pl.Int64}))
    assert operations(str(path)) == ["CREATE TABLE"]
    assert "storage" not in str(DeltaSink(path, storage_options={"AWS_SECRET": "s"}).describe())
