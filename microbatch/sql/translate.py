"""A SELECT onto the Python API's plan: the same nodes, operators and state.

Stateless SQL (projection, ``WHERE``, ``CASE``, casts, the functions Polars
SQL supports) becomes ``filter``/``select`` steps whose expressions are
``pl.sql_expr`` of the SQL text; a window TVF with ``GROUP BY window_start,
window_end, keys`` becomes ``group_by(mb.window(...) | mb.cumulate_window(...)
| mb.session_window(...), keys).agg(...)``, ``HAVING`` a ``filter`` after it, a
``JOIN`` with a static table ``join_static``, a ``JOIN`` of two streams bounded in time
``join_interval``, ``FOR SYSTEM_TIME AS OF`` a stream of versions
``join_asof_table``, ``SELECT DISTINCT`` over a window TVF a ``group_by`` of the
window and keys, Flink's deduplication (a ``ROW_NUMBER() OVER (PARTITION BY
window_start, window_end, keys ORDER BY ts ASC|DESC)`` subquery kept at ``rownum
= 1``) a ``group_by`` of the window and keys taking each other column's
``first()``/``last()``; ``EMIT`` the writers' output mode (``ON WINDOW CLOSE``/``FINAL``:
``append``, ``ON UPDATE``: ``update``, ``CHANGES``: ``changelog``), and ``HAVING``
on a window under an early ``EMIT`` ``fire_once(condition, corrections=True)``.
Everything else is refused here, when the query is built, with a
:class:`~microbatch.exceptions.SQLError` naming the construct, its line and column,
and what to write instead (docs/sql.md, "Queries").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from difflib import get_close_matches
from typing import Any, cast

import polars as pl
from sqlglot import exp

from microbatch.api.stream import Stream
from microbatch.exceptions import PlanError, SQLError
from microbatch.plan.joins import StaticTable
from microbatch.plan.nodes import WatermarkNode
from microbatch.plan.windows import cumulate_window, session_window, window
from microbatch.sql.dialect import Emit, WindowTVF
from microbatch.sql.parse import position, refuse
from microbatch.types import OutputMode
from sinks.changelog import CHANGE_TYPE

__all__ = ["StaticInput", "translate_select"]

StaticInput = pl.DataFrame | str | os.PathLike[str]
"""A static table SQL can join: a DataFrame, or a Parquet or Delta table path."""

_UNITS = {
    "MILLISECOND": "ms",
    "SECOND": "s",
    "MINUTE": "m",
    "HOUR": "h",
    "DAY": "d",
}
_AGGS: dict[type[exp.Expr], str] = {
    exp.Sum: "sum",
    exp.Min: "min",
    exp.Max: "max",
    exp.Avg: "mean",
    exp.FirstValue: "first",
    exp.First: "first",
    exp.LastValue: "last",
    exp.Last: "last",
}
_WINDOW_COLUMNS = ("window_start", "window_end")
PROCTIME_COLUMN = "__sql_proctime"
"""The hidden column ``PROCTIME()`` reads when the SELECT list does not name it."""


@dataclass
class _Scope:
    """The columns a query's expressions may name: ``schema`` (the stream's
    current columns) and, per table alias, its SQL names to stream columns."""

    schema: pl.Schema
    qualified: dict[str, dict[str, str]] = field(default_factory=dict)


class _Translator:
    def __init__(
        self,
        text: str,
        streams: Mapping[str, Stream],
        tables: Mapping[str, StaticInput],
        allowed_lateness: str | None = None,
    ) -> None:
        self.text = text
        self.streams = streams
        self.tables = tables
        self.allowed_lateness = allowed_lateness
        self.emit: Emit | None = None

    # ------------------------------------------------------------ helpers

    def error(
        self, node: exp.Expr, construct: str, problem: str, fix: str, keyword: str | None = None
    ) -> Exception:
        return refuse(
            node, self.text, construct=construct, problem=problem, fix=fix, keyword=keyword
        )

    def resolve(self, column: exp.Column, scope: _Scope) -> str:
        """The stream column a SQL column reference names."""
        name = column.name
        qualifier = column.table
        if qualifier:
            names = scope.qualified.get(qualifier)
            if names is None:
                raise self.error(
                    column,
                    "column",
                    f"{qualifier!r} is not a table of this query's FROM.",
                    f"Use one of {sorted(scope.qualified)} (or no qualifier).",
                )
            if name in names:
                return names[name]
            candidates = list(names)
        else:
            if name in scope.schema:
                return name
            candidates = list(scope.schema)
        close = get_close_matches(name, candidates, n=3)
        hint = f" Did you mean {close}?" if close else ""
        raise self.error(
            column,
            "column",
            f"no column {name!r}; the input has {candidates}.{hint}",
            "Name an existing column.",
        )

    def expr(self, node: exp.Expr, scope: _Scope) -> pl.Expr:
        """``node`` as a Polars expression: its columns resolved against ``scope``,
        then the SQL text handed to ``pl.sql_expr``."""
        for bad in node.find_all(exp.Subquery, exp.Select, exp.Window):
            if isinstance(bad, exp.Window):
                raise self.error(
                    bad,
                    "OVER",
                    "window functions (OVER) have no incremental form on a stream.",
                    "Aggregate per event-time window with a window TVF and GROUP BY "
                    "window_start, window_end instead.",
                )
            raise self.error(
                bad,
                "subquery",
                "a subquery inside an expression is not translated.",
                "Join the table instead, or register the inner query as a stream "
                "(SQLContext.register(name, ctx.sql(inner))) and select from it.",
            )
        if isinstance(node, exp.AggFunc):
            raise self.error(node, node.key.upper(), "an aggregate outside GROUP BY context.", "")
        if isinstance(node, exp.Column):
            return pl.col(self.resolve(node, scope))
        copy = node.copy()
        for column in list(copy.find_all(exp.Column)):
            column.replace(exp.column(self.resolve(column, scope), quoted=True))
        sql = copy.sql(dialect="duckdb")
        try:
            return pl.sql_expr(sql)
        except Exception as err:  # Polars' SQL errors have no common base worth naming
            raise self.error(
                node,
                "expression",
                f"Polars SQL cannot translate {sql!r}: {err}.",
                "Use a function Polars SQL supports (docs.pola.rs, SQL functions).",
            ) from None

    def output_name(self, item: exp.Expr, value: pl.Expr) -> str:
        if isinstance(item, exp.Alias):
            return item.alias
        if isinstance(item, exp.Column):
            return item.name
        name = value.meta.output_name(raise_if_undetermined=False)
        if not name or name == "literal":
            raise self.error(
                item,
                "SELECT",
                "this expression has no name of its own.",
                "Name it: <expression> AS name.",
            )
        return name

    def duration(self, node: exp.Expr, what: str) -> str:
        """An ``INTERVAL 'n' UNIT`` literal as a duration string (``"10s"``)."""
        if isinstance(node, exp.Interval) and node.unit is not None:
            unit = node.unit.name.upper().removesuffix("S")
            amount = node.this.name if node.this is not None else ""
            if unit in _UNITS and amount.isdigit():
                return f"{int(amount)}{_UNITS[unit]}"
        raise self.error(
            node,
            what,
            f"expected an interval such as INTERVAL '10' SECOND, got {node.sql()!r}.",
            "Write INTERVAL 'n' MILLISECOND|SECOND|MINUTE|HOUR|DAY (plural forms too).",
        )

    # ------------------------------------------------------------ FROM

    def source(self, table: exp.Table) -> tuple[Stream, str]:
        """The registered stream a FROM table names, and its qualifier."""
        name = table.name
        if name not in self.streams:
            if name in self.tables:
                raise self.error(
                    table,
                    "FROM",
                    f"{name!r} is a static table; a query reads a stream.",
                    "Select from a stream and JOIN the static table to it.",
                )
            raise self.error(
                table,
                "FROM",
                f"no stream or table named {name!r}; registered: "
                f"{sorted([*self.streams, *self.tables])}.",
                "Register it first (mb.sql(query, name=stream) or SQLContext.register).",
            )
        return self.streams[name], table.alias_or_name

    def window_of(self, tvf: WindowTVF, stream: Stream) -> Any:
        time = tvf.args["descriptor"].name
        if not any(
            isinstance(node, WatermarkNode) and node.spec.column == time
            for node in stream.plan.walk()
        ):
            raise self.error(
                tvf.args["descriptor"],
                tvf.kind,
                f"the window's time column {time!r} has no watermark, so no window would "
                "ever close.",
                f"Declare one: register stream.with_watermark({time!r}, '10s'), or write "
                f"WATERMARK FOR {time} AS {time} - INTERVAL '10' SECOND in its CREATE TABLE.",
            )
        sizes = tvf.expressions
        expected = {"TUMBLE": 1, "HOP": 2, "CUMULATE": 2, "SESSION": 1}[tvf.kind]
        if len(sizes) != expected:
            raise self.error(
                tvf,
                tvf.kind,
                f"{tvf.kind} takes {expected} interval(s), got {len(sizes)}.",
                "HOP takes the slide then the size, CUMULATE the step then the size (Flink's "
                "order); TUMBLE a size; SESSION a gap.",
                keyword=tvf.kind,
            )
        lateness = self.allowed_lateness
        if tvf.kind == "TUMBLE":
            return window(time, self.duration(sizes[0], "TUMBLE size"), allowed_lateness=lateness)
        if tvf.kind == "HOP":
            slide = self.duration(sizes[0], "HOP slide")
            size = self.duration(sizes[1], "HOP size")
            return window(time, size, slide=slide, allowed_lateness=lateness)
        if tvf.kind == "CUMULATE":
            step = self.duration(sizes[0], "CUMULATE step")
            size = self.duration(sizes[1], "CUMULATE size")
            return cumulate_window(time, size, step, allowed_lateness=lateness)
        if lateness is not None:
            raise self.error(
                tvf,
                "SESSION",
                f"'table.exec.emit.allow-lateness' ({lateness}) applies to TUMBLE, HOP and "
                "CUMULATE "
                "windows; a session's end moves with its rows.",
                "Drop the SET for this query, or use TUMBLE, HOP or CUMULATE.",
                keyword="SESSION",
            )
        return session_window(time, self.duration(sizes[0], "SESSION gap"))

    def from_clause(self, select: exp.Select) -> tuple[Stream, _Scope, WindowTVF | None]:
        from_ = select.args.get("from_")
        if from_ is None:
            raise self.error(select, "FROM", "a query needs a FROM stream.", "Add FROM <stream>.")
        node = from_.this
        tvf: WindowTVF | None = None
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Anonymous):
            inner = node.this.expressions
            if (
                node.this.name.upper() == "TABLE"
                and len(inner) == 1
                and isinstance(inner[0], WindowTVF)
            ):
                tvf = inner[0]
            else:
                raise self.error(
                    node,
                    "FROM",
                    f"table function {node.this.sql()} is not supported.",
                    "Use TABLE(TUMBLE|HOP|CUMULATE|SESSION(TABLE t, DESCRIPTOR(ts), ...)) or a "
                    "stream.",
                )
        if isinstance(node, exp.Subquery | exp.Select):
            raise self.error(
                node,
                "subquery",
                "a subquery in FROM is not translated.",
                "Register the inner query as a stream (SQLContext.register(name, "
                "ctx.sql(inner))) and select from it by name.",
                keyword="SELECT",
            )
        if not isinstance(node, exp.Table):
            raise self.error(node, "FROM", f"{node.sql()} is not a stream.", "FROM <stream>.")
        table = tvf.this if tvf is not None else node
        stream, qualifier = self.source(table)
        if tvf is not None and node.alias:
            qualifier = node.alias
        schema = stream.schema
        scope = _Scope(schema, {qualifier: {c: c for c in schema}})
        if table.name != qualifier:
            scope.qualified.setdefault(table.name, {c: c for c in schema})
        return stream, scope, tvf

    def join(self, stream: Stream, scope: _Scope, join: exp.Join) -> tuple[Stream, _Scope]:
        right = join.this
        if not isinstance(right, exp.Table) or not isinstance(right.this, exp.Identifier):
            raise self.error(right, "JOIN", "only a named table can be joined.", "JOIN <table>.")
        name = right.name
        if name in self.streams:
            if right.args.get("version") is not None:
                return self.temporal_join(stream, scope, join, right)
            return self.interval_join(stream, scope, join, right)
        if right.args.get("version") is not None:
            raise self.error(
                join,
                "temporal JOIN",
                f"FOR SYSTEM_TIME AS OF needs a stream of versions; {name!r} is not one.",
                "Register the versioned table as a stream with a watermark (e.g. "
                "mb.read_delta(path, changes=True).with_watermark(...)), or JOIN the static "
                "table without FOR SYSTEM_TIME AS OF.",
                keyword="JOIN",
            )
        if name not in self.tables:
            self.source(right)  # raises: unknown name
        how = self.join_how(join, ("inner", "left"), "a stream joins a static table")
        table = self.tables[name]
        right_schema = StaticTable.of(table, None).known_schema()
        if right_schema is None:
            raise self.error(right, "JOIN", f"the schema of {name!r} is unknown.", "")
        qualifier = right.alias_or_name
        right_scope = _Scope(right_schema, {qualifier: {c: c for c in right_schema}})
        left_on, right_on = self.equi_keys(join, scope, right_scope, qualifier)
        joined = (
            stream.join_static(table, on=left_on, how=how)  # the Python API's plan
            if left_on == right_on
            else stream.join_static(table, left_on=left_on, right_on=right_on, how=how)
        )
        return joined, self.joined_scope(scope, right_scope, qualifier, (left_on, right_on), joined)

    def join_how(self, join: exp.Join, allowed: tuple[str, ...], what: str) -> Any:
        """The Python API's ``how`` of a SQL join, one of ``allowed``."""
        side = (join.side or "").upper()
        kind = (join.kind or "").upper()
        how = {"": "inner", "LEFT": "left", "RIGHT": "right", "FULL": "full"}.get(side)
        if how not in allowed or kind not in ("", "INNER", "OUTER"):
            written = " ".join(w for w in (side, kind) if w) or "JOIN"
            names = {"inner": "JOIN", "left": "LEFT JOIN", "right": "RIGHT JOIN"}
            raise self.error(
                join,
                f"{side or kind} JOIN",
                f"{what} as {' or '.join(a.upper() for a in allowed)} only, not {written}.",
                "Write " + " or ".join(names.get(a, "FULL JOIN") for a in allowed) + ".",
                keyword=side or kind,
            )
        return how

    def joined_scope(
        self,
        left: _Scope,
        right: _Scope,
        qualifier: str,
        keys: tuple[list[str], list[str]],
        joined: Stream,
    ) -> _Scope:
        """The scope after a join: the left's names, and the right qualifier's names
        for its columns in the output (keys: the left's; the others: in order after
        the left's columns, ``_right``-suffixed on a clash by the Python API)."""
        out = joined.schema
        left_on, right_on = keys
        rename: dict[str, str] = dict(zip(right_on, left_on, strict=True))
        added = list(out)[len(left.schema) :]
        rest = [c for c in right.schema if c not in rename]
        if len(rest) != len(added):  # a temporal join consumes the changelog's column
            rest = [c for c in rest if c != CHANGE_TYPE]
        rename.update(zip(rest, added, strict=True))
        return _Scope(out, {**left.qualified, qualifier: rename})

    def stream_side(self, right: exp.Table) -> tuple[Stream, str, _Scope]:
        other = self.streams[right.name]
        qualifier = right.alias_or_name
        schema = other.schema
        return other, qualifier, _Scope(schema, {qualifier: {c: c for c in schema}})

    def python_api(self, join: exp.Join, build: Any) -> Stream:
        """``build()`` (a Python API join), its ``PlanError`` refused at the JOIN."""
        try:
            result: Stream = build()
        except SQLError:
            raise
        except PlanError as err:
            raise self.error(
                join,
                "JOIN",
                f"{err}.",
                "Change the registered streams as said: the SQL join is the Python API's.",
                keyword="JOIN",
            ) from None
        return result

    def interval_join(
        self, stream: Stream, scope: _Scope, join: exp.Join, right: exp.Table
    ) -> tuple[Stream, _Scope]:
        """A stream-stream join bounded in time: ``join_interval``."""
        other, qualifier, right_scope = self.stream_side(right)
        how = self.join_how(join, ("inner", "left", "right", "full"), "two streams join")
        for side, side_stream in (("left", stream), (right.name, other)):
            if not any(isinstance(n, WatermarkNode) for n in side_stream.plan.walk()):
                raise self.error(
                    join,
                    "JOIN",
                    f"the {side} stream has no watermark: a stream-stream join keeps each "
                    "side's rows until the watermark says no match can arrive.",
                    "Register both with .with_watermark(ts, '10s') (or WATERMARK FOR in "
                    "their CREATE TABLE).",
                    keyword="JOIN",
                )
        keys, rest = self.split_on(join, qualifier)
        left_on, right_on = self.resolve_keys(keys, scope, right_scope)
        times: dict[str, str] = {}
        lower: int | None = None
        upper: int | None = None
        for small, big in self.time_bounds(rest, qualifier):
            (xs, xc, xo), (ys, yc, yo) = (
                self.time_term(n, scope, right_scope, qualifier) for n in (small, big)
            )
            if xs == ys:
                raise self.error(
                    small.parent or small,
                    "JOIN ON",
                    "a time bound compares the two streams' times.",
                    f"Compare a time of {qualifier!r} with one of the other side.",
                )
            for side, column, node in ((xs, xc, small), (ys, yc, big)):
                if times.setdefault(side, column) != column:
                    raise self.error(
                        node,
                        "JOIN ON",
                        f"the {side} stream's time bounds name two columns "
                        f"({times[side]!r}, {column!r}).",
                        "Bound one time column per stream.",
                    )
            if xs == "right":  # right + xo <= left + yo: right - left <= yo - xo
                upper = yo - xo if upper is None else min(upper, yo - xo)
            else:  # left + xo <= right + yo: right - left >= xo - yo
                lower = xo - yo if lower is None else max(lower, xo - yo)
        if lower is None or upper is None or not left_on:
            missing = (
                "ON keys"
                if not left_on
                else "a time bound"
                if lower is None and upper is None
                else "a lower time bound"
                if lower is None
                else "an upper time bound"
            )
            raise self.error(
                join,
                "JOIN",
                f"a join of two streams without {missing} needs unbounded state.",
                f"Bound it in time on both sides: ON a.k = {qualifier}.k AND {qualifier}.ts "
                "BETWEEN a.ts - INTERVAL '1' MINUTE AND a.ts + INTERVAL '10' MINUTE "
                "(Stream.join_interval), or join a static table.",
                keyword="JOIN",
            )
        if lower > upper:
            raise self.error(
                rest[0],
                "JOIN ON",
                f"the time bounds leave an empty interval ({lower} ms to {upper} ms).",
                "Write the lower bound first: BETWEEN a.ts AND a.ts + INTERVAL '10' MINUTE.",
            )
        keys_kw: dict[str, Any] = (
            {"on": left_on} if left_on == right_on else {"left_on": left_on, "right_on": right_on}
        )
        joined = self.python_api(
            join,
            lambda: stream.join_interval(
                other,
                **keys_kw,
                left_time=times["left"],
                right_time=times["right"],
                lower=timedelta(milliseconds=lower),
                upper=timedelta(milliseconds=upper),
                how=how,
            ),
        )
        return joined, self.joined_scope(scope, right_scope, qualifier, (left_on, right_on), joined)

    def temporal_join(
        self, stream: Stream, scope: _Scope, join: exp.Join, right: exp.Table
    ) -> tuple[Stream, _Scope]:
        """``JOIN versions FOR SYSTEM_TIME AS OF s.ts``: ``join_asof_table`` with the
        versioned stream's watermark column as the time a version is valid from."""
        other, qualifier, right_scope = self.stream_side(right)
        version = right.args["version"]
        at = version.expression
        if str(version.args.get("kind", "")).upper() != "AS OF" or not isinstance(at, exp.Column):
            raise self.error(
                version,
                "temporal JOIN",
                "a temporal join is FOR SYSTEM_TIME AS OF <the stream's time column>.",
                f"Write JOIN {right.name} FOR SYSTEM_TIME AS OF s.ts AS {qualifier} ON ...",
                keyword="FOR",
            )
        if at.table == qualifier:
            raise self.error(
                at,
                "temporal JOIN",
                "AS OF names the versioned table's own time.",
                "Name the time column of the stream being enriched (FROM's side).",
            )
        time = self.resolve(at, scope)
        marks = [n.spec.column for n in other.plan.walk() if isinstance(n, WatermarkNode)]
        if not marks:
            raise self.error(
                right,
                "temporal JOIN",
                f"the versioned stream {right.name!r} has no watermark: its event-time "
                "column is the time from which each version is valid.",
                "Register it with .with_watermark('valid_from', '10s') (or WATERMARK FOR "
                "in its CREATE TABLE).",
            )
        how = self.join_how(join, ("inner", "left"), "a temporal join enriches a stream")
        keys, rest = self.split_on(join, qualifier)
        if rest or not keys:
            raise self.error(
                rest[0] if rest else join,
                "JOIN ON",
                "a temporal join's condition is equalities of key columns joined by AND.",
                "Move other conditions to WHERE.",
                keyword=None if rest else "JOIN",
            )
        left_on, right_on = self.resolve_keys(keys, scope, right_scope)
        keys_kw: dict[str, Any] = (
            {"on": left_on} if left_on == right_on else {"left_on": left_on, "right_on": right_on}
        )
        joined = self.python_api(
            join,
            lambda: stream.join_asof_table(other, **keys_kw, time=time, dim_time=marks[0], how=how),
        )
        return joined, self.joined_scope(scope, right_scope, qualifier, (left_on, right_on), joined)

    def time_bounds(
        self, conditions: list[exp.Expr], right_name: str
    ) -> list[tuple[exp.Expr, exp.Expr]]:
        """The ON conditions beyond the keys as pairs ``(x, y)`` meaning ``x <= y``."""
        pairs: list[tuple[exp.Expr, exp.Expr]] = []
        for cond in conditions:
            if len({c.table == right_name for c in cond.find_all(exp.Column)}) < 2:
                raise self.error(
                    cond,
                    "JOIN ON",
                    "a condition on one side's columns is not a join condition.",
                    "Move it to WHERE (or filter the registered stream).",
                )
            if isinstance(cond, exp.Between):
                pairs += [(cond.args["low"], cond.this), (cond.this, cond.args["high"])]
            elif isinstance(cond, exp.LTE):
                pairs.append((cond.this, cond.expression))
            elif isinstance(cond, exp.GTE):
                pairs.append((cond.expression, cond.this))
            elif isinstance(cond, exp.LT | exp.GT):
                raise self.error(
                    cond,
                    "JOIN ON",
                    "an interval join's bounds are inclusive; a strict < or > is not translated.",
                    "Write >= / <= or BETWEEN (inclusive), adjusting the interval.",
                )
            else:
                raise self.error(
                    cond,
                    "JOIN ON",
                    "a stream-stream join's condition is key equalities and time bounds "
                    "joined by AND.",
                    "Move other conditions to WHERE.",
                )
        return pairs

    def time_term(
        self, node: exp.Expr, left: _Scope, right: _Scope, right_name: str
    ) -> tuple[str, str, int]:
        """``t.ts [+|- INTERVAL ...]`` as (side, stream column, offset in ms)."""
        from microbatch.durations import parse_duration_ms

        inner = node.unnest()
        offset = 0
        if isinstance(inner, exp.Add | exp.Sub) and isinstance(inner.expression, exp.Interval):
            amount = parse_duration_ms(
                self.duration(inner.expression, "JOIN ON"), what="interval join bound"
            )
            offset = amount if isinstance(inner, exp.Add) else -amount
            inner = inner.this.unnest()
        if not isinstance(inner, exp.Column):
            raise self.error(
                node,
                "JOIN ON",
                f"a time bound is a time column plus or minus an interval, got {node.sql()!r}.",
                "Write b.ts BETWEEN a.ts - INTERVAL '1' MINUTE AND a.ts + INTERVAL '10' MINUTE.",
            )
        if inner.table == right_name:
            return "right", self.resolve(inner, right), offset
        return "left", self.resolve(inner, left), offset

    def split_on(
        self, join: exp.Join, right_name: str
    ) -> tuple[list[tuple[exp.Column, exp.Column]], list[exp.Expr]]:
        """ON's conjuncts: the key equalities ``(left column, right column)`` (a
        column qualified with ``right_name`` on one side), and the rest."""
        condition = join.args.get("on")
        if condition is None:
            raise self.error(
                join, "JOIN", "a join needs ON keys.", "Write ON a.k = b.k.", keyword="JOIN"
            )
        conjuncts = list(condition.flatten()) if isinstance(condition, exp.And) else [condition]
        keys: list[tuple[exp.Column, exp.Column]] = []
        rest: list[exp.Expr] = []
        for eq in conjuncts:
            if (
                isinstance(eq, exp.EQ)
                and isinstance(eq.this, exp.Column)
                and isinstance(eq.expression, exp.Column)
            ):
                a, b = eq.this, eq.expression
                if a.table == right_name:
                    a, b = b, a
                if b.table != right_name or a.table == right_name:
                    raise self.error(
                        eq,
                        "JOIN ON",
                        f"one side of each equality must name {right_name!r}.",
                        f"Qualify the columns: ON s.k = {right_name}.k.",
                    )
                keys.append((a, b))
            else:
                rest.append(eq)
        return keys, rest

    def resolve_keys(
        self, keys: list[tuple[exp.Column, exp.Column]], left: _Scope, right: _Scope
    ) -> tuple[list[str], list[str]]:
        return [self.resolve(a, left) for a, _ in keys], [self.resolve(b, right) for _, b in keys]

    def equi_keys(
        self, join: exp.Join, left: _Scope, right: _Scope, right_name: str
    ) -> tuple[list[str], list[str]]:
        keys, rest = self.split_on(join, right_name)
        if rest:
            raise self.error(
                rest[0],
                "JOIN ON",
                "a static join's condition is equalities of columns joined by AND.",
                "Move other conditions to WHERE.",
            )
        return self.resolve_keys(keys, left, right)

    # ------------------------------------------------------------ SELECT

    def refuse_unsupported(self, select: exp.Expr) -> None:
        if not isinstance(select, exp.Select):
            raise self.error(
                select,
                select.key.upper(),
                "only a SELECT query becomes a stream.",
                "Write SELECT ... FROM <stream>; combine streams in the Python API.",
            )
        if select.args.get("with_"):
            raise self.error(
                select.args["with_"],
                "WITH",
                "common table expressions are not translated.",
                "Register each part as a stream (SQLContext.register(name, ctx.sql(...))).",
                keyword="WITH",
            )
        for key, fix in (
            ("order", "Sort the sink's table when you read it; a stream has no end to sort."),
            ("limit", "Filter with WHERE, or read the first rows from the sink's table."),
            ("offset", "Filter with WHERE instead."),
        ):
            node = select.args.get(key)
            if node is not None:
                construct = {"order": "ORDER BY", "limit": "LIMIT", "offset": "OFFSET"}[key]
                raise self.error(
                    node,
                    construct,
                    f"{construct} on an unbounded stream never completes.",
                    fix,
                    keyword=construct.split()[0],
                )
        for window_call in select.find_all(exp.Window):
            raise self.error(
                window_call,
                "OVER",
                "window functions (OVER) have no incremental form on a stream.",
                "Aggregate per event-time window with a window TVF and GROUP BY "
                "window_start, window_end instead.",
            )
        for node in select.find_all(exp.AggFunc):
            if isinstance(node, exp.Count) and isinstance(node.this, exp.Distinct):
                raise self.error(
                    node,
                    "COUNT(DISTINCT)",
                    "a distinct count has no incremental form in constant state.",
                    "Count per key: GROUP BY the key first, or use COUNT(*).",
                )
            if not isinstance(node, exp.Count) and type(node) not in _AGGS:
                raise self.error(
                    node,
                    node.key.upper(),
                    "this aggregate has no incremental form in the engine.",
                    "Use COUNT, SUM, MIN, MAX, AVG, FIRST_VALUE or LAST_VALUE, and compute "
                    "other values from them in the SELECT list.",
                )

    # ------------------------------------------------------------ deduplication

    def row_number_item(self, select: exp.Select) -> tuple[exp.Select, exp.Expr] | None:
        """Flink's deduplication shape, ``SELECT ... FROM (SELECT ..., ROW_NUMBER()
        OVER (...) AS rownum FROM ...) WHERE rownum = 1``: the inner SELECT and its
        ``ROW_NUMBER`` item, else ``None`` (any other subquery is refused as such)."""
        from_ = select.args.get("from_")
        node = from_.this if from_ is not None else None
        if not isinstance(node, exp.Subquery) or not isinstance(node.this, exp.Select):
            return None
        for item in node.this.expressions:
            call = item.this if isinstance(item, exp.Alias) else item
            if isinstance(call, exp.Window) and isinstance(call.this, exp.RowNumber):
                return node.this, item
        return None

    def refuse_dedupe_clauses(self, outer: exp.Select, inner: exp.Select, call: exp.Window) -> None:
        """The deduplication shape has nothing else: clauses outside it are refused."""
        shape = (
            "Write Flink's deduplication: SELECT ... FROM (SELECT *, ROW_NUMBER() OVER "
            "(PARTITION BY window_start, window_end, keys ORDER BY ts ASC|DESC) AS rownum "
            "FROM TABLE(TUMBLE(...)) [WHERE ...]) WHERE rownum = 1; register the result "
            "(ctx.register(name, ctx.sql(...))) to query it further."
        )
        clauses = {
            "with_": "WITH",
            "joins": "JOIN",
            "group": "GROUP BY",
            "having": "HAVING",
            "distinct": "DISTINCT",
            "order": "ORDER BY",
            "limit": "LIMIT",
            "offset": "OFFSET",
        }
        for select, where in ((outer, "outer"), (inner, "inner")):
            for key, construct in (*clauses.items(), *([("emit", "EMIT")] * (select is inner))):
                node = select.args.get(key)
                if node is not None and node != []:
                    first = node[0] if isinstance(node, list) else node
                    raise self.error(
                        first,
                        construct,
                        f"{construct} in the {where} SELECT of a deduplication (ROW_NUMBER) "
                        "is not translated.",
                        shape,
                        keyword=construct.split()[0] if key != "joins" else None,
                    )
        for node in outer.find_all(exp.AggFunc, exp.Window):
            if node is call or node.parent is call:
                continue
            construct = "OVER" if isinstance(node, exp.Window) else node.key.upper()
            raise self.error(
                node,
                construct,
                f"{construct} in a deduplication (ROW_NUMBER) query is not translated.",
                shape,
            )

    def rownum_filter(self, outer: exp.Select, call: exp.Window, rownum: str) -> None:
        """The outer ``WHERE`` is ``rownum = 1`` or ``rownum <= 1``, nothing else."""
        where = outer.args.get("where")
        if where is None:
            raise self.error(
                call,
                "ROW_NUMBER",
                f"ROW_NUMBER() without WHERE {rownum} = 1 numbers every row of a partition: "
                "no incremental form on a stream.",
                f"Keep the top row: add WHERE {rownum} = 1 to the outer SELECT.",
            )
        cond = where.this
        column = cond.this if isinstance(cond, exp.EQ | exp.LTE | exp.LT) else None
        bound = cond.expression if column is not None else None
        if (
            not isinstance(column, exp.Column)
            or column.name != rownum
            or not isinstance(bound, exp.Literal)
            or bound.is_string
            or not bound.name.isdigit()
        ):
            raise self.error(
                cond,
                "WHERE",
                f"the outer WHERE of a deduplication is {rownum} = 1 (or <= 1), "
                f"nothing else; got {cond.sql()!r}.",
                f"Write WHERE {rownum} = 1; filter the rows before deduplication in the "
                "inner SELECT's WHERE, or after it from a registered stream "
                "(ctx.register(name, ctx.sql(...))).",
            )
        n = int(bound.name) - (1 if isinstance(cond, exp.LT) else 0)
        if (isinstance(cond, exp.EQ) and n != 1) or n < 1:
            raise self.error(
                cond,
                "WHERE",
                f"{cond.sql()!r} keeps no top row.",
                f"Write WHERE {rownum} = 1 (the first row per partition).",
            )
        if n > 1:
            raise self.error(
                cond,
                "top-N",
                f"{cond.sql()!r} keeps the top {n} rows per partition: the engine has no "
                "incremental top-N operator.",
                f"Keep one row (WHERE {rownum} = 1), or aggregate the top values you need "
                "(MAX, MIN) per window with GROUP BY.",
            )

    def dedupe_order(
        self, call: exp.Window, scope: _Scope, tvf: WindowTVF | None
    ) -> tuple[list[str], bool]:
        """``ROW_NUMBER() OVER (PARTITION BY ... ORDER BY time [ASC|DESC])``: the
        partition's key columns (window columns apart) and whether it is DESC."""
        if call.args.get("spec") is not None:
            raise self.error(
                call.args["spec"],
                "ROW_NUMBER",
                "a frame (ROWS/RANGE BETWEEN) in ROW_NUMBER's OVER is not translated.",
                "Drop the frame: OVER (PARTITION BY ... ORDER BY ts).",
            )
        keys: list[str] = []
        window_columns: list[str] = []
        for item in call.args.get("partition_by") or []:
            if not isinstance(item, exp.Column):
                raise self.error(
                    item,
                    "PARTITION BY",
                    "a deduplication partitions by columns only.",
                    "Partition by columns: compute others in a registered stream first.",
                )
            if tvf is not None and item.name in _WINDOW_COLUMNS and not item.table:
                window_columns.append(item.name)
            else:
                keys.append(self.resolve(item, scope))
        if tvf is not None and sorted(window_columns) != sorted(_WINDOW_COLUMNS):
            partition = call.args.get("partition_by")
            raise self.error(
                partition[0] if partition else call,
                "PARTITION BY",
                "a deduplication over a window TVF partitions by its window.",
                "Write PARTITION BY window_start, window_end[, keys].",
                keyword="PARTITION",
            )
        order = call.args.get("order")
        terms = list(order.expressions) if order is not None else []
        time = tvf.args["descriptor"].name if tvf is not None else None
        term = terms[0] if len(terms) == 1 else None
        column = term.this if isinstance(term, exp.Ordered) else None
        if not isinstance(column, exp.Column) or (
            time is not None and self.resolve(column, scope) != time
        ):
            raise self.error(
                order if order is not None else call,
                "ORDER BY",
                "a deduplication keeps the first or last row by the window's time column"
                + (f" {time!r}" if time else "")
                + " (ties: the earlier or later arrival), the order the engine's "
                "first()/last() keep.",
                f"Write ORDER BY {time or 'ts'} ASC (the first row) or DESC (the last row).",
                keyword="ORDER",
            )
        return keys, bool(term.args.get("desc")) if term is not None else False

    def dedupe_columns(
        self, inner: exp.Select, row_number: exp.Expr, scope: _Scope
    ) -> list[tuple[str | None, str]]:
        """The inner SELECT list as (column of the aggregation, output name); ``None``
        is ROW_NUMBER's column. ``*`` is the input's columns then ``window_start``,
        ``window_end``: Flink's window TVF output (its ``window_time`` apart)."""
        outputs: list[tuple[str | None, str]] = []
        for item in inner.expressions:
            inner_item = item.this if isinstance(item, exp.Alias) else item
            if item is row_number:
                pairs: list[tuple[str | None, str]] = [(None, item.alias)]
            elif isinstance(item, exp.Star):
                pairs = [(c, c) for c in (*scope.schema, *_WINDOW_COLUMNS)]
            elif isinstance(inner_item, exp.Column):
                if inner_item.name in _WINDOW_COLUMNS and not inner_item.table:
                    column = inner_item.name
                else:
                    column = self.resolve(inner_item, scope)
                pairs = [(column, item.alias if isinstance(item, exp.Alias) else column)]
            else:
                raise self.error(
                    item,
                    "SELECT",
                    "the deduplicating SELECT lists *, columns and ROW_NUMBER() only.",
                    "Compute expressions in the outer SELECT, over the deduplicated row.",
                )
            for pair in pairs:
                if pair[1] in (n for _, n in outputs):
                    raise self.error(
                        item,
                        "SELECT",
                        f"two output columns are named {pair[1]!r}.",
                        "Rename with AS.",
                    )
                outputs.append(pair)
        return outputs

    def deduplicate(self, outer: exp.Select, inner: exp.Select, row_number: exp.Expr) -> Stream:
        """Flink's deduplication, ``ROW_NUMBER() OVER (PARTITION BY window_start,
        window_end, keys ORDER BY ts ASC|DESC) = 1`` over a window TVF, as
        ``group_by(window, keys).agg(<every other column>.first() | .last())``:
        the engine's first/last order by the window's time column, ties by
        arrival, so every column comes from one row; each window's row is emitted
        when the window closes (append), as Flink's window deduplication."""
        call = row_number.this if isinstance(row_number, exp.Alias) else row_number
        assert isinstance(call, exp.Window)
        if not isinstance(row_number, exp.Alias):
            raise self.error(
                call,
                "ROW_NUMBER",
                "ROW_NUMBER() needs a name for the outer WHERE to keep the top row.",
                "Name it: ROW_NUMBER() OVER (...) AS rownum.",
            )
        self.refuse_dedupe_clauses(outer, inner, call)
        self.rownum_filter(outer, call, row_number.alias)
        stream, scope, tvf = self.from_clause(inner)
        where = inner.args.get("where")
        if where is not None:
            stream = stream.filter(self.expr(where.this, scope))
        keys, descending = self.dedupe_order(call, scope, tvf)
        if tvf is None:
            raise self.error(
                call,
                "ROW_NUMBER",
                (
                    "deduplication without a window keeps an updating last row per key, "
                    "and the engine's last() without a window keeps the last row to arrive, "
                    "not the latest by the ORDER BY time."
                    if descending
                    else "deduplication without a window keeps every key's first row "
                    "forever: unbounded state."
                ),
                "Deduplicate per window: FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL "
                "'1' HOUR)) with PARTITION BY window_start, window_end, keys; or, in the "
                "Python API, stream.drop_duplicates(subset, within='1h') (the first arrival "
                "per key, remembered for a time bound).",
            )
        if self.early_emit():
            assert self.emit is not None
            raise self.error(
                self.emit,
                f"EMIT {self.emit.policy}",
                "window deduplication emits each window's row once, when the window "
                "closes, as Flink's does.",
                "Drop the EMIT clause (or write EMIT ON WINDOW CLOSE).",
            )
        self.check_session_keys(tvf, scope, keys)
        outputs = self.dedupe_columns(inner, row_number, scope)
        take = "last" if descending else "first"
        rest = [c for c in scope.schema if c not in keys]
        grouped = stream.group_by(self.window_of(tvf, stream), *keys).agg(
            *(getattr(pl.col(c), take)() for c in rest)
        )
        deduped = grouped.select(
            *(
                pl.lit(1, pl.Int64).alias(name)
                if column is None
                else column if column == name else pl.col(column).alias(name)
                for column, name in outputs
            ),
            # an allowed lateness re-emits a changed window: its revision (as aggregate())
            *(["revision"] if "revision" in grouped.schema else []),
        )
        alias = outer.args["from_"].this.alias
        out_scope = _Scope(deduped.schema, {alias: {c: c for c in deduped.schema}} if alias else {})
        return self.project(outer, deduped, out_scope)

    def translate(self, select: exp.Expr) -> Stream:
        dedupe = self.row_number_item(select) if isinstance(select, exp.Select) else None
        if dedupe is None:
            self.refuse_unsupported(select)
        assert isinstance(select, exp.Select)
        emit = select.args.get("emit")
        self.emit = emit if isinstance(emit, Emit) else None
        stream = (
            self.deduplicate(select, *dedupe) if dedupe is not None else self.translate_body(select)
        )
        if self.emit is None:
            return stream
        line, column = position(self.emit, self.text)
        mode = cast("OutputMode", self.emit.output_mode)
        return stream._emitting(mode, f"EMIT {self.emit.policy}", line, column)

    def early_emit(self) -> bool:
        """The query emits a window's row before it closes (``EMIT ON UPDATE``,
        ``EMIT CHANGES``)."""
        return self.emit is not None and self.emit.output_mode in ("update", "changelog")

    def check_emit(self, tvf: WindowTVF | None, aggregated: bool) -> None:
        """``EMIT`` chooses when an aggregation's rows are written: refused on a
        query without one, and ``ON WINDOW CLOSE`` without a window."""
        emit = self.emit
        if emit is None:
            return
        if not aggregated:
            raise self.error(
                emit,
                f"EMIT {emit.policy}",
                "EMIT chooses when an aggregation's rows are written; this query has no "
                "aggregation: each row is written once, as it arrives.",
                "Drop the EMIT clause, or aggregate (GROUP BY).",
            )
        if tvf is None and emit.output_mode == "append":
            raise self.error(
                emit,
                f"EMIT {emit.policy}",
                "a GROUP BY without a window TVF has no window to close: its rows are "
                "never final.",
                "Write EMIT ON UPDATE or EMIT CHANGES, or group by a window TVF's "
                "window_start, window_end.",
            )

    def translate_body(self, select: exp.Select) -> Stream:
        stream, scope, tvf = self.from_clause(select)
        for join in select.args.get("joins") or []:
            stream, scope = self.join(stream, scope, join)
        aggregated = select.args.get("group") is not None or any(
            item.find(exp.AggFunc) for item in select.expressions
        )
        stream, scope, hidden = self.processing_time(select, stream, scope, aggregated)
        if hidden:
            out = self.translate_rest(select, stream, scope, tvf, aggregated)
            return out.drop(PROCTIME_COLUMN, strict=False)
        return self.translate_rest(select, stream, scope, tvf, aggregated)

    def processing_time(
        self, select: exp.Select, stream: Stream, scope: _Scope, aggregated: bool
    ) -> tuple[Stream, _Scope, bool]:
        """``PROCTIME()`` in the SELECT list or WHERE: the batch's processing time
        (``with_processing_time``). ``PROCTIME() AS name`` makes ``name`` the
        stream's processing-time attribute; elsewhere the calls read a hidden
        column, dropped from the output (the third value says so)."""
        calls = [
            call
            for part in [*select.expressions, select.args.get("where")]
            if part is not None
            for call in part.find_all(exp.Anonymous)
            if str(call.this).upper() == "PROCTIME"
        ]
        if not calls:
            return stream, scope, False
        if aggregated:
            raise self.error(
                calls[0],
                "PROCTIME()",
                "PROCTIME() in an aggregating query would move the watermark of its "
                "windows.",
                "Declare it where the stream is defined: `proc_time AS PROCTIME()` in its "
                "CREATE TABLE, or register stream.with_processing_time('proc_time').",
            )
        named = [
            item.alias
            for item in select.expressions
            if isinstance(item, exp.Alias)
            and any(item.this is call for call in calls)
            and item.alias not in scope.schema
        ]
        column = named[0] if named else PROCTIME_COLUMN
        for call in calls:
            call.replace(exp.column(column, quoted=True))
        stream = stream.with_processing_time(column)
        return stream, _Scope(stream.schema, scope.qualified), not named

    def translate_rest(
        self, select: exp.Select, stream: Stream, scope: _Scope, tvf: WindowTVF | None,
        aggregated: bool,
    ) -> Stream:
        where = select.args.get("where")
        if where is not None:
            stream = stream.filter(self.expr(where.this, scope))
        distinct = select.args.get("distinct")
        if distinct is not None:
            if tvf is None or aggregated or distinct.args.get("on") is not None:
                raise self.error(
                    distinct,
                    "DISTINCT",
                    "SELECT DISTINCT outside a window keeps every row ever seen."
                    if tvf is None
                    else "SELECT DISTINCT ON or with aggregates is not translated.",
                    "Select DISTINCT window_start, window_end, keys FROM a window TVF (one "
                    "row per window and key), or deduplicate with a time bound in the Python "
                    "API: stream.drop_duplicates(subset, within='1h').",
                    keyword="DISTINCT",
                )
            self.check_emit(tvf, True)
            return self.distinct_per_window(select, stream, scope, tvf)
        if tvf is not None and not aggregated:
            raise self.error(
                tvf,
                tvf.kind,
                "a window TVF without GROUP BY is not translated.",
                "Aggregate it: GROUP BY window_start, window_end[, keys].",
                keyword=tvf.kind,
            )
        self.check_emit(tvf, aggregated)
        if aggregated:
            return self.aggregate(select, stream, scope, tvf)
        if select.args.get("having") is not None:
            raise self.error(select.args["having"], "HAVING", "HAVING needs GROUP BY.", "")
        return self.project(select, stream, scope)

    def project(self, select: exp.Select, stream: Stream, scope: _Scope) -> Stream:
        items = select.expressions
        if len(items) == 1 and isinstance(items[0], exp.Star):
            return stream
        stars = [i for i in items if isinstance(i, exp.Star)]
        if stars:
            raise self.error(
                stars[0], "*", "* mixed with other columns is not translated.", "List them."
            )
        exprs = []
        names: set[str] = set()
        for item in items:
            value = self.expr(item.this if isinstance(item, exp.Alias) else item, scope)
            name = self.output_name(item, value)
            if name in names:
                raise self.error(
                    item, "SELECT", f"two output columns are named {name!r}.", "Rename with AS."
                )
            names.add(name)
            exprs.append(value.alias(name))
        return stream.select(*exprs)

    def distinct_per_window(
        self, select: exp.Select, stream: Stream, scope: _Scope, tvf: WindowTVF
    ) -> Stream:
        """``SELECT DISTINCT window_start, window_end, keys FROM <window TVF>``: one
        row per window and key, ``group_by(window, keys)`` (state released as the
        watermark closes windows)."""
        keys: list[str] = []
        outputs: list[tuple[str, str]] = []  # (column of the aggregation, output name)
        for item in select.expressions:
            inner = item.this if isinstance(item, exp.Alias) else item
            if not isinstance(inner, exp.Column):
                raise self.error(
                    item,
                    "DISTINCT",
                    "SELECT DISTINCT over a window lists columns only.",
                    "Select DISTINCT window_start, window_end and key columns; compute "
                    "expressions in a registered stream first.",
                )
            if inner.name in _WINDOW_COLUMNS and not inner.table:
                column = inner.name
            else:
                column = self.resolve(inner, scope)
                if column not in keys:
                    keys.append(column)
            name = item.alias if isinstance(item, exp.Alias) else inner.name
            if name in (n for _, n in outputs):
                raise self.error(
                    item, "SELECT", f"two output columns are named {name!r}.", "Rename with AS."
                )
            outputs.append((column, name))
        self.check_session_keys(tvf, scope, keys)
        grouped = stream.group_by(self.window_of(tvf, stream), *keys).agg(
            pl.len().alias("__sql_rows")
        )
        return grouped.select(*(pl.col(c).alias(n) for c, n in outputs))

    def check_session_keys(self, tvf: WindowTVF, scope: _Scope, keys: list[str]) -> None:
        if tvf.kind != "SESSION":
            return
        partition = [self.resolve(c, scope) for c in tvf.args.get("partition_by") or []]
        if sorted(partition) != sorted(keys):
            raise self.error(
                tvf,
                "SESSION",
                f"sessions are partitioned by {partition} but grouped by {keys}.",
                "Write the same keys in PARTITION BY and GROUP BY.",
                keyword="SESSION",
            )

    def group_keys(
        self, select: exp.Select, scope: _Scope, tvf: WindowTVF | None
    ) -> tuple[list[str], list[str]]:
        """The GROUP BY's key columns, and the window columns it names."""
        group = select.args.get("group")
        group_items = list(group.expressions) if group is not None else []
        keys: list[str] = []
        window_columns: list[str] = []
        for item in group_items:
            if not isinstance(item, exp.Column):
                raise self.error(
                    item,
                    "GROUP BY",
                    "only columns can be grouped by.",
                    "Group by a column: compute it in a registered stream with with_columns first.",
                )
            if tvf is not None and item.name in _WINDOW_COLUMNS:
                window_columns.append(item.name)
            else:
                keys.append(self.resolve(item, scope))
        if tvf is not None and sorted(window_columns) != sorted(_WINDOW_COLUMNS):
            raise self.error(
                group if group is not None else tvf,
                "GROUP BY",
                "a window TVF's aggregation groups by its window.",
                "Write GROUP BY window_start, window_end[, keys].",
                keyword="GROUP",
            )
        return keys, window_columns

    def aggregate(
        self, select: exp.Select, stream: Stream, scope: _Scope, tvf: WindowTVF | None
    ) -> Stream:
        keys, window_columns = self.group_keys(select, scope, tvf)
        spec = self.window_of(tvf, stream) if tvf is not None else None
        if tvf is not None:
            self.check_session_keys(tvf, scope, keys)
        self.check_grouped(select, scope, keys, window_columns)
        # The aggregates of SELECT and HAVING, each computed once.
        aggs: dict[str, tuple[exp.AggFunc, str]] = {}
        pre: list[pl.Expr] = []
        agg_exprs: list[pl.Expr] = []
        direct: dict[int, str] = {}
        for index, item in enumerate(select.expressions):
            inner = item.this if isinstance(item, exp.Alias) else item
            if isinstance(inner, exp.AggFunc):
                direct[index] = self.output_name(item, self.agg_expr(inner, scope, None, []))
        having = select.args.get("having")
        sources = [*select.expressions, *([having.this] if having is not None else [])]
        for node in (a for s in sources for a in s.find_all(exp.AggFunc)):
            sql = node.sql()
            if sql in aggs:
                continue
            owner = next(
                (
                    direct[i]
                    for i, it in enumerate(select.expressions)
                    if i in direct and (it.this if isinstance(it, exp.Alias) else it) is node
                ),
                None,
            )
            name = owner if owner is not None else f"__sql_agg{len(aggs)}"
            if name in keys or name in _WINDOW_COLUMNS or name in (n for _, n in aggs.values()):
                name = f"__sql_agg{len(aggs)}"
            aggs[sql] = (node, name)
            agg_exprs.append(self.agg_expr(node, scope, name, pre))
        if pre:
            stream = stream.with_columns(*pre)
        by: list[Any] = [spec] if spec is not None else []
        grouped = stream.group_by(*by, *keys).agg(*agg_exprs)
        out_scope = _Scope(grouped.schema)
        if having is not None:
            condition = self.expr(self.over_aggs(having.this, aggs, scope), out_scope)
            grouped = self.having(grouped, condition, tvf, having)
        # The SELECT list over the aggregation's columns.
        exprs: list[pl.Expr] = []
        names: list[str] = []
        for index, item in enumerate(select.expressions):
            if isinstance(item, exp.Star):
                raise self.error(item, "*", "SELECT * with GROUP BY.", "List the columns.")
            inner = item.this if isinstance(item, exp.Alias) else item
            rewritten = self.over_aggs(inner, aggs, scope)
            value = self.expr(rewritten, out_scope)
            name = direct.get(index) or self.output_name(item, value)
            if name in names:
                raise self.error(
                    item, "SELECT", f"two output columns are named {name!r}.", "Rename with AS."
                )
            names.append(name)
            exprs.append(value.alias(name))
        if "revision" in grouped.schema and "revision" not in names:
            names.append("revision")  # fire_once's corrections (an early EMIT's HAVING)
            exprs.append(pl.col("revision"))
        if names == list(grouped.schema) and all(
            isinstance(i.this if isinstance(i, exp.Alias) else i, exp.Column | exp.AggFunc)
            for i in select.expressions
        ):
            return grouped  # the aggregation's own columns, in its order: no extra step
        return grouped.select(*exprs)

    def having(
        self, grouped: Stream, condition: pl.Expr, tvf: WindowTVF | None, having: exp.Expr
    ) -> Stream:
        """``HAVING``: a ``filter`` after the aggregation; on a window under an early
        ``EMIT``, the rule fires once per window, in the first batch where it
        holds, then each later change of that window follows as a correction
        (``revision`` 1, 2...): ``fire_once(condition, corrections=True)``."""
        if tvf is None or not self.early_emit():
            return grouped.filter(condition)
        if tvf.kind == "SESSION":
            assert self.emit is not None
            raise self.error(
                having,
                "HAVING",
                f"HAVING on a SESSION window under EMIT {self.emit.policy} is not "
                "translated: a rule fires once per window, and a session's bounds move "
                "as it merges.",
                "Use TUMBLE or HOP, or EMIT ON WINDOW CLOSE (the closed session's row, "
                "filtered by HAVING).",
                keyword="HAVING",
            )
        return grouped.fire_once(condition, corrections=True)

    def check_grouped(
        self, select: exp.Select, scope: _Scope, keys: list[str], window_columns: list[str]
    ) -> None:
        """Every column of the SELECT list outside an aggregate is grouped by."""
        if not any(item.find(exp.AggFunc) for item in select.expressions):
            raise self.error(
                select.args.get("group") or select,
                "GROUP BY",
                "a GROUP BY without an aggregate is a SELECT DISTINCT: it keeps every key.",
                "Add an aggregate (COUNT(*)), or deduplicate with a time bound in the Python "
                "API: stream.drop_duplicates(subset, within='1h').",
                keyword="GROUP",
            )
        for item in select.expressions:
            inner = item.this if isinstance(item, exp.Alias) else item
            for column in inner.find_all(exp.Column):
                if column.find_ancestor(exp.AggFunc) is not None:
                    continue
                if column.name in window_columns and not column.table:
                    continue
                if self.resolve(column, scope) not in keys:
                    raise self.error(
                        column,
                        "GROUP BY",
                        f"{column.sql()!r} is neither grouped by nor aggregated.",
                        "Add it to GROUP BY or aggregate it (e.g. LAST_VALUE(col)).",
                    )

    def over_aggs(
        self, node: exp.Expr, aggs: Mapping[str, tuple[exp.AggFunc, str]], scope: _Scope
    ) -> exp.Expr:
        """``node`` over the aggregation's output: each aggregate replaced by its
        column, each other column by the name it has there (qualifiers dropped)."""

        def swap(n: exp.Expr) -> exp.Expr:
            if isinstance(n, exp.AggFunc):
                return exp.column(aggs[n.sql()][1], quoted=True)
            if isinstance(n, exp.Column):
                if n.name in _WINDOW_COLUMNS and not n.table:
                    return exp.column(n.name, quoted=True)
                return exp.column(self.resolve(n, scope), quoted=True)
            return n

        return node.transform(swap)

    def agg_expr(
        self, node: exp.AggFunc, scope: _Scope, name: str | None, pre: list[pl.Expr]
    ) -> pl.Expr:
        """The engine aggregation for ``node``; an argument that is not a column is
        computed first as a hidden column (appended to ``pre``)."""
        if isinstance(node, exp.Count) and isinstance(node.this, exp.Star):
            value = pl.len()
        else:
            arg = node.this
            if isinstance(arg, exp.Column):
                column = pl.col(self.resolve(arg, scope))
            elif arg is None:
                raise self.error(node, node.key.upper(), "needs an argument.", "")
            else:
                hidden = f"__sql_arg{len(pre)}"
                pre.append(self.expr(arg, scope).alias(hidden))
                column = pl.col(hidden)
            method = "count" if isinstance(node, exp.Count) else _AGGS[type(node)]
            value = getattr(column, method)()
        return value.alias(name) if name is not None else self._default_name(node, value)

    def _default_name(self, node: exp.AggFunc, value: pl.Expr) -> pl.Expr:
        # Polars SQL's naming: COUNT(*) -> "len", SUM(x) -> "x".
        if isinstance(node, exp.Count) and isinstance(node.this, exp.Star):
            return value.alias("len")
        return value


def translate_select(
    select: exp.Expr,
    text: str,
    *,
    streams: Mapping[str, Stream],
    tables: Mapping[str, StaticInput] | None = None,
    allowed_lateness: str | None = None,
) -> Stream:
    """The ``Stream`` of one parsed SELECT (``select``, parsed from ``text``, which
    refusals quote by line and column) over the registered ``streams`` and static
    ``tables``; its TUMBLE and HOP windows keep ``allowed_lateness`` (a duration
    string). Raises :class:`~microbatch.exceptions.SQLError` for what has no
    incremental form or is not translated."""
    return _Translator(text, streams, tables or {}, allowed_lateness).translate(select)
