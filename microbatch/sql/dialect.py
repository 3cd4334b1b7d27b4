"""The microbatch SQL dialect: sqlglot's default dialect plus Flink SQL's streaming forms.

sqlglot (a maintained, pure-Python parser with a dialect system) parses the
common SQL; no built-in dialect parses Flink's window table-valued functions nor
``WATERMARK FOR`` in a ``CREATE TABLE`` column list, so this dialect adds them:

- ``TUMBLE(TABLE t, DESCRIPTOR(ts), size)``, ``HOP(TABLE t, DESCRIPTOR(ts),
  slide, size)`` (slide, then size, as Flink), ``SESSION(TABLE t PARTITION BY
  k, DESCRIPTOR(ts), gap)`` and ``CUMULATE(TABLE t, DESCRIPTOR(ts), step,
  size)`` parse into one node, :class:`WindowTVF`, whose ``kind`` names the
  function. Inside ``FROM TABLE(...)`` the call is wrapped, as sqlglot does for
  any table function, in ``exp.Table(this=exp.Anonymous(this="TABLE"))``.
- ``WATERMARK FOR col AS expr`` in a ``CREATE TABLE`` column list parses into
  sqlglot's ``exp.WatermarkColumnConstraint`` (``this``: the column,
  ``expression``: the watermark expression).
- ``WITH ('k' = 'v', ...)`` table options and ``FOR SYSTEM_TIME AS OF`` already
  parse in the default dialect: options as ``exp.Property`` rows of the
  ``Create``'s ``properties``, a temporal join as the joined ``exp.Table``'s
  ``version`` (an ``exp.Version`` with ``kind="AS OF"``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.generator import Generator
from sqlglot.parser import Parser
from sqlglot.tokenizer_core import TokenType

__all__ = ["WINDOW_TVFS", "MicrobatchDialect", "WindowTVF"]

WINDOW_TVFS: tuple[str, ...] = ("TUMBLE", "HOP", "SESSION", "CUMULATE")
"""The window table-valued functions the dialect parses (Flink SQL's names)."""


class WindowTVF(exp.Expression):
    """A window table-valued function call: ``kind`` is ``TUMBLE``, ``HOP``,
    ``SESSION`` or ``CUMULATE``; ``this`` the input table (an ``exp.Table``),
    ``partition_by`` its ``PARTITION BY`` columns (``SESSION``), ``descriptor``
    the time column (an ``exp.Column``) and ``expressions`` the intervals in
    the order written (``HOP``: slide then size; ``CUMULATE``: step then size)."""

    arg_types: ClassVar[dict[str, bool]] = {
        "kind": True,
        "this": True,
        "partition_by": False,
        "descriptor": True,
        "expressions": True,
    }

    @property
    def kind(self) -> str:
        """The function's name, upper case."""
        return str(self.args["kind"])


def _parse_window_tvf(kind: str) -> Any:
    def parse(self: MicrobatchParser) -> WindowTVF:
        if not self._match(TokenType.TABLE):
            self.raise_error(f"{kind} expects its input as TABLE name, e.g. {kind}(TABLE tx, ...)")
        table = self._parse_table_parts()
        partition_by: list[exp.Expr] = []
        if self._match(TokenType.PARTITION_BY):
            # Flink: PARTITION BY k, or PARTITION BY (k1, k2)
            if self._match(TokenType.L_PAREN):
                partition_by = self._parse_csv(self._parse_column)
                self._match_r_paren()
            else:
                column = self._parse_column()
                partition_by = [column] if column else []
        if not self._match(TokenType.COMMA):
            self.raise_error(f"Expected ',' then DESCRIPTOR(time_column) in {kind}")
        if not self._match_text_seq("DESCRIPTOR") or not self._match(TokenType.L_PAREN):
            self.raise_error(f"{kind} expects DESCRIPTOR(time_column) as its second argument")
        descriptor = self._parse_column()
        self._match_r_paren()
        intervals: list[exp.Expr] = []
        while self._match(TokenType.COMMA):
            interval = self._parse_bitwise()
            if interval is None:
                self.raise_error(f"Expected an INTERVAL in {kind}")
            else:
                intervals.append(interval)
        return self.expression(
            WindowTVF(
                kind=kind,
                this=table,
                partition_by=partition_by,
                descriptor=descriptor,
                expressions=intervals,
            )
        )

    return parse


class MicrobatchParser(Parser):
    """The default parser, plus the window TVFs and ``WATERMARK FOR``."""

    FUNCTION_PARSERS: ClassVar[dict[str, Any]] = {
        **Parser.FUNCTION_PARSERS,
        **{name: _parse_window_tvf(name) for name in WINDOW_TVFS},
    }

    # NOTE: SESSION is a keyword token (SET SESSION ...): it must be a function
    # token too, or SESSION(...) never reaches FUNCTION_PARSERS.
    FUNC_TOKENS: ClassVar[set[TokenType]] = {*Parser.FUNC_TOKENS, TokenType.SESSION}

    CONSTRAINT_PARSERS: ClassVar[dict[str, Any]] = {
        **Parser.CONSTRAINT_PARSERS,
        "WATERMARK": lambda self: self.expression(
            exp.WatermarkColumnConstraint(
                this=self._match(TokenType.FOR) and self._parse_column(),
                expression=self._match(TokenType.ALIAS) and self._parse_disjunction(),
            )
        ),
    }

    SCHEMA_UNNAMED_CONSTRAINTS: ClassVar[set[str]] = {
        *Parser.SCHEMA_UNNAMED_CONSTRAINTS,
        "WATERMARK",
    }


def _window_tvf_sql(self: Generator, expression: WindowTVF) -> str:
    """``KIND(TABLE t [PARTITION BY k], DESCRIPTOR(ts), interval, ...)``."""
    table = f"TABLE {self.sql(expression, 'this')}"
    partition = expression.args.get("partition_by") or []
    if len(partition) == 1:
        table += f" PARTITION BY {self.sql(partition[0])}"
    elif partition:
        table += " PARTITION BY (" + ", ".join(self.sql(p) for p in partition) + ")"
    args = [table, f"DESCRIPTOR({self.sql(expression, 'descriptor')})"]
    args += [self.sql(e) for e in expression.expressions]
    return f"{expression.kind}({', '.join(args)})"


class MicrobatchGenerator(Generator):
    """The default generator, plus :class:`WindowTVF` rendered as Flink writes it."""

    TRANSFORMS: ClassVar[dict[type[exp.Expr], Any]] = {
        **Generator.TRANSFORMS,
        WindowTVF: _window_tvf_sql,
    }


class MicrobatchDialect(Dialect):
    """sqlglot's default dialect with Flink SQL's window TVFs and ``WATERMARK FOR``.

    Examples
    --------
    >>> import sqlglot
    >>> from microbatch.sql.dialect import MicrobatchDialect, WindowTVF
    >>> tree = sqlglot.parse_one(
    ...     "SELECT * FROM TABLE(TUMBLE(TABLE tx, DESCRIPTOR(ts), INTERVAL '1' MINUTE))",
    ...     dialect=MicrobatchDialect)
    >>> tree.find(WindowTVF).kind
    'TUMBLE'
    """

    Parser = MicrobatchParser
    Generator = MicrobatchGenerator
