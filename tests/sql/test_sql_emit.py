"""SQL's ``EMIT`` clause and ``SET 'table.exec.emit.allow-lateness'``: each equals
the Python API's query in the output mode it chooses, under random batch splits;
conflicts and misuse refused at line and column."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from hypothesis import given

import microbatch as mb
from microbatch.sql.parse import parse_statements
from microbatch.sql.script import compile_script
from tests.sql.test_sql_queries import SCHEMA, SETTINGS, cuts_st, events, run_split

TUMBLE = """SELECT window_start, window_end, k, COUNT(*) AS n, SUM(v) AS total
FROM TABLE(TUMBLE(TABLE tx, DESCRIPTOR(ts), INTERVAL '1' MINUTE))
GROUP BY window_start, window_end, k"""
HAVING = TUMBLE + "\nHAVING COUNT(*) >= 3"


def windowed(s: mb.Stream, lateness: str | None = None) -> mb.Stream:
    return s.group_by(mb.window("ts", "1m", allowed_lateness=lateness), "k").agg(
        pl.len().alias("n"), pl.col("v").sum().alias("total")
    )


CASES = {
    # name: (SQL, output mode, the Python API twin)
    "on_window_close": (TUMBLE + "\nEMIT ON WINDOW CLOSE", "append", windowed),
    "final": (TUMBLE + "\nEMIT FINAL", "append", windowed),
    "on_update": (TUMBLE + "\nEMIT ON UPDATE", "update", windowed),
    "changes": (TUMBLE + "\nEMIT CHANGES", "changelog", windowed),
    "having_on_window_close": (
        HAVING + "\nEMIT ON WINDOW CLOSE",
        "append",
        lambda s: windowed(s).filter(pl.col("n") >= 3),
    ),
    "having_on_update_fires_once": (
        HAVING + "\nEMIT ON UPDATE",
        "update",
        lambda s: windowed(s).fire_once(pl.col("n") >= 3, corrections=True),
    ),
    "having_changes_fires_once": (
        HAVING + "\nEMIT CHANGES",
        "changelog",
        lambda s: windowed(s).fire_once(pl.col("n") >= 3, corrections=True),
    ),
    "cumulate_having_on_update_fires_once": (
        """SELECT window_start, window_end, k, COUNT(*) AS n, SUM(v) AS total
FROM TABLE(CUMULATE(TABLE tx, DESCRIPTOR(ts), INTERVAL '20' SECOND, INTERVAL '1' MINUTE))
GROUP BY window_start, window_end, k
HAVING COUNT(*) >= 2
EMIT ON UPDATE""",
        "update",
        lambda s: s.group_by(mb.cumulate_window("ts", "1m", "20s"), "k")
        .agg(pl.len().alias("n"), pl.col("v").sum().alias("total"))
        .fire_once(pl.col("n") >= 2, corrections=True),
    ),
    "keyed_on_update": (
        "SELECT k, COUNT(*) AS n FROM tx GROUP BY k EMIT ON UPDATE",
        "update",
        lambda s: s.group_by("k").agg(pl.len().alias("n")),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
@SETTINGS
@given(rows=events, cuts=cuts_st)
def test_emit_equals_the_python_api_in_its_output_mode(tmp_path_factory, name, rows, cuts):
    query, mode, python = CASES[name]
    src = mb.read_memory(schema=SCHEMA).with_watermark("ts", "20s")
    assert mb.sql(query, tx=src).emit_mode == mode
    assert mb.sql(query, tx=src).write_memory(f"emit_{name}").output_mode == mode

    sql_test = run_split(lambda s: mb.sql(query, tx=s.with_watermark("ts", "20s")), rows, cuts,
                         tmp_path_factory.mktemp("sql"), output_mode=mode)
    py_test = run_split(lambda s: python(s.with_watermark("ts", "20s")), rows, cuts,
                        tmp_path_factory.mktemp("py"), output_mode=mode)
    got, want = sql_test.output, py_test.output
    assert got.schema == want.schema
    assert got.sort(got.columns, nulls_last=True).equals(want.sort(want.columns, nulls_last=True))
    assert sql_test.late_rows.height == py_test.late_rows.height
    sql_test.close()
    py_test.close()


@SETTINGS
@given(rows=events, cuts=cuts_st)
def test_set_allow_lateness_equals_the_window_allowed_lateness(tmp_path_factory, rows, cuts):
    """Rows up to the allowance late still count and fire their old window."""
    query = HAVING + "\nEMIT ON UPDATE"

    def sql_build(s: mb.Stream) -> mb.Stream:
        ctx = mb.SQLContext(tx=s.with_watermark("ts", "20s"))
        return ctx.set("table.exec.emit.allow-lateness", "2 min").sql(query)

    def py_build(s: mb.Stream) -> mb.Stream:
        return windowed(s.with_watermark("ts", "20s"), "2m").fire_once(
            pl.col("n") >= 3, corrections=True)

    sql_test = run_split(sql_build, rows, cuts, tmp_path_factory.mktemp("sql"), "update")
    py_test = run_split(py_build, rows, cuts, tmp_path_factory.mktemp("py"), "update")
    got, want = sql_test.output, py_test.output
    assert got.sort(got.columns).equals(want.sort(want.columns))
    assert sql_test.late_rows.height == py_test.late_rows.height
    sql_test.close()
    py_test.close()


def test_allowed_lateness_keeps_a_closed_window_counting(tmp_path: Path) -> None:
    """A row 90 s behind the watermark fires its window with the allowance, and is
    late without it (the SET is what changes the result)."""
    rows = [(1, 1_000, 1), (1, 2_000, 1), (1, 200_000, 0), (1, 3_000, 1)]
    out = {}
    for lateness in ("0", "5 min"):
        def build(s: mb.Stream, lateness: str = lateness) -> mb.Stream:
            ctx = mb.SQLContext(tx=s.with_watermark("ts", "20s"))
            return ctx.set("table.exec.emit.allow-lateness", lateness).sql(
                HAVING + " EMIT ON UPDATE")

        test = run_split(build, rows, [1, 2, 3], tmp_path / lateness.replace(" ", ""), "update")
        out[lateness] = (test.output.select("k", "n").rows(), test.late_rows.height)
        test.close()
    assert out["5 min"] == ([(1, 3)], 0)
    assert out["0"] == ([], 1)


def test_emit_parses_into_the_select_and_renders_back() -> None:
    (tree,) = parse_statements("SELECT k FROM tx EMIT ON WINDOW CLOSE")
    assert tree.args["emit"].output_mode == "append"
    assert tree.sql() != ""
    (aliased,) = parse_statements("SELECT t.k FROM tx AS t\nemit changes")
    assert aliased.args["emit"].policy == "CHANGES"
    assert aliased.args["from_"].this.alias == "t"


REFUSED = [
    ("SELECT k FROM tx EMIT LATER", 1, 18, "syntax"),
    ("SELECT k, v FROM tx\nWHERE v > 0 EMIT ON UPDATE", 2, 13, "EMIT ON UPDATE"),
    ("SELECT k, COUNT(*) AS n FROM tx GROUP BY k\n  EMIT ON WINDOW CLOSE", 2, 3,
     "EMIT ON WINDOW CLOSE"),
    ("""SELECT window_start, window_end, k, COUNT(*) AS n
FROM TABLE(SESSION(TABLE tx PARTITION BY k, DESCRIPTOR(ts), INTERVAL '30' SECOND))
GROUP BY window_start, window_end, k
HAVING COUNT(*) >= 3 EMIT ON UPDATE""", 4, 1, "HAVING"),
]


@pytest.mark.parametrize(("query", "line", "column", "construct"), REFUSED)
def test_emit_misuse_refused_at_line_and_column(query, line, column, construct) -> None:
    src = mb.read_memory(schema=SCHEMA).with_watermark("ts", "20s")
    with pytest.raises(mb.SQLError) as info:
        mb.sql(query, tx=src)
    assert (info.value.line, info.value.column, info.value.construct) == (line, column, construct)
    assert info.value.fix


def test_a_writer_contradicting_emit_is_refused_at_the_clause() -> None:
    src = mb.read_memory(schema=SCHEMA).with_watermark("ts", "20s")
    stream = mb.sql(TUMBLE + "\nEMIT ON UPDATE", tx=src)
    assert stream.write_memory("emit_ok", output_mode="update").output_mode == "update"
    with pytest.raises(mb.SQLError) as info:
        stream.write_memory("emit_conflict", output_mode="append")
    assert (info.value.line, info.value.column) == (4, 1)
    assert "EMIT ON WINDOW CLOSE" in info.value.fix
    # a step after the query keeps its EMIT
    assert stream.filter(pl.col("n") > 1).write_memory("emit_step").output_mode == "update"


def test_sql_context_set_refuses_unknown_options_and_durations() -> None:
    ctx = mb.SQLContext()
    with pytest.raises(mb.PlanError, match=r"table\.exec\.emit\.allow-lateness"):
        ctx.set("table.exec.state.ttl", "1 h")
    with pytest.raises(mb.PlanError, match="not a duration"):
        ctx.set("table.exec.emit.allow-lateness", "an hour")


SCRIPT = """SET 'table.exec.emit.allow-lateness' = '{lateness}';
CREATE TABLE tx (k BIGINT, v BIGINT, ts TIMESTAMP(3),
  WATERMARK FOR ts AS ts - INTERVAL '20' SECOND)
  WITH ('connector' = 'files', 'path' = '{path}', 'format' = 'json');
CREATE TABLE out WITH ('connector' = 'memory'{option});
INSERT INTO out
SELECT window_start, window_end, k, COUNT(*) AS n
FROM TABLE(TUMBLE(TABLE tx, DESCRIPTOR(ts), INTERVAL '1' MINUTE))
GROUP BY window_start, window_end, k
HAVING COUNT(*) >= 3 EMIT ON UPDATE;
"""


def test_script_set_and_emit_reach_the_writer(tmp_path: Path) -> None:
    script = compile_script(SCRIPT.format(lateness="1 h", path=tmp_path, option=""))
    (query,) = script.queries
    assert query.writer.output_mode == "update"
    assert "allowed_lateness_ms=3600000" in query.writer.plan.explain()
    same = compile_script(SCRIPT.format(lateness="1 h", path=tmp_path,
                                        option=", 'output_mode' = 'update'"))
    assert same.queries[0].writer.output_mode == "update"


@pytest.mark.parametrize(
    ("lateness", "option", "where", "words"),
    [
        ("1 h", ", 'output_mode' = 'append'", (10, 22), "line 5, column 48"),
        ("soon", "", (1, 40), "not a duration"),
    ],
)
def test_script_emit_and_set_mistakes_at_line_and_column(
    tmp_path: Path, lateness: str, option: str, where: tuple[int, int], words: str
) -> None:
    line, column = where
    with pytest.raises(mb.SQLError) as info:
        compile_script(SCRIPT.format(lateness=lateness, path=tmp_path, option=option),
                       file="job.sql")
    assert (info.value.line, info.value.column) == (line, column)
    assert words in str(info.value)
    assert str(info.value).startswith(f"job.sql:{line}:{column}:")


def test_script_set_of_an_unknown_option_is_refused(tmp_path: Path) -> None:
    text = SCRIPT.format(lateness="1 h", path=tmp_path, option="").replace(
        "table.exec.emit.allow-lateness", "table.exec.state.ttl")
    with pytest.raises(mb.SQLError, match=r"table\.exec\.state\.ttl") as info:
        compile_script(text, file="job.sql")
    assert (info.value.line, info.value.column) == (1, 5)
