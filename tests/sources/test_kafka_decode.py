"""Bulk decoding of Kafka values (no broker needed)."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from microbatch.exceptions import PlanError
from microbatch.sources.kafka import KafkaSource, _cap
from microbatch.sources.kafka_decode import TimeUnit, decode_values, rfc3339_datetimes

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


_OFFSETS = st.one_of(
    st.just("Z"),
    st.builds(lambda sign, h, m: f"{sign}{h:02d}:{m:02d}",
              st.sampled_from("+-"), st.integers(0, 23), st.integers(0, 59)),
)
_STAMP = st.builds(
    lambda d, digits, frac, off, sep: (
        d.strftime(f"%Y-%m-%d{sep}%H:%M:%S")
        + (f".{frac:09d}"[: digits + 1] if digits else "") + off
    ),
    st.datetimes(datetime(1900, 1, 1), datetime(2250, 12, 31)),
    st.integers(0, 9), st.integers(0, 999_999_999), _OFFSETS,
    st.sampled_from(["T", "T", "T", " "]),  # a space: not the RFC 3339 shape
)


@settings(max_examples=60, deadline=None)
@given(stamps=st.lists(st.one_of(_STAMP, st.none()), min_size=1, max_size=30),
       unit=st.sampled_from(["ms", "us", "ns"]))
def test_rfc3339_fast_path_equals_polars(stamps: list[str | None], unit: TimeUnit) -> None:
    """The Arrow-cast datetimes are Polars' ``%+`` instants, whenever they are taken,
    and they are taken for every RFC 3339 value of at most the unit's precision."""
    text = pl.Series("t", stamps, dtype=pl.String)
    ours = rfc3339_datetimes(text, unit)
    polars = text.str.to_datetime("%+", time_unit=unit, time_zone="UTC", strict=False)
    digits = {"ms": 3, "us": 6, "ns": 9}[unit]
    if all(s is None or (s[10] == "T" and _fraction_digits(s) <= digits) for s in stamps):
        assert ours is not None, stamps
    if ours is not None:
        assert ours.dtype == pl.Datetime(unit, "UTC")
        assert ours.to_list() == polars.to_list(), stamps


def _fraction_digits(stamp: str) -> int:
    _, dot, rest = stamp.partition(".")
    return len(list(itertools.takewhile(str.isdigit, rest))) if dot else 0


def test_rfc3339_fast_path_refuses_other_shapes() -> None:
    for stamp in ("2026-01-01 00:00:00Z", "2026-01-01", "2026-01-01T00:00:00",
                  "2026-01-01T00:00:60Z", "2026-01-01T00:00:00z", "nope"):
        assert rfc3339_datetimes(pl.Series([stamp]), "ms") is None, stamp
