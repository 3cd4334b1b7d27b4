"""What SQL cannot run incrementally is refused when the query is built, naming
the construct, its line and column, and what to write instead."""

from __future__ import annotations

import polars as pl
import pytest

import microbatch as mb

SCHEMA = {"ts": pl.Datetime("ms", "UTC"), "k": pl.Int64, "v": pl.Int64}


def _streams() -> dict[str, object]:
    tx = mb.read_memory(schema=SCHEMA).with_watermark("ts", "10s")
    return {
        "tx": tx,
        "raw": mb.read_memory(schema=SCHEMA),
        "other": mb.read_memory(schema=SCHEMA).with_watermark("ts", "10s"),
        "cards": pl.DataFrame({"k": [1], "country": ["FR"]}),
    }


TUMBLE = "TABLE(TUMBLE(TABLE tx, DESCRIPTOR(ts), INTERVAL '1' MINUTE))"
DEDUPE = "ROW_NUMBER() OVER (PARTITION BY window_start, window_end, k ORDER BY ts) AS rn"

CASES = [
    # (query, construct, line, column, a word of the fix)
    (
        "SELECT window_start, COUNT(*) AS n\n"
        "FROM TABLE(CUMULATE(TABLE tx, DESCRIPTOR(ts), INTERVAL '1' HOUR))\n"
        "GROUP BY window_start, window_end",
        "CUMULATE",
        2,
        12,
        "the step then the size",
    ),
    ("SELECT k, v FROM tx\nORDER BY v", "ORDER BY", 2, 1, "Sort the sink"),
    ("SELECT k FROM tx LIMIT 10", "LIMIT", 1, 18, "WHERE"),
    ("SELECT DISTINCT k FROM tx", "DISTINCT", 1, 8, "drop_duplicates"),
    (
        f"SELECT DISTINCT window_start, COUNT(*) AS n FROM {TUMBLE}"
        " GROUP BY window_start, window_end",
        "DISTINCT",
        1,
        8,
        "window_start, window_end, keys",
    ),
    (f"SELECT DISTINCT window_start, v + 1 AS w FROM {TUMBLE}", "DISTINCT", 1, 31, "columns"),
    ("SELECT k,\n  MEDIAN(v) AS m FROM tx GROUP BY k", "MEDIAN", 2, 3, "COUNT, SUM"),
    ("SELECT k, COUNT(DISTINCT v) AS m FROM tx GROUP BY k", "COUNT(DISTINCT)", 1, 11, "COUNT(*)"),
    ("SELECT k, v, COUNT(*) AS n FROM tx GROUP BY k", "GROUP BY", 1, 11, "aggregate it"),
    ("SELECT k FROM tx GROUP BY k", "GROUP BY", 1, 18, "drop_duplicates"),
    ("SELECT * FROM tx a JOIN other b ON a.k = b.k", "JOIN", 1, 20, "BETWEEN"),
    (
        "SELECT * FROM tx a JOIN other b ON a.k = b.k\n  AND b.ts >= a.ts",
        "JOIN",
        1,
        20,
        "join_interval",
    ),
    (
        "SELECT * FROM tx a JOIN other b ON a.k = b.k AND b.ts\n"
        "  BETWEEN a.ts AND a.ts + INTERVAL '1' MINUTE AND b.v > 0",
        "JOIN ON",
        2,
        51,
        "WHERE",
    ),
    (
        "SELECT * FROM tx a JOIN other b ON a.k = b.k AND b.ts > a.ts\n"
        "  AND b.ts <= a.ts + INTERVAL '1' MINUTE",
        "JOIN ON",
        1,
        50,
        "BETWEEN",
    ),
    (
        "SELECT * FROM tx a JOIN other b ON a.k = b.k\n"
        "  AND b.ts BETWEEN a.ts + INTERVAL '1' MINUTE AND a.ts",
        "JOIN ON",
        2,
        7,
        "lower bound first",
    ),
    (
        "SELECT * FROM tx a JOIN raw b ON a.k = b.k\n"
        "  AND b.ts BETWEEN a.ts AND a.ts + INTERVAL '1' MINUTE",
        "JOIN",
        1,
        20,
        "with_watermark",
    ),
    (
        "SELECT * FROM tx a JOIN raw FOR SYSTEM_TIME AS OF a.ts AS b ON a.k = b.k",
        "temporal JOIN",
        1,
        25,
        "with_watermark",
    ),
    (
        "SELECT * FROM tx a RIGHT JOIN other FOR SYSTEM_TIME AS OF a.ts AS b ON a.k = b.k",
        "RIGHT JOIN",
        1,
        20,
        "LEFT JOIN",
    ),
    (
        "SELECT * FROM tx a JOIN cards FOR SYSTEM_TIME AS OF a.ts AS b ON a.k = b.k",
        "temporal JOIN",
        1,
        20,
        "FOR SYSTEM_TIME AS OF",
    ),
    ("SELECT k FROM (SELECT k FROM tx)", "subquery", 1, 16, "Register"),
    # Flink's deduplication (ROW_NUMBER ... = 1): only its windowed top-1 form
    (
        "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY k ORDER BY ts) AS rn FROM tx)\n"
        "WHERE rn = 1",
        "ROW_NUMBER",
        1,
        26,
        "drop_duplicates(subset, within=",
    ),
    (
        "SELECT * FROM (SELECT *,\n"
        "  ROW_NUMBER() OVER (PARTITION BY k ORDER BY ts DESC) AS rn FROM tx) WHERE rn = 1",
        "ROW_NUMBER",
        2,
        3,
        "TUMBLE",
    ),
    (f"SELECT * FROM (SELECT *, {DEDUPE}\nFROM {TUMBLE}) WHERE rn <= 3", "top-N", 2, 74, "rn = 1"),
    (
        "SELECT * FROM (SELECT *, "
        + DEDUPE.replace("ORDER BY ts", "\n  ORDER BY v")
        + f" FROM {TUMBLE}) WHERE rn = 1",
        "ORDER BY",
        2,
        3,
        "ORDER BY ts ASC",
    ),
    (
        f"SELECT * FROM (SELECT *, {DEDUPE.replace('window_end, ', '')} FROM {TUMBLE})"
        " WHERE rn = 1",
        "PARTITION BY",
        1,
        45,
        "window_start, window_end",
    ),
    (
        f"SELECT * FROM (SELECT *, {DEDUPE} FROM {TUMBLE})\nWHERE rn = 1 AND v > 0",
        "WHERE",
        2,
        7,
        "inner SELECT's WHERE",
    ),
    (f"SELECT * FROM (SELECT *, {DEDUPE} FROM {TUMBLE})", "ROW_NUMBER", 1, 26, "WHERE rn = 1"),
    (
        f"SELECT * FROM (SELECT *, {DEDUPE} FROM {TUMBLE}) WHERE rn = 1\nEMIT ON UPDATE",
        "EMIT ON UPDATE",
        2,
        1,
        "Drop the EMIT",
    ),
    (
        f"SELECT * FROM (SELECT *, {DEDUPE.replace('ROW_NUMBER', 'RANK')} FROM {TUMBLE})"
        " WHERE rn = 1",
        "OVER",
        1,
        26,
        "window TVF",
    ),
    (
        f"SELECT k, COUNT(*) AS n FROM (SELECT *, {DEDUPE} FROM {TUMBLE}) WHERE rn = 1"
        " GROUP BY k",
        "GROUP BY",
        1,
        200,
        "register the result",
    ),
    (
        f"SELECT * FROM (SELECT *, v + 1 AS w, {DEDUPE} FROM {TUMBLE}) WHERE rn = 1",
        "SELECT",
        1,
        26,
        "outer SELECT",
    ),
    ("WITH t AS (SELECT k FROM tx) SELECT k FROM t", "WITH", 1, 1, "Register"),
    ("SELECT k, SUM(v) OVER (PARTITION BY k) AS s FROM tx", "OVER", 1, 11, "window TVF"),
    (
        f"SELECT COUNT(*) AS n FROM {TUMBLE.replace('TABLE tx', 'TABLE raw')}\n"
        "GROUP BY window_start, window_end",
        "TUMBLE",
        1,
        62,
        "with_watermark",
    ),
    (f"SELECT k FROM {TUMBLE}", "TUMBLE", 1, 21, "GROUP BY window_start"),
    (f"SELECT COUNT(*) AS n FROM {TUMBLE} GROUP BY k", "GROUP BY", 1, 88, "window_start"),
    ("SELECT kk FROM tx", "column", 1, 8, "existing column"),
    ("SELECT k FROM nope", "FROM", 1, 15, "Register"),
    ("SELECT k FROM cards", "FROM", 1, 15, "JOIN the static table"),
    ("SELECT * FROM tx t FULL JOIN cards c ON t.k = c.k", "FULL JOIN", 1, 20, "LEFT JOIN"),
    ("SELECT k FROM tx UNION SELECT k FROM other", "UNION", 1, 8, "SELECT"),
    (
        "SELECT COUNT(*) AS n FROM TABLE(SESSION(TABLE tx PARTITION BY k, DESCRIPTOR(ts),"
        " INTERVAL '1' MINUTE)) GROUP BY window_start, window_end",
        "SESSION",
        1,
        33,
        "PARTITION BY and GROUP BY",
    ),
]


@pytest.mark.parametrize(("query", "construct", "line", "column", "fix"), CASES)
def test_refused_with_line_column_and_fix(
    query: str, construct: str, line: int, column: int, fix: str
) -> None:
    with pytest.raises(mb.SQLError) as info:
        mb.sql(query, **_streams())  # type: ignore[arg-type]
    err = info.value
    assert (err.construct, err.line, err.column) == (construct, line, column), str(err)
    assert fix in err.fix
    assert str(err).startswith(f"SQL line {line}, column {column}: {construct}: ")
    assert isinstance(err, mb.PlanError)


def test_a_syntax_error_from_mb_sql_names_line_and_column() -> None:
    with pytest.raises(mb.SQLError) as info:
        mb.sql("SELECT k\nFROM tx\nWHERE v >", **_streams())  # type: ignore[arg-type]
    assert (info.value.construct, info.value.line) == ("syntax", 3)


def test_one_query_at_a_time() -> None:
    with pytest.raises(mb.SQLError, match="expected one SELECT, got 2"):
        mb.sql("SELECT k FROM tx; SELECT v FROM tx", **_streams())  # type: ignore[arg-type]
    with pytest.raises(mb.SQLError, match="runs one SELECT") as info:
        mb.sql("INSERT INTO out SELECT k FROM tx", **_streams())  # type: ignore[arg-type]
    assert info.value.construct == "INSERT"
