"""Bulk decoding of Kafka values (no broker needed)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import polars as pl
import pytest

from microbatch.exceptions import PlanError
from microbatch.sources.kafka import KafkaSource, _cap
from microbatch.sources.kafka_decode import decode_values

SCHEMA = pl.Schema({"a": pl.Int64, "t": pl.Datetime("ms", "UTC"), "s": pl.String})


def test_good_values_decode_in_one_call_with_types() -> None:
    values = [json.dumps({"a": i, "t": "2026-01-01T00:00:01Z", "s": f"x{i}"}).encode()
              for i in range(1000)]
    out = decode_values(values, format="json", schema=SCHEMA)
    assert out.bad == []
    assert out.good.tolist() == list(range(1000))
    assert out.data.schema == SCHEMA
    assert out.data["t"][0] == datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)


def test_bad_values_are_located_and_good_ones_kept() -> None:
    values: list[bytes | None] = [
        b'{"a": 1, "t": "2026-01-01T00:00:00Z", "s": "x"}',
        None,                                   # tombstone
        b"",                                    # empty
        b'{"a": "2"}',                          # text that converts: kept
        b'{"a": 1.5}',                          # does not fit Int64
        b"{bad",                                # malformed
        b'{"a": 3,\n "s": 5}',                  # a newline inside a value is whitespace
        b"5",                                   # not an object
        b'{"t": "nope"}',                       # not a datetime
        b'{"a": 4}',
    ]
    out = decode_values(values, format="json", schema=SCHEMA)
    assert out.good.tolist() == [0, 3, 6, 9]
    assert out.data["a"].to_list() == [1, 2, 3, 4]
    assert out.data["s"].to_list() == ["x", None, "5", None]
    reasons = dict(out.bad)
    assert sorted(reasons) == [1, 2, 4, 5, 7, 8]
    assert "tombstone" in reasons[1]
    assert reasons[2] == "empty value"
    assert "column 'a'" in reasons[4]
    assert "invalid JSON value" in reasons[5]
    assert "invalid JSON value" in reasons[7]
    assert "column 't'" in reasons[8]


def test_csv_and_raw() -> None:
    values = [b"1,2026-01-01T00:00:00Z,x", b"2", b"x,,", b'"4",,"q,r"', b"5,,y,z"]
    out = decode_values(values, format="csv", schema=SCHEMA)
    assert out.good.tolist() == [0, 1, 3]
    assert out.data["s"].to_list() == ["x", None, "q,r"]  # missing trailing fields: null
    assert [i for i, _ in out.bad] == [2, 4]
    alone = decode_values([b"2"], format="csv", schema=SCHEMA)  # the same, read alone
    assert alone.data["a"].to_list() == [2]
    raw = decode_values([b"a", None], format="raw", schema=None)
    assert raw.data["value"].to_list() == [b"a", None]


def test_options_are_validated() -> None:
    with pytest.raises(PlanError, match="needs a schema"):
        KafkaSource("t", bootstrap="x:1")
    with pytest.raises(PlanError, match="on_data_loss"):
        KafkaSource("t", bootstrap="x:1", format="raw", on_data_loss="ignore")  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="metadata"):
        KafkaSource("t", bootstrap="x:1", schema={"offset": pl.Int64})
    with pytest.raises(PlanError, match="names no partition"):
        KafkaSource("t", bootstrap="x:1", format="raw", starting_offsets={"u:0": 5})
    src = KafkaSource("t", bootstrap="x:1", format="raw", starting_offsets={0: 5, "t:1": -2})
    assert src.starting_offsets == {"t:0": 5, "t:1": -2}


def test_cap_is_deterministic_largest_remainder() -> None:
    a, b, c = ("t", 0), ("t", 1), ("t", 2)
    assert _cap({a: 0, b: 0, c: 0}, {a: 700, b: 200, c: 100}, 100) == {a: 70, b: 20, c: 10}
    assert _cap({a: 0, b: 0, c: 0}, {a: 1, b: 1, c: 1}, 2) == {a: 1, b: 1, c: 0}
    capped = _cap({a: 5, b: 0}, {a: 6, b: 1000}, 10)
    assert capped[a] - 5 + capped[b] == 10
