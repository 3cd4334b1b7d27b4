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
- ``EMIT ON WINDOW CLOSE`` (RisingWave; ``EMIT FINAL``, ksqlDB's, is the same),
  ``EMIT ON UPDATE`` (RisingWave's name for its default policy) and ``EMIT
  CHANGES`` (ksqlDB) at the end of a ``SELECT`` parse into :class:`Emit`, kept
  as the ``Select``'s ``emit`` argument (Flink SQL has no such clause).
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

__all__ = ["EMIT_MODES", "WINDOW_TVFS", "Emit", "MicrobatchDialect", "WindowTVF"]

WINDOW_TVFS: tuple[str, ...] = ("TUMBLE", "HOP", "SESSION", "CUMULATE")
"""The window table-valued functions the dialect parses (Flink SQL's names)."""


EMIT_MODES: dict[str, str] = {
    "ON WINDOW CLOSE": "append",
    "FINAL": "append",
    "ON UPDATE": "update",
    "CHANGES": "changelog",
}
"""The ``EMIT`` clauses the dialect parses (the words after ``EMIT``), each to the
writer's output mode it chooses."""


class Emit(exp.Expression):
    """``EMIT <policy>`` at the end of a ``SELECT``: ``this`` is the policy as
    written after ``EMIT``, upper case, one of :data:`EMIT_MODES`."""

    arg_types: ClassVar[dict[str, bool]] = {"this": True}

    @property
    def policy(self) -> str:
        """The words after ``EMIT`` (``ON WINDOW CLOSE``, ``FINAL``, ``ON UPDATE``, ``CHANGES``)."""
        return str(self.args["this"])

    @property
    def output_mode(self) -> str:
        """The writer's output mode this clause chooses."""
        return EMIT_MODES[self.policy]


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


def _at_emit(parser: Parser) -> bool:
    """The parser stands on the word ``EMIT``."""
    return parser._curr is not None and parser._curr.text.upper() == "EMIT"


class MicrobatchParser(Parser):
    """The default parser, plus the window TVFs, ``WATERMARK FOR`` and ``EMIT``."""

    def _parse_table_alias(self, *args: Any, **kwargs: Any) -> Any:
        # NOTE: `FROM tx EMIT CHANGES`: EMIT starts the clause, it is no alias of tx.
        if _at_emit(self):
            return None
        return super()._parse_table_alias(*args, **kwargs)

    def _parse_query_modifiers(self, this: Any) -> Any:
        this = super()._parse_query_modifiers(this)
        if isinstance(this, exp.Select) and _at_emit(self):
            start = self._curr
            self._advance()
            words: list[str] = []
            while self._curr is not None and self._curr.token_type != TokenType.SEMICOLON:
                if " ".join([*words, self._curr.text.upper()]) not in _EMIT_PREFIXES:
                    break
                words.append(self._curr.text.upper())
                self._advance()
            policy = " ".join(words)
            if policy not in EMIT_MODES:
                self.raise_error(
                    "Expected EMIT ON WINDOW CLOSE, EMIT ON UPDATE, EMIT CHANGES or EMIT FINAL",
                    token=start,
                )
            emit = self.expression(Emit(this=policy), token=start)
            this.set("emit", emit)
        return this

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


_EMIT_PREFIXES = {
    " ".join(words.split()[:n]) for words in EMIT_MODES for n in range(1, len(words.split()) + 1)
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
        Emit: lambda _self, e: f"EMIT {e.policy}",
    }

    def query_modifiers(self, expression: exp.Expr, *sqls: str) -> str:
        emit = expression.args.get("emit")
        rendered = super().query_modifiers(expression, *sqls)
        return f"{rendered} {self.sql(emit)}" if isinstance(emit, Emit) else rendered


class MicrobatchDialect(Dialect):
    """sqlglot's default dialect with Flink SQL's window TVFs and ``WATERMARK FOR``,
    and the ``EMIT`` clause.

    Examples
    --------
    >>> import sqlglot
    >>> from microbatch.sql.dialect import MicrobatchDialect, WindowTVF
    >>> tree = sqlglot.parse_one(
    ...     "SELECT * FROM TABLE(TUMBLE(TABLE tx, DESCRIPTOR(ts), INTERVAL '1' MINUTE))",
    ...     dialect=MicrobatchDialect)
    >>> tree.find(WindowTVF).kind
    'TUMBLE'
    >>> sqlglot.parse_one("SELECT k FROM t EMIT ON UPDATE", dialect=MicrobatchDialect
    ...                   ).args["emit"].output_mode
    'update'
    """

    Parser = MicrobatchParser
    Generator = MicrobatchGenerator
