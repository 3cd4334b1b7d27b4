"""Flink's deduplication in SQL (``ROW_NUMBER() OVER (PARTITION BY window_start,
window_end, keys ORDER BY ts ASC|DESC) AS rownum`` in a subquery, ``WHERE rownum
= 1``): equal to the Python API's ``group_by(window, keys).agg(first|last)``
under random batch splits, and to a one-shot Polars sort-and-take over the rows
that were not late, for the windows the final watermark closed."""

from __future__ import annotations

from datetime import timedelta

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

import microbatch as mb
from tests.engine.test_windows import not_late
from tests.sql.test_sql_queries import (
    SCHEMA,
    SETTINGS,
    check_sql_equals_python,
    cuts_st,
    events,
    frame,
    run_split,
    same_output,
)

TUMBLE = "TABLE(TUMBLE(TABLE tx, DESCRIPTOR(ts), INTERVAL '1' MINUTE))"
ROWNUM = pl.lit(1, pl.Int64).alias("rownum")
FLINK_ORDER = ("ts", "k", "v", "window_start", "window_end")  # input columns, then the window


def deduped(spec: object, take: str, keys: tuple[str, ...] = ("k",)) -> mb.Stream:
    """The Python API twin: every non-key column's first/last per window and keys."""

    def build(s: mb.Stream) -> mb.Stream:
        rest = [c for c in ("ts", "k", "v") if c not in keys]
        return s.group_by(spec, *keys).agg(*(getattr(pl.col(c), take)() for c in rest))

    return build  # type: ignore[return-value]


CASES = {
    # name: (SQL, the Python API twin)
    "tumble_first_star": (
        f"""SELECT * FROM (
              SELECT *, ROW_NUMBER() OVER (
                PARTITION BY window_start, window_end, k ORDER BY ts ASC) AS rownum
              FROM {TUMBLE}
            ) WHERE rownum <= 1""",
        lambda s: deduped(mb.window("ts", "1m"), "first")(s).select(*FLINK_ORDER, ROWNUM),
    ),
    "tumble_last_eq_one": (
        f"""SELECT * FROM (
              SELECT *, ROW_NUMBER() OVER (
                PARTITION BY window_start, window_end, k ORDER BY ts DESC) AS rownum
              FROM {TUMBLE}
            ) WHERE rownum = 1""",
        lambda s: deduped(mb.window("ts", "1m"), "last")(s).select(*FLINK_ORDER, ROWNUM),
    ),
    "hop_last_columns_without_rownum": (
        """SELECT d.k, v AS last_v, window_end FROM (
              SELECT k, v, window_end, ts,
                     ROW_NUMBER() OVER (PARTITION BY k, window_end, window_start
                                        ORDER BY ts DESC) AS rn
              FROM TABLE(HOP(TABLE tx, DESCRIPTOR(ts), INTERVAL '20' SECOND,
                             INTERVAL '1' MINUTE))
            ) AS d WHERE rn = 1""",
        lambda s: deduped(mb.window("ts", "1m", slide="20s"), "last")(s).select(
            "k", pl.col("v").alias("last_v"), "window_end"
        ),
    ),
    "cumulate_first_inner_where": (
        """SELECT * FROM (
              SELECT ROW_NUMBER() OVER (PARTITION BY window_start, window_end, k
                                        ORDER BY ts) AS rownum, *
              FROM TABLE(CUMULATE(TABLE tx, DESCRIPTOR(ts), INTERVAL '20' SECOND,
                                  INTERVAL '1' MINUTE))
              WHERE v > 0
            ) WHERE rownum = 1 EMIT ON WINDOW CLOSE""",
        lambda s: deduped(mb.cumulate_window("ts", "1m", "20s"), "first")(
            s.filter(pl.col("v") > 0)
        ).select(ROWNUM, *FLINK_ORDER),
    ),
    "session_last_per_window_only": (
        """SELECT window_start, window_end, k, v, v * 2 AS w FROM (
              SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end, k
                                           ORDER BY ts DESC) AS rownum
              FROM TABLE(SESSION(TABLE tx PARTITION BY k, DESCRIPTOR(ts), INTERVAL '30' SECOND))
            ) WHERE rownum <= 1""",
        lambda s: deduped(mb.session_window("ts", "30s"), "last")(s).select(
            "window_start", "window_end", "k", "v", (pl.col("v") * 2).alias("w")
        ),
    ),
    "tumble_first_no_keys": (
        f"""SELECT * FROM (
              SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end
                                           ORDER BY ts) AS rownum
              FROM {TUMBLE}
            ) WHERE rownum = 1""",
        lambda s: deduped(mb.window("ts", "1m"), "first", keys=())(s).select(
            *FLINK_ORDER, ROWNUM
        ),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
@SETTINGS
@given(rows=events, cuts=cuts_st)
def test_dedupe_sql_equals_python_api(tmp_path_factory, name, rows, cuts) -> None:
    check_sql_equals_python(*CASES[name], rows, cuts, tmp_path_factory)


@SETTINGS
@given(rows=events, cuts=cuts_st)
def test_dedupe_under_allowed_lateness_keeps_revisions(tmp_path_factory, rows, cuts) -> None:
    """SET 'table.exec.emit.allow-lateness': a row late within the allowance that
    comes first changes its closed window's row, re-emitted with ``revision``."""
    query, _ = CASES["tumble_first_star"]

    def sql_build(src: mb.Stream) -> mb.Stream:
        ctx = mb.SQLContext(tx=src.with_watermark("ts", "20s"))
        return ctx.set("table.exec.emit.allow-lateness", "2 min").sql(query)

    def py_build(src: mb.Stream) -> mb.Stream:
        spec = mb.window("ts", "1m", allowed_lateness="2m")
        return deduped(spec, "first")(src.with_watermark("ts", "20s")).select(
            *FLINK_ORDER, ROWNUM, "revision"
        )

    sql_test = run_split(sql_build, rows, cuts, tmp_path_factory.mktemp("sql"))
    py_test = run_split(py_build, rows, cuts, tmp_path_factory.mktemp("py"))
    got = same_output(sql_test, py_test)
    assert got.columns[-1] == "revision"
    assert sql_test.late_rows.height == py_test.late_rows.height
    sql_test.close()
    py_test.close()


def test_dedupe_plan_is_the_python_plan() -> None:
    """One plan: the SQL deduplication is the Python API's aggregation, no new operator."""
    src = mb.read_memory(schema=SCHEMA).with_watermark("ts", "20s")
    query, python = CASES["tumble_last_eq_one"]
    assert mb.sql(query, tx=src).plan.explain() == python(src).plan.explain()


# Coarse times (5 s steps): many rows share a time, so ties (broken by arrival) matter.
tied_events = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 60).map(lambda t: t * 5_000), st.integers(-9, 9)),
    min_size=1,
    max_size=40,
)


@pytest.mark.parametrize(("order", "take"), [("ASC", "first"), ("DESC", "last")])
@SETTINGS
@given(rows=tied_events, cuts=cuts_st)
def test_dedupe_equals_one_shot_sort_and_take(tmp_path_factory, order, take, rows, cuts) -> None:
    """The output is, per closed window and key, the first (ASC) or last (DESC)
    row by event time, ties by arrival, of the rows that were not late."""
    query = f"""SELECT * FROM (
        SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end, k
                                     ORDER BY ts {order}) AS rownum
        FROM {TUMBLE}) WHERE rownum = 1"""
    test = run_split(
        lambda s: mb.sql(query, tx=s.with_watermark("ts", "20s")),
        rows,
        cuts,
        tmp_path_factory.mktemp("oracle"),
    )
    kept = not_late(frame(rows).with_row_index("arrival"), test).sort("arrival")
    start = pl.col("ts").dt.truncate("1m")
    final_wm = test.watermark_ms
    want = (
        kept.with_columns(start.alias("window_start"))
        .filter(
            (pl.col("window_start").dt.epoch("ms") + 60_000)
            <= (final_wm if final_wm is not None else -(2**62))
        )
        .sort("window_start", "k", "ts", "arrival")  # ties: arrival order
        .group_by("window_start", "k", maintain_order=True)
        .agg(getattr(pl.col("ts", "v"), take)())
        .with_columns((pl.col("window_start") + timedelta(minutes=1)).alias("window_end"))
        .select(*FLINK_ORDER, ROWNUM)
    )
    got = test.output
    assert got.columns == want.columns
    cols = ["window_start", "k"]
    assert got.sort(cols).equals(want.sort(cols)), f"{got}\n{want}"
    assert kept.height + test.late_rows.height == len(rows)
    test.close()


def test_without_a_window_refused_naming_the_state() -> None:
    src = mb.read_memory(schema=SCHEMA).with_watermark("ts", "20s")
    for order, problem in (("ASC", "forever"), ("DESC", "last row to arrive")):
        query = (
            "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY k "
            f"ORDER BY ts {order}) AS rownum FROM tx) WHERE rownum = 1"
        )
        with pytest.raises(mb.SQLError, match=problem) as info:
            mb.sql(query, tx=src)
        assert "drop_duplicates(subset, within=" in info.value.fix
        assert "TUMBLE" in info.value.fix
