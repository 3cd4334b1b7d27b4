"""``PROCTIME()`` in SQL: a processing-time window in SQL equals its Python
twin (``with_processing_time``) under random splits and clock steps, and a
``proc_time AS PROCTIME()`` column of ``CREATE TABLE`` is each batch's
recorded timestamp (``offsets/N``), windows over it equal to one-shot Polars."""

from __future__ import annotations

import itertools
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracles import tumbling_or_hopping

import microbatch as mb
from microbatch.checkpoint import Checkpoint
from microbatch.sql.ddl import TableDef
from microbatch.sql.params import substitute
from microbatch.sql.parse import parse_statements
from microbatch.sql.script import _Compiler, compile_script
from microbatch.testing import StreamTest

SCHEMA = {"k": pl.Int64, "v": pl.Int64}
QUERY = """
    SELECT window_start, window_end, k, COUNT(*) AS n, SUM(v) AS total
    FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(proc_time), INTERVAL '1' MINUTE))
    GROUP BY window_start, window_end, k
"""


def in_sql(src: mb.Stream) -> mb.Stream:
    return mb.sql(QUERY, t=src.with_processing_time("proc_time"))


def in_python(src: mb.Stream) -> mb.Stream:
    return (
        src.with_processing_time("proc_time")
        .group_by(mb.window("proc_time", "1m"), "k")
        .agg(pl.len().alias("n"), pl.col("v").sum().alias("total"))
    )


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(st.tuples(st.integers(0, 3), st.integers(-9, 9)), min_size=1, max_size=30),
    cuts=st.lists(st.integers(0, 30), max_size=6),
    gaps=st.lists(st.integers(0, 100_000), min_size=7, max_size=7),
)
def test_sql_equals_the_python_api(
    rows: list[tuple[int, int]], cuts: list[int], gaps: list[int], tmp_path_factory
) -> None:
    tests = [
        StreamTest(build, schema=SCHEMA, checkpoint=tmp_path_factory.mktemp("chk"))
        for build in (in_sql, in_python)
    ]
    bounds = [0, *sorted({min(c, len(rows)) for c in cuts}), len(rows)]
    for (lo, hi), gap in zip(itertools.pairwise(bounds), gaps, strict=False):
        if hi > lo:
            for test in tests:
                test.advance_clock(gap / 1000).add(
                    pl.DataFrame(rows[lo:hi], schema=SCHEMA, orient="row")
                ).process()
    for test in tests:
        test.advance_clock(120).process()
    sql, python = (t.output for t in tests)
    assert sql.height > 0
    assert sql.equals(python)
    for test in tests:
        test.close()


def declare(text: str) -> TableDef:
    compiler = _Compiler(substitute(text, {}), "t.sql")
    (tree,) = parse_statements(text)
    return TableDef.from_create(tree, compiler._locate)  # type: ignore[arg-type]


def test_a_proctime_column_is_the_stream_s_processing_time() -> None:
    table = declare(
        "CREATE TABLE t (k BIGINT, proc_time AS PROCTIME(), v BIGINT) "
        "WITH ('connector' = 'files', 'path' = 'p', 'format' = 'json')"
    )
    stream = table.source()
    assert stream.schema == pl.Schema(
        {"k": pl.Int64, "v": pl.Int64, "proc_time": pl.Datetime("ms", "UTC")}
    )
    assert stream.explain().splitlines()[0] == "ProcessingTime(proc_time)"


def test_a_script_s_windows_over_proctime_equal_one_shot_over_recorded_times(
    tmp_path: Path,
) -> None:
    """A files source with ``proc_time AS PROCTIME()``, one file per batch: the
    stateless view stamps each file's rows with its batch's ``offsets/N``
    timestamp; the TUMBLE view (flushed at the end) equals one-shot windows
    over those stamps."""
    landing = tmp_path / "landing"
    landing.mkdir()
    files = [pl.DataFrame({"k": [i % 2, 1, 2], "v": [i, 10 * i, 3]}) for i in range(4)]
    for i, df in enumerate(files):
        df.write_parquet(landing / f"part-{i}.parquet")
    script = compile_script(f"""
        CREATE TABLE t (k BIGINT, v BIGINT, proc_time AS PROCTIME())
        WITH ('connector' = 'files', 'path' = '{landing}', 'format' = 'parquet',
              'max_files_per_batch' = '1');
        CREATE MATERIALIZED VIEW stamped AS SELECT k, v, proc_time FROM t;
        CREATE MATERIALIZED VIEW per_minute AS {QUERY};
    """)
    stamped, per_minute = script.queries
    for query in (stamped, per_minute):
        running = query.writer.start(
            checkpoint=tmp_path / query.name, trigger="available-now", flush_at_end=True
        )
        assert running.await_termination(60)
    log = Checkpoint(tmp_path / "stamped").offsets
    expected = pl.concat(
        df.with_columns(
            pl.lit(log.get(i).timestamp_ms)
            .cast(pl.Datetime("ms"))
            .dt.replace_time_zone("UTC")
            .alias("proc_time")
        )
        for i, df in enumerate(files)
    )
    assert mb.table("stamped").sort("proc_time", "k", "v").equals(
        expected.sort("proc_time", "k", "v")
    )
    # the windowed view ran on its own checkpoint: its own recorded times
    log = Checkpoint(tmp_path / "per_minute").offsets
    tagged = pl.concat(
        df.with_columns(pl.from_epoch(pl.lit(log.get(i).timestamp_ms), time_unit="ms")
                        .dt.replace_time_zone("UTC").alias("t"))
        for i, df in enumerate(files)
    )
    oracle = tumbling_or_hopping(
        tagged, time="t", keys=["k"], size_ms=60_000, slide_ms=60_000,
        aggs=[pl.len().cast(pl.Int64).alias("n"), pl.col("v").sum().alias("total")],
    )
    got = mb.table("per_minute").select(
        pl.col("window_start").dt.epoch("ms").alias("ws"), "k", "n", "total"
    )
    assert got.sort("ws", "k").equals(oracle.select("ws", "k", "n", "total").sort("ws", "k"))


@pytest.mark.parametrize(("text", "message"), [
    ("CREATE TABLE t (k BIGINT, x AS k + 1) WITH ('connector' = 'files', 'path' = 'p')",
     "the only computed column is `x AS PROCTIME\\(\\)`"),
    ("CREATE TABLE t (k BIGINT, p AS PROCTIME(), WATERMARK FOR p AS p) "
     "WITH ('connector' = 'files', 'path' = 'p')", "drop WATERMARK FOR p"),
    ("CREATE TABLE t (p AS PROCTIME(), q AS PROCTIME()) "
     "WITH ('connector' = 'files', 'path' = 'p')", "already its PROCTIME\\(\\) column"),
    ("CREATE TABLE t (k BIGINT, p AS PROCTIME()) WITH ('connector' = 'console')",
     "is only a sink"),
    ("CREATE TABLE t (k BIGINT, v AS PROCTIME(), v BIGINT) "
     "WITH ('connector' = 'files', 'path' = 'p')", "v is declared twice"),
])
def test_proctime_mistakes_are_refused(text: str, message: str) -> None:
    with pytest.raises(mb.SQLError, match=message) as info:
        declare(text)
    assert info.value.line == 1


def test_proctime_in_a_select_is_each_batch_s_recorded_time(tmp_path: Path) -> None:
    """``PROCTIME() AS pt`` in a SELECT equals ``with_processing_time("pt")``, row
    for row, and ``pt`` is a time attribute: a view of it windows by processing
    time. ``PROCTIME()`` elsewhere (an expression, WHERE) reads the same time
    from a column the output does not keep."""
    ctx = mb.SQLContext()
    checkpoints = iter(tmp_path / name for name in "abc")

    def stamped(src: mb.Stream) -> mb.Stream:
        return ctx.register("tx", src).sql(
            "SELECT k, v, PROCTIME() AS pt, EXTRACT(SECOND FROM PROCTIME()) AS sec FROM tx "
            "WHERE EXTRACT(YEAR FROM PROCTIME()) > 2000 AND v <> 0"
        )

    def windowed(src: mb.Stream) -> mb.Stream:
        ctx.register("stamped", stamped(src))
        return ctx.sql(QUERY.replace("TABLE t", "TABLE stamped").replace("proc_time", "pt"))

    def python(src: mb.Stream) -> mb.Stream:
        return src.filter(pl.col("v") != 0).with_processing_time("pt").select(
            "k", "v", "pt", pl.col("pt").dt.second().alias("sec")
        )

    tests = [StreamTest(b, schema=SCHEMA, checkpoint=next(checkpoints))
             for b in (stamped, python, windowed)]
    for seconds, rows in [(0, [(1, 2), (2, 0)]), (25.5, [(1, 3)]), (70, [(2, 4), (1, -1)])]:
        for test in tests:
            test.advance_clock(seconds).add(pl.DataFrame(rows, schema=SCHEMA, orient="row"))
            test.process()
    sql, python_out, windows = (t.output for t in tests)
    assert sql.columns == ["k", "v", "pt", "sec"]
    assert sql.drop("sec").equals(python_out.drop("sec"))
    assert (sql["sec"].cast(pl.Int32) == python_out["sec"].cast(pl.Int32)).all()
    times = [int(p["timestamp_ms"]) for p in tests[0].progress]
    assert sql["pt"].dt.epoch("ms").unique(maintain_order=True).to_list() == times
    # the first two batches fall in the first minute, which the third one closes
    first = sql.filter(pl.col("pt").dt.epoch("ms") < times[2])
    want = first.group_by("k").agg(pl.len().alias("n"), pl.col("v").sum().alias("total"))
    got = windows.select("k", pl.col("n").cast(pl.UInt32), "total")
    assert got.sort("k").equals(want.sort("k").with_columns(pl.col("n").cast(pl.UInt32)))
    for test in tests:
        test.close()


def test_proctime_in_an_aggregating_select_is_refused() -> None:
    with pytest.raises(mb.SQLError) as info:
        mb.sql("SELECT k, MAX(PROCTIME()) AS last_seen FROM t GROUP BY k",
               t=mb.read_memory(schema=SCHEMA))
    assert (info.value.construct, info.value.line, info.value.column) == ("PROCTIME()", 1, 15)
    assert "CREATE TABLE" in str(info.value)
