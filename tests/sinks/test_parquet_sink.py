"""ParquetSink: exactly-once through the manifest, crash replay, corrupt entries, types."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from sinks.base import OutputMode, SinkContext
from sinks.exceptions import SinkConfigError, SinkError
from sinks.parquet import ParquetSink, committed_files, read_parquet_output


class Crash(Exception):
    """Stands for the process dying at a fault point."""


def crash_at(point: str, batch_id: int):
    def fault_point(name: str, bid: int) -> None:
        if (name, bid) == (point, batch_id):
            raise Crash(f"{name} {bid}")

    return fault_point


def opened(path: Path, ctx: SinkContext | None = None, **options) -> ParquetSink:
    sink = ParquetSink(path, **options)
    sink.open(ctx or SinkContext(query_id="q1"))
    return sink


def frame(start: int, n: int) -> pl.DataFrame:
    return pl.DataFrame({"id": list(range(start, start + n)), "name": [f"r{i}" for i in range(n)]})


def data_files_on_disk(root: Path) -> set[Path]:
    return {p for p in root.rglob("*.parquet") if not p.name.startswith(".")}


def stat_ns(paths: list[Path]) -> dict[Path, tuple[int, int]]:
    return {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in paths}


def test_round_trip_keeps_types(tmp_path):
    df = pl.DataFrame(
        {
            "ts_utc": [dt.datetime(2024, 3, 1, 12, 0, 0, 123000, tzinfo=dt.UTC), None],
            "ts_paris": [dt.datetime(2024, 3, 1, 12, tzinfo=dt.UTC)] * 2,
            "day": [dt.date(2024, 1, 31), dt.date(1970, 1, 1)],
            "s": ["héllo, wörld ✓", None],
            "i8": [-128, 127],
            "u64": [0, 2**64 - 1],
            "i64": [None, -(2**63)],
            "f": [1.5, float("nan")],
            "f32": [float("inf"), -0.0],
            "b": [True, None],
            "li": [[1, 2, None], []],
            "ls": [["a"], None],
        },
        schema_overrides={
            "ts_utc": pl.Datetime("ms", "UTC"),
            "ts_paris": pl.Datetime("us", "Europe/Paris"),
            "i8": pl.Int8,
            "u64": pl.UInt64,
            "f32": pl.Float32,
            "li": pl.List(pl.Int64),
        },
    )
    opened(tmp_path / "out").add_batch(0, df)
    back = read_parquet_output(tmp_path / "out")
    assert back.schema == df.schema
    assert_frame_equal(back, df)


def test_batches_are_appended_in_batch_order_one_file_each(tmp_path):
    out = tmp_path / "out"
    sink = opened(out)
    for batch_id in range(3):
        sink.add_batch(batch_id, frame(batch_id * 10, 4))
    assert read_parquet_output(out)["id"].to_list() == [0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23]
    assert [p.name for p in committed_files(out)] == [
        "part-0000000000-00000.parquet",
        "part-0000000001-00000.parquet",
        "part-0000000002-00000.parquet",
    ]
    assert data_files_on_disk(out) == set(committed_files(out))
    assert not [p for p in out.rglob(".*") if p.is_file()], "temp files left behind"


def test_manifest_lists_files_rows_sizes_with_a_checksum(tmp_path):
    out = tmp_path / "out"
    opened(out).add_batch(5, frame(0, 3))
    doc = json.loads((out / "_manifest" / "5.json").read_text())
    assert doc["format"] == 1
    body = doc["body"]
    assert body["batch_id"] == 5
    assert body["query_id"] == "q1"
    file = out / "part-0000000005-00000.parquet"
    assert body["files"] == [
        {"path": file.name, "rows": 3, "bytes": file.stat().st_size},
    ]
    assert len(doc["sha256"]) == 64


def test_repeated_batch_id_is_a_noop_content_and_mtimes_unchanged(tmp_path):
    out = tmp_path / "out"
    sink = opened(out)
    sink.add_batch(0, frame(0, 3))
    sink.add_batch(1, frame(10, 3))
    files = [*committed_files(out), *sorted((out / "_manifest").iterdir())]
    before_stat = stat_ns(files)
    before = read_parquet_output(out)

    sink.add_batch(1, frame(10, 3))
    sink.add_batch(1, frame(100, 50))  # different rows: still ignored
    opened(out).add_batch(0, frame(0, 3))  # a restarted sink object

    assert stat_ns(files) == before_stat
    assert_frame_equal(read_parquet_output(out), before)
    assert len(data_files_on_disk(out)) == 2


def test_crash_after_data_then_replay_gives_exactly_one_copy(tmp_path):
    out = tmp_path / "out"
    crashing = opened(out, SinkContext(query_id="q1", fault_point=crash_at("sink.after_data", 1)))
    crashing.add_batch(0, frame(0, 2))
    with pytest.raises(Crash):
        crashing.add_batch(1, frame(10, 3))

    orphan = out / "part-0000000001-00000.parquet"
    assert orphan.exists(), "the crashed attempt left its data file"
    # readers never see the files of a batch without a manifest entry
    assert read_parquet_output(out)["id"].to_list() == [0, 1]
    assert orphan not in committed_files(out)

    restarted = opened(out)  # the recovered query replays batch 1
    restarted.add_batch(1, frame(10, 3))
    restarted.add_batch(1, frame(10, 3))
    assert read_parquet_output(out)["id"].to_list() == [0, 1, 10, 11, 12]
    assert data_files_on_disk(out) == set(committed_files(out))


def test_replay_overwrites_orphans_under_the_same_names(tmp_path):
    out = tmp_path / "out"
    crashing = opened(out, SinkContext(query_id="q1", fault_point=crash_at("sink.after_data", 0)))
    with pytest.raises(Crash):
        crashing.add_batch(0, frame(0, 1000))
    orphan = out / "part-0000000000-00000.parquet"
    orphan_size = orphan.stat().st_size

    opened(out).add_batch(0, frame(0, 2))
    assert committed_files(out) == [orphan]
    assert orphan.stat().st_size != orphan_size
    assert read_parquet_output(out).height == 2


def test_empty_batch_gets_a_manifest_entry_without_files(tmp_path):
    out = tmp_path / "out"
    sink = opened(out)
    empty = pl.DataFrame(schema={"id": pl.Int64, "name": pl.String})
    sink.add_batch(0, empty)
    assert (out / "_manifest" / "0.json").exists()
    assert committed_files(out) == []
    assert_frame_equal(read_parquet_output(out), empty)
    sink.add_batch(0, frame(0, 5))  # replay of the empty batch: a no-op
    assert read_parquet_output(out).height == 0
    sink.add_batch(1, frame(0, 2))
    assert read_parquet_output(out)["id"].to_list() == [0, 1]


def test_reading_an_empty_directory_gives_an_empty_frame(tmp_path):
    assert read_parquet_output(tmp_path).shape == (0, 0)
    opened(tmp_path / "out")
    assert read_parquet_output(tmp_path / "out").shape == (0, 0)
    assert committed_files(tmp_path / "out") == []


def test_reading_a_missing_directory_is_an_error(tmp_path):
    with pytest.raises(SinkError, match="does not exist"):
        read_parquet_output(tmp_path / "nope")


def test_corrupt_manifest_entry_is_an_error_naming_the_file(tmp_path):
    out = tmp_path / "out"
    sink = opened(out)
    sink.add_batch(0, frame(0, 3))
    sink.add_batch(1, frame(3, 3))
    entry = out / "_manifest" / "0.json"
    entry.write_text(entry.read_text().replace('"rows":3', '"rows":4'))

    with pytest.raises(SinkError, match=r"manifest entry .*0\.json fails its checksum"):
        read_parquet_output(out)
    with pytest.raises(SinkError, match=r"0\.json"):
        committed_files(out)
    with pytest.raises(SinkError, match=r"0\.json"):
        sink.add_batch(0, frame(0, 3))


def test_truncated_manifest_entry_is_an_error_naming_the_file(tmp_path):
    out = tmp_path / "out"
    opened(out).add_batch(0, frame(0, 3))
    entry = out / "_manifest" / "0.json"
    entry.write_bytes(entry.read_bytes()[:40])
    with pytest.raises(SinkError, match=r"manifest entry .*0\.json cannot be read as JSON"):
        read_parquet_output(out)
    with pytest.raises(SinkError, match=r"0\.json"):
        opened(out)  # the latest entry is checked on open


def test_manifest_entry_for_another_batch_id_is_an_error(tmp_path):
    out = tmp_path / "out"
    opened(out).add_batch(0, frame(0, 3))
    (out / "_manifest" / "0.json").rename(out / "_manifest" / "7.json")
    with pytest.raises(SinkError, match=r"7\.json does not describe batch 7"):
        read_parquet_output(out)


def test_missing_committed_data_file_is_an_error(tmp_path):
    out = tmp_path / "out"
    opened(out).add_batch(0, frame(0, 3))
    (out / "part-0000000000-00000.parquet").unlink()
    with pytest.raises(SinkError, match=r"part-0000000000-00000\.parquet of committed batch 0"):
        read_parquet_output(out)


@pytest.mark.parametrize("mode", ["update", "complete"])
def test_update_and_complete_modes_are_refused(tmp_path, mode: OutputMode):
    sink = ParquetSink(tmp_path / "out")
    assert sink.supported_modes == ("append", "changelog")
    refused = rf"does not support output_mode='{mode}'; it supports append"
    with pytest.raises(SinkConfigError, match=refused) as info:
        sink.open(SinkContext(query_id="q1", output_mode=mode))
    assert "write_memory" in str(info.value)
    assert "write_delta" in str(info.value)


def test_directory_of_another_query_is_refused(tmp_path):
    out = tmp_path / "out"
    opened(out).add_batch(0, frame(0, 1))
    with pytest.raises(SinkConfigError, match="written by query q1, and this is query q2"):
        opened(out, SinkContext(query_id="q2"))


def test_add_batch_before_open_is_an_error(tmp_path):
    with pytest.raises(SinkError, match="before open"):
        ParquetSink(tmp_path).add_batch(0, frame(0, 1))


def test_bad_options_are_config_errors(tmp_path):
    with pytest.raises(SinkConfigError, match="unknown Parquet compression 'lzma'"):
        ParquetSink(tmp_path, compression="lzma")  # type: ignore[arg-type]
    with pytest.raises(SinkConfigError, match="twice"):
        ParquetSink(tmp_path, partition_by=["a", "a"])
    (tmp_path / "file").write_text("x")
    with pytest.raises(SinkConfigError, match="not a directory"):
        opened(tmp_path / "file")


def test_compression_and_statistics_are_written(tmp_path):
    out = tmp_path / "out"
    opened(out, compression="snappy").add_batch(0, frame(0, 10))
    meta = pq.ParquetFile(committed_files(out)[0]).metadata
    column = meta.row_group(0).column(0)
    assert column.compression == "SNAPPY"
    assert column.statistics is not None
    assert (column.statistics.min, column.statistics.max) == (0, 9)


def test_large_batch_is_one_file(tmp_path):
    out = tmp_path / "out"
    n = 2_000_000
    big = pl.DataFrame({"id": pl.int_range(n, eager=True), "x": pl.int_range(n, eager=True) * 0.5})
    opened(out).add_batch(0, big)
    assert len(committed_files(out)) == 1
    assert read_parquet_output(out).height == n


def test_partition_by_writes_hive_directories_and_reads_back_exact_types(tmp_path):
    out = tmp_path / "out"
    sink = opened(out, partition_by=["country", "day"])
    df = pl.DataFrame(
        {
            "id": [1, 2, 3, 4],
            "country": ["FR", "a/b=c", None, "FR"],
            "day": [dt.date(2024, 1, 1)] * 3 + [dt.date(2024, 1, 2)],
            "amount": [1.0, 2.0, 3.0, 4.0],
        },
        schema_overrides={"id": pl.Int32},
    )
    sink.add_batch(0, df)
    sink.add_batch(1, df.head(1).with_columns(pl.lit(5, pl.Int32).alias("id")))
    rel = sorted(str(p.relative_to(out)) for p in committed_files(out))
    # file numbers follow the sorted partition paths, so a replay reuses the names
    assert rel == [
        "country=FR/day=2024-01-01/part-0000000000-00000.parquet",
        "country=FR/day=2024-01-01/part-0000000001-00000.parquet",
        "country=FR/day=2024-01-02/part-0000000000-00001.parquet",
        "country=__HIVE_DEFAULT_PARTITION__/day=2024-01-01/part-0000000000-00002.parquet",
        "country=a%2Fb%3Dc/day=2024-01-01/part-0000000000-00003.parquet",
    ]
    # the partition columns live in the paths, not in the files
    assert pq.ParquetFile(committed_files(out)[0]).schema_arrow.names == ["id", "amount"]
    back = read_parquet_output(out)
    assert back.schema == df.schema
    assert_frame_equal(back.sort("id"), pl.concat([df, df.head(1).with_columns(id=5)]).sort("id"))


def test_partitioned_crash_and_replay_gives_exactly_one_copy(tmp_path):
    out = tmp_path / "out"
    df = pl.DataFrame({"k": [1, 2, 1, 3], "v": ["a", "b", "c", "d"]})
    crashing = opened(
        out,
        SinkContext(query_id="q1", fault_point=crash_at("sink.after_data", 0)),
        partition_by="k",
    )
    with pytest.raises(Crash):
        crashing.add_batch(0, df)
    assert len(data_files_on_disk(out)) == 3
    assert read_parquet_output(out).height == 0

    opened(out, partition_by="k").add_batch(0, df)
    assert data_files_on_disk(out) == set(committed_files(out))
    assert_frame_equal(read_parquet_output(out).sort("v"), df)


def test_partition_column_missing_from_batch_is_an_error(tmp_path):
    sink = opened(tmp_path / "out", partition_by=["k"])
    with pytest.raises(SinkError, match=r"batch 4 lacks the partition column\(s\) \['k'\]"):
        sink.add_batch(4, frame(0, 1))


def test_changing_partition_by_on_an_existing_output_is_refused(tmp_path):
    out = tmp_path / "out"
    opened(out).add_batch(0, frame(0, 1))
    with pytest.raises(SinkConfigError, match="partitioned by"):
        opened(out, partition_by="name")


def test_describe(tmp_path):
    assert ParquetSink(tmp_path, partition_by="k").describe() == {
        "kind": "ParquetSink",
        "path": str(tmp_path),
        "compression": "zstd",
        "partition_by": ["k"],
    }
