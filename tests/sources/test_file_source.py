"""FileSource: the directory as a log, the durable file ledger, bulk decoding, dead letters."""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from microbatch.exceptions import PlanError, SourceError
from microbatch.sources.base import DEAD_LETTER_SCHEMA, SourceContext
from microbatch.sources.file_ledger import FileLedger
from microbatch.sources.files import FileSource

SCHEMA = {"id": pl.Int64, "name": pl.String}
IDS = {"id": pl.Int64}
"""The schema of the files that hold only ids (a file without ``name`` would be a
schema mismatch under ``SCHEMA``)."""


def open_source(data: Path, state: Path | None, **options) -> FileSource:
    options.setdefault("format", "json")
    options.setdefault("schema", IDS)
    source = FileSource(data, **options)
    source.open(SourceContext("0", state))
    return source


def write_lines(path: Path, rows: list[dict], *, mtime_s: int | None = None) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if mtime_s is not None:
        set_mtime(path, mtime_s)
    return path


def set_mtime(path: Path, seconds: int) -> None:
    os.utime(path, ns=(seconds * 10**9, seconds * 10**9))


def ids(source: FileSource, start: int, end: int) -> list[int]:
    return source.read(start, end).data["id"].to_list()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "in"
    path.mkdir()
    return path


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


# ------------------------------------------------------------------- the log


def test_files_are_admitted_by_mtime_then_name(data: Path, state: Path) -> None:
    write_lines(data / "b.json", [{"id": 2}], mtime_s=1_000)
    write_lines(data / "a.json", [{"id": 3}], mtime_s=2_000)
    write_lines(data / "c.json", [{"id": 1}], mtime_s=1_000)  # same mtime as b: name decides
    write_lines(data / "a0.json", [{"id": 0}], mtime_s=500)
    source = open_source(data, state, max_files_per_batch=1)

    batches, offset = [], source.initial_offset()
    while (end := source.latest_offset(offset)) != offset:
        batches.append(ids(source, offset, end))
        offset = end

    assert batches == [[0], [2], [1], [3]]
    assert [f.path for f in source.ledger] == ["a0.json", "b.json", "c.json", "a.json"]


def test_new_files_are_picked_up_on_later_calls(data: Path, state: Path) -> None:
    write_lines(data / "1.json", [{"id": 1}])
    source = open_source(data, state)
    assert source.latest_offset(0) == 1
    assert source.latest_offset(1) == 1  # nothing new: start comes back unchanged

    write_lines(data / "2.json", [{"id": 2}, {"id": 3}])
    assert source.latest_offset(1) == 2
    assert ids(source, 1, 2) == [2, 3]
    assert ids(source, 0, 2) == [1, 2, 3]


def test_max_files_per_batch_caps_only_when_capped(data: Path, state: Path) -> None:
    for i in range(5):
        write_lines(data / f"{i}.json", [{"id": i}], mtime_s=1_000 + i)
    source = open_source(data, state, max_files_per_batch=2)
    assert source.latest_offset(0) == 2
    assert source.latest_offset(2) == 4
    assert source.latest_offset(4) == 5
    assert source.latest_offset(0, capped=False) == 5
    assert source.bound(source.latest_offset(0, capped=False), 3) == 3
    assert ids(source, 2, 4) == [2, 3]


def test_hidden_temp_and_other_extension_files_are_ignored(data: Path, state: Path) -> None:
    for name in [".hidden.json", "_SUCCESS", "_tmp.json", "x.json.tmp", "notes.txt", "x.csv"]:
        (data / name).write_text('{"id": 99}\n')
    (data / "sub").mkdir()
    write_lines(data / "sub" / "nested.json", [{"id": 98}])
    write_lines(data / "a.jsonl", [{"id": 1}], mtime_s=1)
    write_lines(data / "b.ndjson", [{"id": 2}], mtime_s=2)
    write_lines(data / "c.json", [{"id": 3}], mtime_s=3)
    source = open_source(data, state)
    assert source.latest_offset(0) == 3
    assert ids(source, 0, 3) == [1, 2, 3]


def test_glob_overrides_the_default_pattern(data: Path, state: Path) -> None:
    write_lines(data / "a.json", [{"id": 1}])
    (data / "sub").mkdir()
    write_lines(data / "sub" / "b.json", [{"id": 2}], mtime_s=1)
    source = open_source(data, state, glob="**/*.json")
    assert source.latest_offset(0) == 2
    assert ids(source, 0, 2) == [2, 1]
    assert source.ledger.files(0, 1)[0].path == "sub/b.json"


def test_restart_never_reads_a_file_twice(data: Path, state: Path) -> None:
    write_lines(data / "a.json", [{"id": 1}], mtime_s=1)
    write_lines(data / "b.json", [{"id": 2}], mtime_s=2)
    first = open_source(data, state)
    end = first.latest_offset(first.initial_offset())
    assert ids(first, 0, end) == [1, 2]
    first.close()

    # a new process: touching an admitted file does not re-admit it, and the
    # recorded range still names the same files
    set_mtime(data / "a.json", 10)
    write_lines(data / "c.json", [{"id": 3}], mtime_s=5)
    second = open_source(data, state)
    assert ids(second, 0, 2) == [1, 2]
    assert second.latest_offset(2) == 3
    assert ids(second, 2, 3) == [3]
    assert [f.path for f in second.ledger] == ["a.json", "b.json", "c.json"]


def test_without_state_dir_the_ledger_is_in_memory(data: Path, tmp_path: Path) -> None:
    write_lines(data / "a.json", [{"id": 1}])
    source = open_source(data, None)
    assert source.latest_offset(0) == 1
    assert ids(source, 0, 1) == [1]
    assert source.ledger.entry_count == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_bytes_appended_after_admission_are_never_read(data: Path, state: Path) -> None:
    path = write_lines(data / "a.json", [{"id": 1}])
    source = open_source(data, state)
    source.latest_offset(0)
    with path.open("a") as fh:
        fh.write('{"id": 2}\n')
    assert ids(source, 0, 1) == [1]


def test_a_file_gone_from_a_recorded_range_is_an_error(data: Path, state: Path) -> None:
    write_lines(data / "a.json", [{"id": 1}])
    source = open_source(data, state)
    source.latest_offset(0)
    (data / "a.json").unlink()
    with pytest.raises(SourceError, match=r"'a\.json'.*gone.*new checkpoint"):
        source.read(0, 1)


def test_offsets_beyond_the_ledger_are_an_error(data: Path, state: Path) -> None:
    source = open_source(data, state)
    with pytest.raises(SourceError, match="ledger holds only 0 files"):
        source.read(0, 3)
    with pytest.raises(SourceError, match="not a file count"):
        source.latest_offset({"rows": 1})


def test_missing_directory_is_an_error(tmp_path: Path) -> None:
    source = open_source(tmp_path / "nope", None)
    with pytest.raises(SourceError, match="not a directory"):
        source.latest_offset(0)


# ------------------------------------------------------------------- ledger


def test_ledger_compaction_preserves_content(data: Path, state: Path) -> None:
    source = open_source(data, state)
    offset = 0
    for i in range(FileLedger.compact_threshold + 5):
        write_lines(data / f"{i:04d}.json", [{"id": i}], mtime_s=1_000 + i)
        offset = source.latest_offset(offset)
    assert offset == FileLedger.compact_threshold + 5
    entries = sorted((state / "ledger").iterdir())
    # compacted once at 101 entries, then 4 more appends
    assert len(entries) == 5
    assert entries[0].name == "0" * 20

    reloaded = FileLedger(state / "ledger")
    assert list(reloaded) == list(source.ledger)
    assert [f.seq for f in reloaded] == list(range(offset))
    assert ids(open_source(data, state), 0, offset) == list(range(offset))


def test_compaction_interrupted_before_cleanup_loads_the_same_ledger(tmp_path: Path) -> None:
    directory = tmp_path / "ledger"
    ledger = FileLedger(directory)
    for i in range(4):
        ledger.append([(f"f{i}.json", i, 1_000 + i), (f"g{i}.json", i, 1_000 + i)])
    before = list(ledger)
    saved = {p.name: p.read_bytes() for p in directory.iterdir()}
    ledger.compact()
    assert len(list(directory.iterdir())) == 1
    # crash between the atomic rewrite of entry 0 and the removal of the others
    for name, content in saved.items():
        if name != "0" * 20:
            (directory / name).write_bytes(content)

    reloaded = FileLedger(directory)
    assert list(reloaded) == before
    assert reloaded.entry_count == 1
    assert len(list(directory.iterdir())) == 1


def test_a_missing_ledger_entry_is_reported(tmp_path: Path) -> None:
    directory = tmp_path / "ledger"
    ledger = FileLedger(directory)
    ledger.append([("a.json", 1, 1)])
    ledger.append([("b.json", 1, 2)])
    ledger.append([("c.json", 1, 3)])
    (directory / f"{1:020d}").unlink()
    with pytest.raises(Exception, match="starts at file 2"):
        FileLedger(directory)


# ------------------------------------------------------------------- decoding


def test_schema_is_required_for_json_and_csv(data: Path) -> None:
    with pytest.raises(PlanError, match="needs a schema"):
        FileSource(data, format="json", schema=None)
    with pytest.raises(PlanError, match="needs a schema"):
        FileSource(data, format="csv", schema=None)
    with pytest.raises(PlanError, match="format"):
        FileSource(data, format="avro", schema=SCHEMA)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="max_files_per_batch"):
        FileSource(data, format="parquet", max_files_per_batch=0)


def test_json_is_cast_to_the_schema_including_tz_datetimes(data: Path, state: Path) -> None:
    schema = {
        "id": pl.Int32,
        "amount": pl.Float64,
        "ok": pl.Boolean,
        "at": pl.Datetime("ms", "UTC"),
        "local": pl.Datetime("us", "Europe/Paris"),
        "day": pl.Date,
        "tags": pl.List(pl.String),
    }
    lines = [
        '{"id": 1, "amount": 2.5, "ok": true, "at": "2024-01-01T00:00:00Z",'
        ' "local": "2024-06-01T12:00:00", "day": "2024-01-02", "tags": ["a"], "extra": 1}',
        '{"id": 2, "amount": 3, "ok": false, "at": "2024-01-01T02:00:01.250+02:00",'
        ' "local": "2024-06-01T12:00:00Z"}',
        '{"id": 3, "at": "2024-01-01 00:00:02", "local": null}',
    ]
    (data / "a.json").write_text("\n".join(lines))
    source = open_source(data, state, schema=schema)
    batch = source.read(0, source.latest_offset(0))

    assert batch.dead_letters.height == 0
    assert batch.data.schema == pl.Schema(schema)
    utc = UTC
    assert batch.data["at"].to_list() == [
        datetime(2024, 1, 1, tzinfo=utc),
        datetime(2024, 1, 1, 0, 0, 1, 250_000, tzinfo=utc),
        datetime(2024, 1, 1, 0, 0, 2, tzinfo=utc),
    ]
    local = batch.data["local"].dt.convert_time_zone("UTC").to_list()
    assert local[:2] == [datetime(2024, 6, 1, 10, tzinfo=UTC), datetime(2024, 6, 1, 12, tzinfo=UTC)]
    assert local[2] is None
    assert batch.data["amount"].to_list() == [2.5, 3.0, None]
    assert batch.data["ok"].to_list() == [True, False, None]
    assert batch.data["day"].to_list()[0] == datetime(2024, 1, 2).date()
    assert batch.data["tags"].to_list() == [["a"], None, None]
    assert batch.partitions is None


def test_bad_json_lines_become_dead_letters_and_good_lines_are_kept(
    data: Path, state: Path
) -> None:
    good = [json.dumps({"id": i, "name": f"n{i}"}) for i in range(1000)]
    lines = [*good[:10], '{"id": 10,', *good[10:500], "", '{"id": "x"}', "not json", *good[500:]]
    lines.append("[1, 2]")
    path = data / "a.json"
    path.write_bytes(("\n".join(lines) + "\n").encode())
    source = open_source(data, state)
    batch = source.read(0, source.latest_offset(0))

    assert batch.data["id"].to_list() == list(range(1000))
    dead = batch.dead_letters
    assert dead.schema == DEAD_LETTER_SCHEMA
    # in line order, parse failures and cast failures alike
    assert dead["location"].to_list() == [
        f"{path}:11",
        f"{path}:503",
        f"{path}:504",
        f"{path}:1005",
    ]
    assert dead["raw"].to_list() == [b'{"id": 10,', b'{"id": "x"}', b"not json", b"[1, 2]"]
    assert dead["source"].to_list() == [f"files:{data.resolve()}"] * 4
    reasons = dead["reason"].to_list()
    assert reasons[1] == "column 'id': cannot convert x to Int64"
    assert all(reasons[i].startswith("invalid JSON line: ") for i in (0, 2, 3))


def test_nested_values_that_do_not_decode_are_dead_letters(data: Path, state: Path) -> None:
    schema = {"id": pl.Int64, "tags": pl.List(pl.Int64)}
    path = data / "a.json"
    path.write_text('{"id": 1, "tags": [1, 2]}\n{"id": 2, "tags": {"a": 1}}\n{"id": 3}\n')
    source = open_source(data, state, schema=schema)
    batch = source.read(0, source.latest_offset(0))
    assert batch.data.rows() == [(1, [1, 2]), (3, None)]
    assert batch.dead_letters["location"].to_list() == [f"{path}:2"]
    assert batch.dead_letters["reason"][0].startswith("column 'tags': cannot convert")


def test_invalid_utf8_and_crlf_lines(data: Path, state: Path) -> None:
    path = data / "a.json"
    path.write_bytes(b'{"id": 1}\r\n{"id": 2, "name": "\xff"}\r\n   \r\n{"id": 3}\r\n')
    source = open_source(data, state)
    batch = source.read(0, source.latest_offset(0))
    assert batch.data["id"].to_list() == [1, 3]
    assert batch.dead_letters["location"].to_list() == [f"{path}:2"]
    assert batch.dead_letters["raw"].to_list() == [b'{"id": 2, "name": "\xff"}']


def test_wrong_typed_values_become_dead_letters_naming_the_column(data: Path, state: Path) -> None:
    schema = {"id": pl.Int64, "name": pl.String, "at": pl.Datetime("ms", "UTC")}
    path = data / "a.json"
    path.write_text(
        '{"id": 1, "name": "a", "at": "2024-01-01T00:00:00Z"}\n'
        '{"id": "abc", "name": "b"}\n'
        '{"id": 3, "name": null, "at": null}\n'
        '{"id": 4, "at": "yesterday"}\n'
        '{"id": 1.5}\n'
    )
    source = open_source(data, state, schema=schema)
    batch = source.read(0, source.latest_offset(0))

    assert batch.data["id"].to_list() == [1, 3]
    dead = batch.dead_letters
    assert dead["location"].to_list() == [f"{path}:2", f"{path}:4", f"{path}:5"]
    reasons = dead["reason"].to_list()
    assert reasons[0] == "column 'id': cannot convert abc to Int64"
    assert "column 'at'" in reasons[1]
    assert "yesterday" in reasons[1]
    assert "column 'id'" in reasons[2]
    assert dead["raw"].to_list()[0] == b'{"id": "abc", "name": "b"}'


def test_truncated_parquet_is_one_dead_letter_and_other_files_are_read(
    data: Path, state: Path
) -> None:
    pl.DataFrame({"id": [1, 2], "name": ["a", "b"]}).write_parquet(data / "a.parquet")
    pl.DataFrame({"id": range(100)}).write_parquet(data / "b.parquet")
    content = (data / "b.parquet").read_bytes()
    (data / "b.parquet").write_bytes(content[: len(content) // 2])
    (data / "c.parquet").write_bytes(b"this is not parquet")
    pl.DataFrame({"id": [3], "name": [None]}, schema=SCHEMA).write_parquet(data / "d.parquet")
    for i, name in enumerate(["a", "b", "c", "d"]):
        set_mtime(data / f"{name}.parquet", 1_000 + i)

    source = open_source(data, state, format="parquet", schema=SCHEMA)
    batch = source.read(0, source.latest_offset(0))

    assert batch.data.rows() == [(1, "a"), (2, "b"), (3, None)]
    dead = batch.dead_letters
    assert dead["location"].to_list() == [str(data / "b.parquet"), str(data / "c.parquet")]
    assert dead["raw"].to_list() == [b"", b""]
    assert all("cannot read Parquet file" in r and "left in place" in r for r in dead["reason"])


def test_parquet_schema_is_inferred_and_cast_when_given(data: Path, state: Path) -> None:
    # x is integral: a fractional float would not fit Int64 (a dead letter, not 1.5 -> 1)
    pl.DataFrame({"id": [1], "x": [1.0]}).write_parquet(data / "a.parquet")
    pl.DataFrame({"id": [2], "y": ["b"]}).write_parquet(data / "b.parquet")
    set_mtime(data / "a.parquet", 1)
    inferred = open_source(data, None, format="parquet", schema=None)
    assert inferred.schema is None
    frame = inferred.read(0, inferred.latest_offset(0)).data
    assert frame.columns == ["id", "x", "y"]
    assert frame.rows() == [(1, 1.0, None), (2, None, "b")]

    # b.parquet has no x: read as null only under on_missing_columns="null"
    cast = open_source(
        data, state, format="parquet", schema={"id": pl.Int8, "x": pl.Int64},
        on_missing_columns="null",
    )
    batch = cast.read(0, cast.latest_offset(0))
    assert batch.data.schema == pl.Schema({"id": pl.Int8, "x": pl.Int64})
    assert batch.data.rows() == [(1, 1), (2, None)]


def test_parquet_values_that_do_not_fit_are_dead_letters(data: Path, state: Path) -> None:
    pl.DataFrame({"id": [1, 300, 2]}).write_parquet(data / "a.parquet")
    source = open_source(data, state, format="parquet", schema={"id": pl.Int8})
    batch = source.read(0, source.latest_offset(0))
    assert batch.data["id"].to_list() == [1, 2]
    assert batch.dead_letters["location"].to_list() == [f"{data / 'a.parquet'}#row=1"]
    assert batch.dead_letters["raw"].to_list() == [b'{"id":300}']


@pytest.mark.parametrize("fmt", ["json", "csv", "parquet"])
def test_empty_files_yield_no_rows_and_no_dead_letters(data: Path, state: Path, fmt: str) -> None:
    (data / f"empty.{fmt}").write_bytes(b"")
    if fmt == "parquet":
        pl.DataFrame(schema=SCHEMA).write_parquet(data / "blank.parquet")
    else:
        (data / f"blank.{fmt}").write_bytes(b"\n\n" if fmt == "json" else b"id,name\n")
    source = open_source(data, state, format=fmt, schema=SCHEMA)
    end = source.latest_offset(0)
    assert end == 2
    batch = source.read(0, end)
    assert batch.data.height == 0
    assert batch.data.schema == pl.Schema(SCHEMA)
    assert batch.dead_letters.height == 0


def test_csv_is_read_cast_and_bad_values_are_dead_letters(data: Path, state: Path) -> None:
    schema = {"id": pl.Int64, "name": pl.String, "at": pl.Datetime("ms", "UTC")}
    path = data / "a.csv"
    path.write_bytes(
        b"name,id,at,ignored\n"
        b"a,1,2024-01-01T00:00:00Z,x\n"
        b'"multi\nline",2,2024-01-01T00:00:01+01:00,x\n'
        b"\n"
        b"c,abc,2024-01-01T00:00:02Z,x\n"
        b'"d ""quoted""",4,,x\r\n'
        b"e,5,not a time,x\n"
    )
    source = open_source(data, state, format="csv", schema=schema)
    batch = source.read(0, source.latest_offset(0))

    assert batch.data.schema == pl.Schema(schema)
    assert batch.data.rows() == [
        (1, "a", datetime(2024, 1, 1, tzinfo=UTC)),
        (2, "multi\nline", datetime(2023, 12, 31, 23, 0, 1, tzinfo=UTC)),
        (4, 'd "quoted"', None),
    ]
    dead = batch.dead_letters
    assert dead["location"].to_list() == [f"{path}:6", f"{path}:8"]
    assert dead["raw"].to_list() == [b"c,abc,2024-01-01T00:00:02Z,x", b"e,5,not a time,x"]
    assert dead["reason"][0].startswith("column 'id'")
    assert dead["reason"][1].startswith("column 'at'")


def test_csv_structurally_bad_records_are_isolated(data: Path, state: Path) -> None:
    path = data / "a.csv"
    good = [f"{i},n{i}" for i in range(200)]
    path.write_text("\n".join(["id,name", *good[:50], "1,2,3", *good[50:], 'x,"open']) + "\n")
    source = open_source(data, state, format="csv")
    batch = source.read(0, source.latest_offset(0))
    assert batch.data["id"].to_list() == list(range(200))
    assert batch.dead_letters["location"].to_list() == [f"{path}:52", f"{path}:203"]
    assert batch.dead_letters["raw"].to_list() == [b"1,2,3", b'x,"open']


def test_files_changed_after_admission_are_dead_letters(data: Path, state: Path) -> None:
    path = write_lines(data / "a.json", [{"id": 1}, {"id": 2}])
    source = open_source(data, state)
    source.latest_offset(0)
    path.write_text('{"id": 1}\n')
    batch = source.read(0, 1)
    assert batch.data.height == 0
    assert "changed after it was admitted" in batch.dead_letters["reason"][0]


def test_describe_and_identity(data: Path) -> None:
    source = FileSource(data, format="csv", schema=SCHEMA, max_files_per_batch=3)
    assert source.describe()["kind"] == "files"
    assert source.describe()["max_files_per_batch"] == 3
    assert source.describe()["glob"] == ["*.csv"]
    assert source.identity() == {"kind": "files", "path": str(data.resolve()), "format": "csv"}
    assert source.compare(1, 2) == -1
    assert source.compare(2, 2) == 0
    assert source.compare(3, 2) == 1


def test_replays_give_identical_batches(data: Path, state: Path) -> None:
    start = datetime(2024, 1, 1, tzinfo=UTC)
    for f in range(3):
        rows = [
            {"id": f * 10 + i, "name": (start + timedelta(seconds=i)).isoformat()}
            for i in range(10)
        ]
        write_lines(data / f"{f}.json", rows, mtime_s=100 + f)
    source = open_source(data, state)
    end = source.latest_offset(0)
    first = source.read(0, end)
    shutil.copytree(state, state.parent / "copy")
    again = open_source(data, state.parent / "copy").read(0, end)
    assert first.data.equals(again.data)


def test_unchanged_directory_is_not_listed_again_but_new_files_are_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planning skips the listing while the directory's mtime is unchanged and
    old enough to trust; a new file changes the mtime and is picked up."""
    data = tmp_path / "in"
    data.mkdir()
    pl.DataFrame({"x": [1]}).write_parquet(data / "a.parquet")
    old = time.time_ns() - 5 * 10**9
    os.utime(data, ns=(old, old))
    source = FileSource(data, format="parquet")
    source.open(SourceContext("0", tmp_path / "state"))
    assert source.latest_offset(0) == 1
    calls: list[str] = []
    original = Path.glob
    monkeypatch.setattr(
        Path, "glob", lambda self, pattern: calls.append(pattern) or original(self, pattern)
    )
    assert source.latest_offset(1) == 1
    assert calls == []  # unchanged and trusted: no listing
    pl.DataFrame({"x": [2]}).write_parquet(data / "b.parquet")
    assert source.latest_offset(1) == 2
    assert calls  # the new mtime forced a listing
