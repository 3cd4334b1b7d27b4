"""Schema drift in input files: ``read_files(..., on_missing_columns=...)``.

Default (``"dead_letter"``): a file with records that lacks a column of the
schema, or has a Parquet column of a type that does not convert, is one dead
letter (reason ``schema mismatch: ...``, counted as ``schema_mismatch``); the
other files of the batch are read. ``"null"``: a missing column is null.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import microbatch as mb
from microbatch.exceptions import PlanError
from microbatch.observability.progress_schema import read_progress
from microbatch.observability.status import alarms, status_document
from microbatch.sources.base import SourceBatch, SourceContext, count_schema_mismatches
from microbatch.sources.decoding import castable
from microbatch.sources.files import FileSource

SCHEMA = {"id": pl.Int64, "amount": pl.Float64, "at": pl.Datetime("ms", "UTC")}
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def rows(start: int, n: int) -> pl.DataFrame:
    """``n`` good rows from id ``start``."""
    ids = list(range(start, start + n))
    return pl.DataFrame(
        {
            "id": ids,
            "amount": [i + 0.5 for i in ids],
            "at": [T0 + timedelta(seconds=i) for i in ids],
        },
        schema=SCHEMA,
    )


def write(path: Path, frame: pl.DataFrame) -> Path:
    """``frame`` in the format named by ``path``'s suffix."""
    fmt = path.suffix[1:]
    if fmt == "parquet":
        frame.write_parquet(path)
    elif fmt == "csv":
        frame.write_csv(path, datetime_format="%Y-%m-%dT%H:%M:%S%.3fZ")
    else:
        text = frame.with_columns(
            pl.col(c).dt.to_string("%Y-%m-%dT%H:%M:%S%.3fZ")
            for c, t in frame.schema.items()
            if isinstance(t, pl.Datetime)
        )
        path.write_text("".join(json.dumps(r) + "\n" for r in text.to_dicts()))
    return path


def read_all(directory: Path, fmt: str, **options: object) -> SourceBatch:
    source = FileSource(directory, format=fmt, schema=SCHEMA, **options)  # type: ignore[arg-type]
    source.open(SourceContext("0", None))
    return source.read(0, source.latest_offset(0))


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json"])
def test_a_file_missing_a_column_is_one_dead_letter_and_the_others_are_read(
    tmp_path: Path, fmt: str
) -> None:
    write(tmp_path / f"a.{fmt}", rows(0, 3))
    drifted = write(tmp_path / f"b.{fmt}", rows(3, 300).rename({"amount": "amt"}))
    write(tmp_path / f"c.{fmt}", rows(303, 2))

    batch = read_all(tmp_path, fmt)

    assert batch.data.equals(pl.concat([rows(0, 3), rows(303, 2)]))
    dead = batch.dead_letters
    assert dead["location"].to_list() == [str(drifted)]
    reason = dead["reason"][0]
    assert reason.startswith("schema mismatch: missing column 'amount' (Float64)")
    assert "left in place" in reason
    assert 'on_missing_columns="null"' in reason
    if fmt != "json":  # JSON lines have no header to quote
        assert "the file has ['id', 'amt', 'at']" in reason
    assert dead["raw"].to_list() == [b""]
    assert count_schema_mismatches(dead) == 1


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json"])
def test_on_missing_columns_null_reads_the_missing_column_as_null(
    tmp_path: Path, fmt: str
) -> None:
    write(tmp_path / f"b.{fmt}", rows(3, 4).drop("amount"))

    batch = read_all(tmp_path, fmt, on_missing_columns="null")

    assert batch.data.equals(rows(3, 4).with_columns(pl.lit(None, pl.Float64).alias("amount")))
    assert batch.dead_letters.height == 0


def test_a_json_key_missing_from_some_records_only_is_null(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(
        '{"id": 1, "amount": 1.5, "at": null}\n{"id": 2, "at": "2026-01-01T00:00:00Z"}\n'
    )

    batch = read_all(tmp_path, "json")

    assert batch.data["amount"].to_list() == [1.5, None]
    assert batch.data["at"].null_count() == 1
    assert batch.dead_letters.height == 0


def test_a_json_file_with_explicit_nulls_in_every_record_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"id": 1, "amount": null, "at": null}\n')

    batch = read_all(tmp_path, "json")

    assert batch.data.rows() == [(1, None, None)]
    assert batch.dead_letters.height == 0


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json"])
def test_a_file_without_records_is_never_a_schema_mismatch(tmp_path: Path, fmt: str) -> None:
    write(tmp_path / f"a.{fmt}", rows(0, 0).drop("amount"))

    batch = read_all(tmp_path, fmt)

    assert batch.data.height == 0
    assert batch.dead_letters.height == 0


@pytest.mark.parametrize("policy", ["dead_letter", "null"])
@pytest.mark.parametrize(
    ("column", "typed"),
    [
        ("amount", pl.Series("amount", [[1.0]] * 3)),  # a list for a number
        ("amount", pl.Series("amount", [{"value": 1.0}] * 3)),  # a struct for a number
        ("at", pl.Series("at", [1_767_225_600_000] * 3)),  # an epoch number for a timestamp
        ("amount", pl.Series("amount", [True] * 3)),  # a boolean for a number
    ],
)
def test_a_parquet_column_whose_type_does_not_convert_is_a_schema_mismatch(
    tmp_path: Path, column: str, typed: pl.Series, policy: str
) -> None:
    write(tmp_path / "a.parquet", rows(0, 3))
    drifted = write(tmp_path / "b.parquet", rows(3, 3).with_columns(typed))

    batch = read_all(tmp_path, "parquet", on_missing_columns=policy)

    assert batch.data.equals(rows(0, 3))
    assert batch.dead_letters["location"].to_list() == [str(drifted)]
    reason = batch.dead_letters["reason"][0]
    target = pl.Schema(SCHEMA)[column]
    want = f"schema mismatch: column {column!r} is {typed.dtype} in the file, {target} in the "
    assert reason.startswith(want + "schema, and does not convert")
    assert "on_missing_columns" not in reason  # no column is missing: that is not the fix


def test_parquet_values_of_a_castable_type_are_converted_or_dead_lettered_per_row(
    tmp_path: Path,
) -> None:
    # a type that converts is not a schema mismatch: each value converts or is a dead letter
    frame = rows(0, 3).with_columns(pl.Series("amount", ["0.5", "x", "2.5"]))
    write(tmp_path / "a.parquet", frame)

    batch = read_all(tmp_path, "parquet")

    assert batch.data["id"].to_list() == [0, 2]
    reasons = batch.dead_letters["reason"].to_list()
    assert reasons == ["column 'amount': cannot convert x to Float64"]
    assert count_schema_mismatches(batch.dead_letters) == 0


@pytest.mark.parametrize(
    ("source", "target", "ok"),
    [
        (pl.Int32(), pl.Int64(), True),
        (pl.Float64(), pl.Int64(), True),
        (pl.Int64(), pl.Decimal(12, 2), True),
        (pl.String(), pl.Datetime("ms", "UTC"), True),
        (pl.Categorical(), pl.Int64(), True),
        (pl.Date(), pl.Datetime("us"), True),
        (pl.Datetime("ns"), pl.Datetime("ms", "UTC"), True),
        (pl.Int64(), pl.String(), True),
        (pl.Null(), pl.Int64(), True),
        (pl.List(pl.Int32()), pl.List(pl.Int64()), True),
        (pl.Struct({"a": pl.Int32(), "b": pl.String()}), pl.Struct({"a": pl.Int64()}), True),
        (pl.Struct({"b": pl.String()}), pl.Struct({"a": pl.Int64()}), False),
        (pl.Int64(), pl.Datetime("ms"), False),
        (pl.Datetime("ms"), pl.Int64(), False),
        (pl.Datetime("ms"), pl.Date(), False),
        (pl.Boolean(), pl.Float64(), False),
        (pl.List(pl.Int64()), pl.String(), False),
        (pl.Struct({"a": pl.Int64()}), pl.Int64(), False),
        (pl.Binary(), pl.Int64(), False),
    ],
)
def test_castable_is_the_text_conversions_carried_over_to_types(
    source: pl.DataType, target: pl.DataType, ok: bool
) -> None:
    assert castable(source, target) is ok


def test_an_unknown_policy_is_refused_with_the_choices(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"on_missing_columns must be 'dead_letter'.*or 'null'"):
        mb.read_files(
            tmp_path, format="csv", schema=SCHEMA, on_missing_columns="skip"  # type: ignore[arg-type]
        )


# ------------------------------------------------------------------ through a query

FORMATS = ("parquet", "csv", "json")


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    fmt=st.sampled_from(FORMATS),
    drifted=st.lists(st.booleans(), min_size=2, max_size=7),
    per_batch=st.integers(1, 4),
)
def test_good_files_equal_a_one_shot_polars_read_and_drifted_ones_are_counted(
    tmp_path_factory: pytest.TempPathFactory, fmt: str, drifted: list[bool], per_batch: int
) -> None:
    work = tmp_path_factory.mktemp("drift")
    land = work / "in"
    land.mkdir()
    goods: list[Path] = []
    for i, bad in enumerate(drifted):
        frame = rows(i * 10, 1 + i % 3)
        path = write(land / f"f{i:02d}.{fmt}", frame.drop("amount") if bad else frame)
        if not bad:
            goods.append(path)
    stamp = 1_700_000_000 * 10**9
    for i, path in enumerate(sorted(land.iterdir())):
        os.utime(path, ns=(stamp + i * 10**9, stamp + i * 10**9))

    query = (
        mb.read_files(land, format=fmt, schema=SCHEMA, max_files_per_batch=per_batch)
        .write_parquet(work / "out")
        .start(work / "chk", trigger="available-now")
    )
    assert query.await_termination(60)

    oracle = (
        pl.concat([one_shot(p, fmt) for p in goods]) if goods else pl.DataFrame(schema=SCHEMA)
    )
    got = mb.parquet_table(work / "out") if (work / "out").exists() else oracle.clear()
    assert got.select(list(SCHEMA)).sort("id").equals(oracle.sort("id"))
    progress = query.recent_progress
    assert sum(p["schema_mismatch"] for p in progress) == sum(drifted)
    assert sum(p["dead_letter_rows"] for p in progress) == sum(drifted)
    found = alarms(progress)
    assert ("schema_mismatch" in {a["code"] for a in found}) is any(drifted)


def one_shot(path: Path, fmt: str) -> pl.DataFrame:
    """The file read by Polars alone, cast to the schema."""
    if fmt == "parquet":
        return pl.read_parquet(path)
    if fmt == "csv":
        return pl.read_csv(path, schema_overrides={"at": pl.String}).with_columns(
            pl.col("at").str.to_datetime(time_unit="ms", time_zone="UTC")
        ).select(list(SCHEMA))
    return pl.read_ndjson(path).with_columns(
        pl.col("at").str.to_datetime(time_unit="ms", time_zone="UTC")
    ).select(list(SCHEMA))


def test_progress_counts_the_file_and_status_raises_the_alarm(tmp_path: Path) -> None:
    land = tmp_path / "land"
    land.mkdir()
    write(land / "a.parquet", rows(0, 3))
    write(land / "b.parquet", rows(3, 300).rename({"amount": "amt"}))

    query = (
        mb.read_files(land, schema=SCHEMA)
        .write_memory("drift_status")
        .start(tmp_path / "chk", trigger="available-now")
    )
    assert query.await_termination(60)

    assert query.last_progress["schema_mismatch"] == 1
    assert query.last_progress["dead_letter_rows"] == 1
    assert mb.table("drift_status").height == 3
    doc = status_document(tmp_path / "chk")
    [alarm] = [a for a in doc["alarms"] if a["code"] == "schema_mismatch"]
    assert alarm["severity"] == "warning"
    assert alarm["message"].startswith("schema mismatch: 1 input file in the last 1 batches")
    assert "did not fit the schema" in alarm["message"]
    assert 'on_missing_columns="null"' in alarm["message"]
    dead = mb.parquet_table(tmp_path / "chk" / "dead_letter")
    assert dead["reason"][0].startswith("schema mismatch: missing column 'amount'")


def test_a_stored_record_written_before_schema_mismatch_existed_reads_as_zero() -> None:
    record = read_progress(
        {"progress_version": 1, "batch_id": 3, "dead_letter_rows": 2}, where="progress/3"
    )
    assert record["schema_mismatch"] == 0
    kept = read_progress(
        {"progress_version": 1, "batch_id": 3, "schema_mismatch": 2}, where="progress/3"
    )
    assert kept["schema_mismatch"] == 2
