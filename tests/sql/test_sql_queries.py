"""SQL queries against the same query written with the Python API (identical
output under random batch splits) and against one-shot Polars SQL over all rows."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import microbatch as mb
from microbatch.testing import StreamTest

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SCHEMA = {"ts": pl.Datetime("ms", "UTC"), "k": pl.Int64, "v": pl.Int64}

events = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 400_000), st.integers(-50, 50)),
    min_size=1,
    max_size=40,
)
cuts_st = st.lists(st.integers(0, 40), max_size=6)
SETTINGS = settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def frame(rows: list[tuple[int, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "ts": [T0 + timedelta(milliseconds=t) for _, t, _ in rows],
            "k": [k for k, _, _ in rows],
            "v": [v for _, _, v in rows],
        },
        schema=SCHEMA,
    )


def run_split(
    build: Callable[[mb.Stream], mb.Stream],
    rows: list[tuple[int, int, int]],
    cuts: list[int],
    tmp: Path,
    output_mode: str = "append",
) -> StreamTest:
    test = StreamTest(build, schema=SCHEMA, checkpoint=tmp, output_mode=output_mode)  # type: ignore[arg-type]
    bounds = [0, *sorted({c for c in cuts if c < len(rows)}), len(rows)]
    for lo, hi in itertools.pairwise(bounds):
        if hi > lo:
            test.add(frame(rows[lo:hi])).process()
    return test


def same_output(sql_test: StreamTest, py_test: StreamTest) -> pl.DataFrame:
    got, want = sql_test.output, py_test.output
    assert got.columns == want.columns
    assert got.schema == want.schema
    got_sorted = got.sort(got.columns, nulls_last=True)
    assert got_sorted.equals(want.sort(want.columns, nulls_last=True)), f"{got}\n{want}"
    return got


WINDOWED = {
    "tumble": (
        """SELECT window_start, window_end, k, COUNT(*) AS n, SUM(v) AS total, MIN(v) AS lo,
                  MAX(v) AS hi, AVG(v) AS avg, FIRST_VALUE(v) AS first_v,
                  LAST_VALUE(v) AS last_v, COUNT(v) AS nv
           FROM TABLE(TUMBLE(TABLE tx, DESCRIPTOR(ts), INTERVAL '1' MINUTE))
           GROUP BY window_start, window_end, k""",
        lambda s: s.group_by(mb.window("ts", "1m"), "k").agg(
            pl.len().alias("n"),
            pl.col("v").sum().alias("total"),
            pl.col("v").min().alias("lo"),
            pl.col("v").max().alias("hi"),
            pl.col("v").mean().alias("avg"),
            pl.col("v").first().alias("first_v"),
            pl.col("v").last().alias("last_v"),
            pl.col("v").count().alias("nv"),
        ),
    ),
    "hop_slide_then_size": (
        """SELECT window_start, window_end, k, SUM(v) AS total
           FROM TABLE(HOP(TABLE tx, DESCRIPTOR(ts), INTERVAL '20' SECONDS, INTERVAL '1' MINUTE))
           GROUP BY window_start, window_end, k""",
        lambda s: s.group_by(mb.window("ts", "1m", slide="20s"), "k").agg(
            pl.col("v").sum().alias("total")
        ),
    ),
    "cumulate_step_then_size": (
        """SELECT window_start, window_end, k, COUNT(*) AS n, SUM(v) AS total, MAX(v) AS hi
           FROM TABLE(CUMULATE(TABLE tx, DESCRIPTOR(ts), INTERVAL '20' SECOND,
                               INTERVAL '1' MINUTE))
           GROUP BY window_start, window_end, k""",
        lambda s: s.group_by(mb.cumulate_window("ts", "1m", "20s"), "k").agg(
            pl.len().alias("n"), pl.col("v").sum().alias("total"), pl.col("v").max().alias("hi")
        ),
    ),
    "session": (
        """SELECT window_start, window_end, k, COUNT(*) AS n, MAX(v) AS hi
           FROM TABLE(SESSION(TABLE tx PARTITION BY k, DESCRIPTOR(ts), INTERVAL '30' SECOND))
           GROUP BY window_start, window_end, k""",
        lambda s: s.group_by(mb.session_window("ts", "30s"), "k").agg(
            pl.len().alias("n"), pl.col("v").max().alias("hi")
        ),
    ),
    "distinct_per_window": (
        """SELECT DISTINCT window_start, window_end, k AS key
           FROM TABLE(HOP(TABLE tx, DESCRIPTOR(ts), INTERVAL '20' SECOND, INTERVAL '1' MINUTE))""",
        lambda s: (
            s.group_by(mb.window("ts", "1m", slide="20s"), "k")
            .agg(pl.len())
            .select("window_start", "window_end", pl.col("k").alias("key"))
        ),
    ),
    "fraud_rule_having": (
        """SELECT window_start, window_end, k, COUNT(*) AS n, SUM(v) AS total
           FROM TABLE(TUMBLE(TABLE tx, DESCRIPTOR(ts), INTERVAL '1' MINUTE))
           GROUP BY window_start, window_end, k
           HAVING COUNT(*) >= 3""",
        lambda s: (
            s.group_by(mb.window("ts", "1m"), "k")
            .agg(pl.len().alias("n"), pl.col("v").sum().alias("total"))
            .filter(pl.col("n") >= 3)
        ),
    ),
    "expressions_over_aggregates": (
        """SELECT k, window_start, SUM(v * 2) / COUNT(*) AS per_row, MAX(v) - MIN(v) AS spread
           FROM TABLE(TUMBLE(TABLE tx, DESCRIPTOR(ts), INTERVAL '1' MINUTE))
           WHERE v <> 0
           GROUP BY window_start, window_end, k
           HAVING SUM(v) > 0""",
        lambda s: (
            s.filter(pl.col("v") != 0)
            .with_columns((pl.col("v") * 2).alias("d"))
            .group_by(mb.window("ts", "1m"), "k")
            .agg(
                pl.col("d").sum().alias("sd"),
                pl.len().alias("n"),
                pl.col("v").max().alias("hi"),
                pl.col("v").min().alias("lo"),
                pl.col("v").sum().alias("s"),
            )
            .filter(pl.col("s") > 0)
            .select(
                "k",
                "window_start",
                (pl.col("sd") / pl.col("n")).alias("per_row"),
                (pl.col("hi") - pl.col("lo")).alias("spread"),
            )
        ),
    ),
}


def check_sql_equals_python(
    query: str,
    python: Callable[[mb.Stream], mb.Stream],
    rows: list[tuple[int, int, int]],
    cuts: list[int],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """``query`` over ``tx`` and its Python API twin, both on ``with_watermark("ts",
    "20s")``, give the same output and late rows for the same batch split."""

    def sql_build(src: mb.Stream) -> mb.Stream:
        return mb.sql(query, tx=src.with_watermark("ts", "20s"))

    def py_build(src: mb.Stream) -> mb.Stream:
        return python(src.with_watermark("ts", "20s"))

    sql_test = run_split(sql_build, rows, cuts, tmp_path_factory.mktemp("sql"))
    py_test = run_split(py_build, rows, cuts, tmp_path_factory.mktemp("py"))
    same_output(sql_test, py_test)
    assert sql_test.late_rows.height == py_test.late_rows.height
    sql_test.close()
    py_test.close()


@pytest.mark.parametrize("name", list(WINDOWED))
@SETTINGS
@given(rows=events, cuts=cuts_st)
def test_windowed_sql_equals_python_api(tmp_path_factory, name, rows, cuts) -> None:
    check_sql_equals_python(*WINDOWED[name], rows, cuts, tmp_path_factory)


def test_sql_plan_is_the_python_plan() -> None:
    """One plan: the SQL fraud rule builds the Python API's nodes, in order."""
    src = mb.read_memory(schema=SCHEMA).with_watermark("ts", "20s")
    query, python = WINDOWED["fraud_rule_having"]
    sql_plan = mb.sql(query, tx=src).plan.explain()
    py_plan = python(src).plan.explain()
    assert sql_plan.replace('"n"', "n") == py_plan.replace('"n"', "n")


def test_tumble_matches_one_shot_polars_when_nothing_is_late(tmp_path: Path) -> None:
    """In order input: the append output, once the watermark closed every window,
    equals a one-shot Polars group_by over all rows."""
    rows = [(k, t * 7_000, (t * 13) % 17 - 8) for t in range(60) for k in (1, 2) if (t + k) % 3]
    rows.append((9, 900_000, 0))  # moves the watermark past every earlier window
    query, _ = WINDOWED["fraud_rule_having"]
    test = run_split(
        lambda s: mb.sql(query, tx=s.with_watermark("ts", "20s")), rows, [10, 30, 50], tmp_path
    )
    all_rows = frame(rows)
    want = (
        all_rows.filter(pl.col("k") != 9)
        .group_by(pl.col("ts").dt.truncate("1m").alias("window_start"), "k")
        .agg(pl.len().cast(pl.Int64).alias("n"), pl.col("v").sum().alias("total"))
        .filter(pl.col("n") >= 3)
        .with_columns((pl.col("window_start") + timedelta(minutes=1)).alias("window_end"))
        .select("window_start", "window_end", "k", "n", "total")
    )
    assert test.late_rows.height == 0
    cols = ["window_start", "k"]
    assert test.output.sort(cols).equals(want.sort(cols)), f"{test.output}\n{want}"
    test.close()


STATELESS = """
    SELECT k,
           v * 2 + 1 AS w,
           CASE WHEN v > 10 THEN 'high' WHEN v < -10 THEN 'low' ELSE 'mid' END AS band,
           CAST(v AS DOUBLE) / 4 AS quarter,
           COALESCE(NULLIF(k, 2), -1) AS k2
    FROM tx
    WHERE v <> 0 AND (k = 1 OR v > -20)
"""


@SETTINGS
@given(rows=events, cuts=cuts_st)
def test_stateless_sql_equals_one_shot_polars_sql(tmp_path_factory, rows, cuts) -> None:
    test = run_split(
        lambda s: mb.sql(STATELESS, tx=s), rows, cuts, tmp_path_factory.mktemp("stateless")
    )
    want = pl.SQLContext(tx=frame(rows)).execute(STATELESS, eager=True)
    assert test.output.columns == want.columns
    assert test.output.equals(want), f"{test.output}\n{want}"
    test.close()


@SETTINGS
@given(rows=events, cuts=cuts_st)
def test_unwindowed_group_by_is_an_updating_table(tmp_path_factory, rows, cuts) -> None:
    """GROUP BY without a window: in update mode, the last row per key equals a
    one-shot Polars SQL GROUP BY over all rows."""
    query = "SELECT k, COUNT(*) AS n, SUM(v) AS total, MAX(v) AS hi FROM tx GROUP BY k"
    test = run_split(
        lambda s: mb.sql(query, tx=s),
        rows,
        cuts,
        tmp_path_factory.mktemp("upd"),
        output_mode="update",
    )
    latest = test.output.unique("k", keep="last", maintain_order=True).sort("k")
    want = pl.SQLContext(tx=frame(rows)).execute(query, eager=True).sort("k")
    assert latest.select("k", "total", "hi").equals(want.select("k", "total", "hi"))
    assert latest["n"].to_list() == want["n"].to_list()
    test.close()


@SETTINGS
@given(rows=events, cuts=cuts_st)
def test_static_join_equals_join_static(tmp_path_factory, rows, cuts) -> None:
    cards = pl.DataFrame({"k": [1, 2, 3], "country": ["FR", "DE", "IT"], "v": [0, 0, 0]})
    query = """SELECT t.k, t.v, c.country, c.v AS card_v
               FROM tx AS t LEFT JOIN cards AS c ON t.k = c.k WHERE t.v > -30"""
    sql_test = run_split(
        lambda s: mb.sql(query, tx=s, cards=cards), rows, cuts, tmp_path_factory.mktemp("j1")
    )
    py_test = run_split(
        lambda s: (
            s.join_static(cards, on="k", how="left")
            .filter(pl.col("v") > -30)
            .select("k", "v", "country", pl.col("v_right").alias("card_v"))
        ),
        rows,
        cuts,
        tmp_path_factory.mktemp("j2"),
    )
    assert sql_test.output.equals(py_test.output)
    want = pl.SQLContext(tx=frame(rows), cards=cards).execute(query, eager=True)
    assert sql_test.output.sort("k", "v").equals(want.sort("k", "v").cast(sql_test.output.schema))
    sql_test.close()
    py_test.close()


def test_sql_context_registers_streams_and_tables(tmp_path: Path) -> None:
    cards = pl.DataFrame({"k": [1], "country": ["FR"]})
    path = tmp_path / "cards.parquet"
    cards.write_parquet(path)
    src = mb.read_memory(schema=SCHEMA)
    ctx = mb.SQLContext(tx=src).register("cards", path).register("frame", cards)
    assert ctx.tables() == ["cards", "frame", "tx"]
    stream = ctx.sql("SELECT t.k, c.country FROM tx t JOIN cards c ON t.k = c.k")
    assert stream.schema == pl.Schema({"k": pl.Int64, "country": pl.String})
    ctx.unregister("frame")
    assert ctx.tables() == ["cards", "tx"]
    with pytest.raises(mb.PlanError, match="takes a Stream or a static table"):
        ctx.register("bad", 3)  # type: ignore[arg-type]


def test_explain_shows_the_sql_above_the_plan() -> None:
    src = mb.read_memory(schema=SCHEMA, name="tx").with_watermark("ts", "20s")
    query = "SELECT k, v\nFROM tx WHERE v > 1"
    stream = mb.sql(query, tx=src)
    head, plan = stream.explain().split("\n-- plan\n")
    assert head == f"-- SQL\n{query}"
    assert plan == stream.plan.explain()
    assert plan.splitlines()[1].strip().startswith("filter(")
    assert src.explain() == src.plan.explain()  # Python streams: the plan only
