"""The microbatch SQL dialect parses Flink SQL's streaming forms, and a syntax
error names its line and column."""

from __future__ import annotations

import pickle

import pytest
from sqlglot import exp

import microbatch as mb
from microbatch.sql.dialect import WindowTVF
from microbatch.sql.parse import parse_statements, position, refuse, render


def _one(text: str) -> exp.Expr:
    (tree,) = parse_statements(text)
    return tree


def _tvf(text: str) -> WindowTVF:
    tvf = _one(text).find(WindowTVF)
    assert tvf is not None
    return tvf


def _interval(node: exp.Expr) -> tuple[str, str]:
    assert isinstance(node, exp.Interval)
    return node.this.name, node.unit.name.upper()


def test_tumble_parses_table_descriptor_and_size() -> None:
    tvf = _tvf(
        "SELECT window_start, window_end, card_id, COUNT(*) AS n "
        "FROM TABLE(TUMBLE(TABLE tx, DESCRIPTOR(event_time), INTERVAL '1' MINUTE)) "
        "GROUP BY window_start, window_end, card_id HAVING COUNT(*) >= 3"
    )
    assert tvf.kind == "TUMBLE"
    assert tvf.this.name == "tx"
    assert tvf.args["descriptor"].name == "event_time"
    assert [_interval(e) for e in tvf.expressions] == [("1", "MINUTE")]


def test_hop_keeps_slide_then_size_as_flink() -> None:
    tvf = _tvf(
        "SELECT * FROM TABLE(HOP(TABLE tx, DESCRIPTOR(ts), "
        "INTERVAL '1' MINUTE, INTERVAL '5' MINUTES))"
    )
    assert tvf.kind == "HOP"
    assert [_interval(e) for e in tvf.expressions] == [("1", "MINUTE"), ("5", "MINUTES")]


@pytest.mark.parametrize(
    ("partition", "keys"),
    [("card_id", ["card_id"]), ("(card_id, merchant)", ["card_id", "merchant"])],
)
def test_session_takes_partition_by(partition: str, keys: list[str]) -> None:
    tvf = _tvf(
        f"SELECT * FROM TABLE(SESSION(TABLE tx PARTITION BY {partition}, "
        "DESCRIPTOR(event_time), INTERVAL '30' SECOND))"
    )
    assert tvf.kind == "SESSION"
    assert [c.name for c in tvf.args["partition_by"]] == keys
    assert [_interval(e) for e in tvf.expressions] == [("30", "SECOND")]


def test_cumulate_parses_step_then_size() -> None:
    tvf = _tvf(
        "SELECT * FROM TABLE(CUMULATE(TABLE tx, DESCRIPTOR(ts), "
        "INTERVAL '1' HOUR, INTERVAL '1' DAY))"
    )
    assert tvf.kind == "CUMULATE"
    assert [_interval(e) for e in tvf.expressions] == [("1", "HOUR"), ("1", "DAY")]


@pytest.mark.parametrize(
    "unit", ["SECOND", "SECONDS", "MINUTE", "MINUTES", "HOUR", "HOURS", "DAY", "DAYS"]
)
def test_interval_units_singular_and_plural(unit: str) -> None:
    tvf = _tvf(f"SELECT * FROM TABLE(TUMBLE(TABLE tx, DESCRIPTOR(ts), INTERVAL '10' {unit}))")
    assert [_interval(e) for e in tvf.expressions] == [("10", unit)]


def test_window_tvf_renders_back_as_written() -> None:
    text = (
        "SELECT * FROM TABLE(SESSION(TABLE tx PARTITION BY card_id, DESCRIPTOR(event_time), "
        "INTERVAL '30' SECOND))"
    )
    assert render(_one(text)) == text


def test_create_table_with_watermark_and_options() -> None:
    tree = _one(
        "CREATE TABLE tx (\n"
        "  card_id BIGINT,\n"
        "  amount DOUBLE,\n"
        "  event_time TIMESTAMP(3),\n"
        "  WATERMARK FOR event_time AS event_time - INTERVAL '10' SECOND\n"
        ") WITH ('connector' = 'files', 'path' = '/data/tx', 'format' = 'parquet')"
    )
    assert isinstance(tree, exp.Create)
    schema = tree.this
    assert [c.name for c in schema.expressions if isinstance(c, exp.ColumnDef)] == [
        "card_id",
        "amount",
        "event_time",
    ]
    (watermark,) = [c for c in schema.expressions if isinstance(c, exp.WatermarkColumnConstraint)]
    assert watermark.this.name == "event_time"
    delay = watermark.expression
    assert isinstance(delay, exp.Sub)
    assert _interval(delay.expression) == ("10", "SECOND")
    options = {p.this.name: p.args["value"].name for p in tree.args["properties"].expressions}
    assert options == {"connector": "files", "path": "/data/tx", "format": "parquet"}


def test_for_system_time_as_of_is_a_version_on_the_joined_table() -> None:
    tree = _one(
        "SELECT o.id, r.rate FROM orders AS o "
        "JOIN rates FOR SYSTEM_TIME AS OF o.ts AS r ON o.currency = r.currency"
    )
    (join,) = tree.args["joins"]
    version = join.this.args["version"]
    assert isinstance(version, exp.Version)
    assert version.args["kind"] == "AS OF"
    assert version.expression.sql() == "o.ts"


def test_several_statements_and_empty_ones() -> None:
    trees = parse_statements("SELECT 1;\n;\nINSERT INTO out SELECT a FROM t;")
    assert [t.key for t in trees] == ["select", "insert"]


@pytest.mark.parametrize(
    ("text", "line", "column", "near"),
    [
        ("SELECT a,\n  b FROM t WHERE\n  abcdef FROMM x", 3, 10, "FROMM"),
        ("SELECT *\nFROM TABLE(TUMBLE(tx, DESCRIPTOR(ts), INTERVAL '1' MINUTE))", 2, 19, "tx"),
        ("SELECT 1;\nSELECT 'abc", 2, 8, None),
    ],
)
def test_syntax_error_names_line_and_column(
    text: str, line: int, column: int, near: str | None
) -> None:
    with pytest.raises(mb.SQLError) as info:
        parse_statements(text)
    err = info.value
    assert (err.line, err.column, err.construct) == (line, column, "syntax")
    assert f"line {line}, column {column}" in str(err)
    assert isinstance(err, mb.PlanError)
    if near is not None:
        assert text.splitlines()[line - 1][column - 1 :].startswith(near)


def test_position_and_refuse_point_at_a_node() -> None:
    text = "SELECT a\nFROM t\nORDER BY a"
    tree = _one(text)
    order = tree.args["order"]
    assert position(order.expressions[0], text) == (3, 10)
    err = refuse(order.expressions[0], text, construct="ORDER BY", problem="no.", fix="Do X.")
    assert (err.line, err.column) == (3, 10)
    again = pickle.loads(pickle.dumps(err))
    assert (again.line, again.column, again.construct, again.fix, str(again)) == (
        3,
        10,
        "ORDER BY",
        "Do X.",
        str(err),
    )
