"""SQL stream-stream joins against the same join written with the Python API:
identical output under random batch splits of both inputs (interval joins
from ``BETWEEN`` and ``>=``/``<=`` bounds, temporal joins from ``FOR
SYSTEM_TIME AS OF``), and fixed cases whose rows are known."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import microbatch as mb
from microbatch.testing import JoinStreamTest
from tests.joins.join_helpers import LEFT, RIGHT, TS, frame, run_two

SETTINGS = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
rows_st = st.lists(
    st.tuples(st.sampled_from([0, 1, 2]), st.integers(0, 90).map(lambda s: s * 1000)),
    min_size=1,
    max_size=30,
)
cuts_st = st.tuples(*[st.lists(st.integers(1, 29), max_size=6)] * 2)

Build = Callable[[mb.Stream, mb.Stream], mb.Stream]


def sql_join(query: str, *, left: str = "a", right: str = "b", delay: str = "5s") -> Build:
    """``query`` over the two inputs registered as ``left`` and ``right``."""

    def build(lt: mb.Stream, rt: mb.Stream) -> mb.Stream:
        time = "valid_from" if "valid_from" in rt.schema else "ts"
        return mb.sql(
            query,
            **{left: lt.with_watermark("ts", delay), right: rt.with_watermark(time, "2s")},
        )

    return build


def interval(delay: str = "5s", **kw: object) -> Build:
    def build(lt: mb.Stream, rt: mb.Stream) -> mb.Stream:
        return lt.with_watermark("ts", delay).join_interval(
            rt.with_watermark("ts", "2s"),
            left_time="ts",
            **kw,  # type: ignore[arg-type]
        )

    return build


def asof(how: str) -> Build:
    def build(lt: mb.Stream, rt: mb.Stream) -> mb.Stream:
        return lt.with_watermark("ts", "5s").join_asof_table(
            rt.with_watermark("valid_from", "2s"),
            on="k",
            time="ts",
            dim_time="valid_from",
            how=how,  # type: ignore[arg-type]
        )

    return build


def same_output(got: JoinStreamTest, want: JoinStreamTest) -> pl.DataFrame:
    a, b = got.output, want.output
    assert a.columns == b.columns
    assert a.schema == b.schema
    a_sorted = a.sort(a.columns, nulls_last=True)
    assert a_sorted.equals(b.sort(b.columns, nulls_last=True), null_equal=True), f"{a}\n{b}"
    assert got.late_rows.height == want.late_rows.height
    return a


INTERVAL = {
    "between": (
        "SELECT * FROM a JOIN b ON a.k = b.k "
        "AND b.ts BETWEEN a.ts - INTERVAL '5' SECOND AND a.ts + INTERVAL '10' SECOND",
        interval(on="k", lower="-5s", upper="10s"),
    ),
    "gte_lte_left_join": (
        "SELECT a.lid, a.k, b.rid, b.ts AS paid_at FROM a LEFT JOIN b ON a.k = b.k "
        "AND b.ts >= a.ts AND b.ts <= a.ts + INTERVAL '20' SECONDS",
        lambda lt, rt: interval(on="k", lower="0s", upper="20s", how="left")(lt, rt).select(
            "lid", "k", "rid", pl.col("ts_right").alias("paid_at")
        ),
    ),
    "bound_on_the_left_time": (
        # a.ts in [b.ts - 10s, b.ts + 3s]  <=>  b.ts in [a.ts - 3s, a.ts + 10s]
        "SELECT * FROM a AS x FULL OUTER JOIN b AS y ON y.k = x.k "
        "AND x.ts BETWEEN y.ts - INTERVAL '10' SECOND AND y.ts + INTERVAL '3' SECOND",
        interval(on="k", lower="-3s", upper="10s", how="full"),
    ),
    "comparisons_either_way_right_join": (
        # a.ts <= b.ts + 2s: b.ts >= a.ts - 2s; b.ts - 8s <= a.ts: b.ts <= a.ts + 8s
        "SELECT * FROM a RIGHT JOIN b ON b.k = a.k "
        "AND a.ts <= b.ts + INTERVAL '2' SECOND AND b.ts - INTERVAL '8' SECOND <= a.ts",
        interval(on="k", lower="-2s", upper="8s", how="right"),
    ),
}


@pytest.mark.parametrize("name", list(INTERVAL))
@SETTINGS
@given(left=rows_st, right=rows_st, cuts=cuts_st)
def test_interval_join_sql_equals_python_api(tmp_path_factory, name, left, right, cuts) -> None:
    query, python = INTERVAL[name]
    lf, rf = frame(left, "lid"), frame(right, "rid")
    got = run_two(sql_join(query), lf, rf, cuts, tmp_path_factory.mktemp("sql"))
    want = run_two(python, lf, rf, cuts, tmp_path_factory.mktemp("py"))
    same_output(got, want)
    got.close()
    want.close()


DIM = {"did": pl.Int64, "k": pl.Int64, "valid_from": TS}
TEMPORAL = {
    "inner": (
        "SELECT * FROM a AS e JOIN b FOR SYSTEM_TIME AS OF e.ts AS d ON e.k = d.k",
        asof("inner"),
    ),
    "left_selected_columns": (
        "SELECT e.lid, d.did AS version, d.valid_from FROM a AS e "
        "LEFT JOIN b FOR SYSTEM_TIME AS OF e.ts AS d ON e.k = d.k",
        lambda lt, rt: asof("left")(lt, rt).select(
            "lid", pl.col("did").alias("version"), "valid_from"
        ),
    ),
}


@pytest.mark.parametrize("name", list(TEMPORAL))
@SETTINGS
@given(left=rows_st, right=rows_st, cuts=cuts_st)
def test_temporal_join_sql_equals_python_api(tmp_path_factory, name, left, right, cuts) -> None:
    query, python = TEMPORAL[name]
    lf = frame(left, "lid")
    rf = frame(right, "did").rename({"ts": "valid_from"})
    kw = {"left_schema": LEFT, "right_schema": DIM}
    got = run_two(sql_join(query), lf, rf, cuts, tmp_path_factory.mktemp("sql"), **kw)
    want = run_two(python, lf, rf, cuts, tmp_path_factory.mktemp("py"), **kw)
    same_output(got, want)
    got.close()
    want.close()


def test_interval_join_rows(tmp_path: Path) -> None:
    """Clicks and the payments 0 to 10 minutes after them, by user."""
    test = JoinStreamTest(
        sql_join(
            "SELECT c.lid AS click, p.rid AS payment FROM a c LEFT JOIN b p ON c.k = p.k "
            "AND p.ts BETWEEN c.ts AND c.ts + INTERVAL '10' MINUTE",
            delay="0s",
        ),
        left_schema=LEFT,
        right_schema=RIGHT,
        checkpoint=tmp_path,
    )
    at = test.at
    test.add_left({"lid": [1, 2], "k": [1, 2], "ts": [at("00:00:00"), at("00:01:00")]})
    test.add_right(
        {
            "rid": [10, 11, 12],
            "k": [1, 1, 2],
            "ts": [at("00:05:00"), at("00:11:00"), at("00:00:30")],
        }
    )
    test.process()
    test.add_left({"lid": [3], "k": [9], "ts": [at("00:30:00")]})
    test.add_right({"rid": [13], "k": [9], "ts": [at("00:30:00")]})
    test.process()
    test.process()
    out = test.output.sort("click")
    assert out.rows() == [(1, 10), (2, None), (3, 13)]
    test.close()


def test_temporal_join_against_a_changelog(tmp_path: Path) -> None:
    """A changelog of versions (``_change_type``): an update is a new version, a
    delete ends the key's value; the version's time is the stream's watermark
    column (Flink: the versioned table's event-time attribute)."""
    query = (
        "SELECT o.lid, o.k, r.rate FROM a o LEFT JOIN b FOR SYSTEM_TIME AS OF o.ts AS r "
        "ON o.k = r.k"
    )
    changes = {"k": pl.Int64, "rate": pl.Float64, "changed_at": TS, "_change_type": pl.String}

    def build_sql(lt: mb.Stream, rt: mb.Stream) -> mb.Stream:
        return mb.sql(
            query, a=lt.with_watermark("ts", "0s"), b=rt.with_watermark("changed_at", "0s")
        )

    test = JoinStreamTest(build_sql, left_schema=LEFT, right_schema=changes, checkpoint=tmp_path)
    at = test.at
    test.add_right(
        {
            "k": [1, 1, 1, 1, 2],
            "rate": [1.0, 1.0, 2.0, 2.0, 5.0],
            "changed_at": [at(t) for t in ("00:00", "00:04", "00:04", "00:06", "00:09")],
            "_change_type": ["insert", "update_preimage", "update_postimage", "delete", "insert"],
        }
    )
    test.add_left(
        {"lid": [1, 2, 3], "k": [1, 1, 1], "ts": [at(t) for t in ("00:01", "00:05", "00:07")]}
    )
    test.process()
    test.process()
    assert test.output.sort("lid").rows() == [(1, 1, 1.0), (2, 1, 2.0), (3, 1, None)]
    test.close()
