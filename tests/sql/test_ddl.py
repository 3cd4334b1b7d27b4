"""``CREATE TABLE ... WITH (...)`` onto sources and sinks, and ``${NAME}`` in scripts.

Sources declared in SQL read what the Python reader reads (real files, a real
Delta table, the generator), with the declared types and watermark; every
mistake is refused at the line and column of the script as written.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

import microbatch as mb
from microbatch.sql.ddl import TableDef
from microbatch.sql.params import substitute
from microbatch.sql.parse import parse_statements
from microbatch.sql.positions import ScriptError
from microbatch.sql.script import _Compiler, compile_script


def declare(text: str) -> TableDef:
    """The table of a one-statement script (positions in ``text``)."""
    compiler = _Compiler(substitute(text, {}), "t.sql")
    (tree,) = parse_statements(text)
    return TableDef.from_create(tree, compiler._locate)  # type: ignore[arg-type]


def run_source(stream: mb.Stream, name: str) -> pl.DataFrame:
    query = stream.write_memory(name).start(trigger="available-now")
    assert query.await_termination(timeout=60)
    return mb.table(name)


# ------------------------------------------------------------------ ${NAME}


@given(st.lists(st.sampled_from(["a", "bb", "c_1"]), min_size=1, max_size=6),
       st.dictionaries(st.sampled_from(["a", "bb", "c_1"]), st.text("xyz\n", max_size=5),
                       min_size=3))
@settings(max_examples=50, deadline=None)
def test_substitution_maps_every_position_back(names: list[str], values: dict[str, str]) -> None:
    """Text outside references keeps its line:column in the script as written."""
    original = "\n".join(f"k{i} ${{{n}}} end{i}" for i, n in enumerate(names))
    used = {n: values[n] for n in set(names)}
    result = substitute(original, used)
    assert result.text == "\n".join(f"k{i} {used[n]} end{i}" for i, n in enumerate(names))
    for i in range(len(names)):
        for word in (f"k{i} ", f"end{i}"):
            new = result.text.index(word)
            old = original.index(word)
            assert result.position(new) == (old_line := original.count("\n", 0, old) + 1,
                                            old - (original.rfind("\n", 0, old) + 1) + 1)
            assert old_line == i + 1


def test_missing_param_names_its_line_and_column() -> None:
    with pytest.raises(ScriptError, match=r"^job.sql:2:13: \$\{output\} has no value.*"
                                          r"--param output=VALUE") as info:
        substitute("SELECT 1;\nINSERT INTO ${output}", {"outptu": "x"}, file="job.sql")
    assert (info.value.line, info.value.column) == (2, 13)


def test_unknown_param_is_refused_with_the_names_used() -> None:
    with pytest.raises(ScriptError, match=r"unknown --param 'outptu'.*'output'"):
        substitute("${output}", {"output": "x", "outptu": "y"}, file="job.sql")


def test_malformed_reference_and_literal_dollar() -> None:
    with pytest.raises(ScriptError, match=r"^job.sql:1:8: '\$\{a b\}' is not a parameter"):
        substitute("SELECT ${a b}", {}, file="job.sql")
    assert substitute("'$${keep}' ${x}", {"x": "1"}).text == "'${keep}' 1"


# ------------------------------------------------------------------ sources


def test_files_source_reads_the_declared_columns_and_types(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    data = pl.DataFrame({"id": [3, 1, 2], "amount": ["1.50", "2.25", "3.00"],
                         "ts": ["2026-01-01T00:00:01", "2026-01-01T00:00:02",
                                "2026-01-01T00:00:03"]})
    data.slice(0, 2).write_csv(landing / "a.csv")
    data.slice(2).write_csv(landing / "b.csv")
    table = declare(
        "CREATE TABLE tx (id BIGINT, amount DECIMAL(10, 2), ts TIMESTAMP(3),\n"
        "  WATERMARK FOR ts AS ts - INTERVAL '5' SECOND)\n"
        f"WITH ('connector' = 'files', 'path' = '{landing}', 'format' = 'csv',\n"
        "      'max_files_per_batch' = '1')")
    stream = table.source()
    assert stream.schema == pl.Schema({"id": pl.Int64, "amount": pl.Decimal(10, 2),
                                       "ts": pl.Datetime("ms", "UTC")})
    assert "Watermark(ts, delay=5000ms)" in stream.explain()
    got = run_source(stream, "ddl_files")
    expected = data.select(
        pl.col("id"), pl.col("amount").cast(pl.Decimal(10, 2)),
        pl.col("ts").str.to_datetime().dt.replace_time_zone("UTC").dt.cast_time_unit("ms"))
    assert_frame_equal(got, expected)


def test_generator_source_casts_to_the_declared_columns() -> None:
    table = declare(
        "CREATE TABLE g (event_id BIGINT, amount DECIMAL(18, 2)) WITH ('connector' = "
        "'generator', 'rows_per_second' = 'none', 'total_rows' = '500', 'seed' = '3', "
        "'start' = '2026-01-01T00:00:00Z', 'max_records_per_batch' = '128')")
    got = run_source(table.source(), "ddl_gen")
    oracle = run_source(mb.generate(rows_per_second=None, total_rows=500, seed=3,
                                    start="2026-01-01T00:00:00Z"), "ddl_gen_oracle")
    assert_frame_equal(got, oracle.select("event_id", pl.col("amount").cast(pl.Decimal(18, 2))))


def test_delta_source_and_sink(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    pl.DataFrame({"k": ["a", "b"], "x": [1, 2]}).write_delta(lake)
    pl.DataFrame({"k": ["c"], "x": [3]}).write_delta(lake, mode="append")
    source = declare(f"CREATE TABLE t (k STRING, x INT) WITH ('connector' = 'delta', "
                     f"'path' = '{lake}')")
    sink = declare(f"CREATE TABLE out WITH ('connector' = 'delta', 'path' = "
                   f"'{tmp_path / 'out'}')")
    query = sink.writer(source.source()).start(checkpoint=tmp_path / "chk",
                                               trigger="available-now")
    assert query.await_termination(timeout=60)
    got = pl.read_delta(str(tmp_path / "out")).sort("k")
    assert_frame_equal(got, pl.read_delta(str(lake)).sort("k").with_columns(
        pl.col("x").cast(pl.Int32)))


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(("text", "where", "message"), [
    ("CREATE TABLE t (a INT)\n  WITH ('connector' = 'files', 'path' = 'x',\n"
     "        'max_file_per_batch' = '1')", (3, 9), "did you mean 'max_files_per_batch'"),
    ("CREATE TABLE t (a INT) WITH ('connector' = 'filez')", (1, 30), "did you mean 'files'"),
    ("CREATE TABLE t (a INT) WITH ('connector' = 'files', 'path' = 'p', "
     "'max_files_per_batch' = 'two')", (1, 67), "expected an integer"),
    ("CREATE TABLE t (a INT) WITH ('path' = 'p')", (1, 14), "has no 'connector' option"),
    ("CREATE TABLE t (a INT, WATERMARK FOR a AS a * 2) WITH ('connector' = 'files')",
     (1, 38), "column minus a fixed interval"),
    ("CREATE TABLE t (a INT, WATERMARK FOR b AS b) WITH ('connector' = 'files')",
     (1, 14), "names no column"),
    ("CREATE TABLE t (a GEOMETRY) WITH ('connector' = 'files')", (1, 17), "not taken"),
])
def test_declaration_mistakes_point_at_the_script(
    text: str, where: tuple[int, int], message: str
) -> None:
    with pytest.raises(mb.SQLError, match=message) as info:
        declare(text)
    assert (info.value.line, info.value.column) == where


def test_a_role_the_connector_lacks_is_refused() -> None:
    console = declare("CREATE TABLE c WITH ('connector' = 'console')")
    with pytest.raises(mb.SQLError, match="only a sink, so it cannot be read"):
        console.source()
    files = declare("CREATE TABLE f WITH ('connector' = 'files', 'path' = 'p', "
                    "'partition_by' = 'k')")
    with pytest.raises(mb.SQLError, match="takes no option 'partition_by' as a source"):
        files.source()
    kafka = declare("CREATE TABLE k (a INT) WITH ('connector' = 'kafka', 'topic' = 't')")
    with pytest.raises(mb.SQLError, match="needs 'bootstrap'"):
        kafka.source()


def test_an_updating_view_must_keep_its_upsert_keys() -> None:
    """A windowed view is upserted by (window_start, window_end, keys): a SELECT
    that drops one is refused at the view's name, not failed at run time."""
    text = ("CREATE TABLE tx (card_id BIGINT, event_time TIMESTAMP(3), WATERMARK FOR\n"
            "  event_time AS event_time - INTERVAL '1' SECOND) WITH ('connector' = 'generator');\n"
            "CREATE MATERIALIZED VIEW v AS SELECT window_start, card_id, COUNT(*) AS n\n"
            "FROM TABLE(TUMBLE(TABLE tx, DESCRIPTOR(event_time), INTERVAL '1' MINUTE))\n"
            "GROUP BY window_start, window_end, card_id;")
    with pytest.raises(mb.SQLError, match=r"drops window_end\. Select window_end too") as info:
        compile_script(text, file="v.sql")
    assert (info.value.line, info.value.column) == (3, 26)
    script = compile_script(text.replace("window_start, card_id, COUNT",
                                         "window_start, window_end, card_id, COUNT"))
    assert script.queries[0].writer.output_mode == "update"
