"""A SQL script: ``CREATE TABLE``, ``CREATE [MATERIALIZED] VIEW`` and ``INSERT INTO``
statements, turned into the unstarted queries they define.

What ``microbatch sql FILE.sql`` runs::

    CREATE TABLE tx (card_id BIGINT, amount DOUBLE, event_time TIMESTAMP(3),
                     WATERMARK FOR event_time AS event_time - INTERVAL '10' SECOND)
        WITH ('connector' = 'files', 'path' = '${input}', 'format' = 'parquet');
    CREATE TABLE totals WITH ('connector' = 'delta', 'path' = '${output}');
    INSERT INTO totals
    SELECT window_start, window_end, card_id, COUNT(*) AS n
    FROM TABLE(TUMBLE(TABLE tx, DESCRIPTOR(event_time), INTERVAL '1' MINUTE))
    GROUP BY window_start, window_end, card_id;

Statements run in order; each one:

- ``CREATE TABLE name (...) WITH (...)`` declares a source or a sink
  (:class:`~microbatch.sql.ddl.TableDef`), checked at once;
- ``CREATE VIEW name AS SELECT ...`` names a query that later statements read
  like a table (nothing runs by itself);
- ``INSERT INTO sink SELECT ... [EMIT ...]`` is a query of its own, writing to a
  declared sink table in the output mode its ``EMIT`` clause chooses, else the
  table's ``'output_mode'`` (default ``append``); the two contradicting is refused;
- ``SET 'table.exec.emit.allow-lateness' = '1 h'`` (Flink's table option) gives
  the TUMBLE and HOP windows of the statements after it that allowed lateness
  (``SQLContext.set``);
- ``CREATE MATERIALIZED VIEW name [WITH (...)] AS SELECT ...`` is a query
  keeping a table equal to the SELECT's result: in ``update`` mode (rows
  upserted by the query's keys, deletes applied) for an aggregating query, in
  ``append`` otherwise; into the sink its ``WITH`` options declare (a Delta
  table, say), else into the memory table ``mb.table(name)``.

The SELECTs go through :func:`microbatch.sql` with the script's tables (and
views) they name as streams: one plan, the same operators as the Python API.
Each query is named after the table it writes (its checkpoint subdirectory
under the CLI's ``--checkpoint``); two queries writing the same table are
refused. Every error is a :class:`~microbatch.SQLError` whose message starts
with ``FILE:LINE:COLUMN:`` of the script as written (before ``${NAME}``
substitution, see :mod:`microbatch.sql.params`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlglot import exp
from sqlglot.tokenizer_core import Token, TokenType

from microbatch.api.stream import Stream
from microbatch.api.writer import DataStreamWriter, output_keys
from microbatch.exceptions import PlanError, SQLError
from microbatch.sql.context import ALLOW_LATENESS
from microbatch.sql.ddl import Option, TableDef, table_options
from microbatch.sql.dialect import Emit, MicrobatchDialect
from microbatch.sql.params import Substituted, substitute
from microbatch.sql.parse import parse_statements
from microbatch.sql.positions import DeclarationError, ScriptError, line_column

__all__ = ["Script", "ScriptQuery", "compile_script", "load_script"]


@dataclass(frozen=True)
class ScriptQuery:
    """One query of a script: the unstarted writer of an ``INSERT INTO`` or a
    ``CREATE MATERIALIZED VIEW``, named after the table it writes."""

    name: str
    writer: DataStreamWriter
    statement: str
    """``INSERT INTO name`` or ``CREATE MATERIALIZED VIEW name``."""
    line: int
    column: int


@dataclass(frozen=True)
class Script:
    """A compiled script: its tables, views and queries, in statement order."""

    file: str
    tables: Mapping[str, TableDef]
    queries: list[ScriptQuery]
    views: Mapping[str, exp.Query] = field(default_factory=dict)


def load_script(path: str | os.PathLike[str], params: Mapping[str, str] | None = None) -> Script:
    """Read the script at ``path`` and :func:`compile_script` it.

    Raises :class:`~microbatch.SQLError` (for a missing file too, without a
    position) naming the file.
    """
    file = Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SQLError(f"cannot read the SQL script {file}: {reason}.", line=1, column=1,
                       construct="script", fix="Pass the path of a UTF-8 .sql file.") from None
    return compile_script(text, params or {}, file=str(path))


def compile_script(text: str, params: Mapping[str, str] | None = None, *,
                   file: str = "<script>") -> Script:
    """The queries the script ``text`` defines, checked, unstarted.

    ``params`` fill ``${NAME}`` (see :mod:`microbatch.sql.params`). Raises
    :class:`~microbatch.SQLError` at the first problem, its message starting
    with ``file:line:column``.

    Examples
    --------
    >>> script = compile_script('''
    ...     CREATE TABLE tx WITH ('connector' = 'generator', 'rows_per_second' = 'none',
    ...                           'total_rows' = '${rows}', 'seed' = '1',
    ...                           'start' = '2026-01-01T00:00:00Z');
    ...     CREATE MATERIALIZED VIEW big AS SELECT event_id, amount FROM tx WHERE amount > 100;
    ... ''', {"rows": "1000"})
    >>> [(q.name, q.statement) for q in script.queries]
    [('big', 'CREATE MATERIALIZED VIEW big')]
    >>> query = script.queries[0].writer.start(trigger="available-now")
    >>> query.await_termination()
    True
    >>> import microbatch as mb
    >>> mb.table("big").height
    134
    """
    source = substitute(text, params or {}, file=file)
    quiet = logging.getLogger("sqlglot")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # its "falling back to a Command" warning: refused below
    try:
        return _Compiler(source, file).run()
    except SQLError as exc:
        raise _located(exc, source, file, base=0) from None
    finally:
        quiet.setLevel(level)


# ------------------------------------------------------------------ internals


def _located(exc: SQLError, source: Substituted, file: str, *, base: int) -> SQLError:
    """``exc`` (positions relative to ``source.text[base:]``) at the script's
    line and column, its message starting with ``file:line:column``."""
    if isinstance(exc, ScriptError):
        return exc
    offset = base + _offset(source.text[base:], exc.line, exc.column)
    line, column = source.position(offset)
    plain = isinstance(exc, DeclarationError) or exc.construct in exc.problem
    problem = exc.problem if plain else f"{exc.construct}: {exc.problem}"
    return ScriptError(problem, file=file, line=line, column=column, construct=exc.construct,
                       fix=exc.fix)


def _offset(text: str, line: int, column: int) -> int:
    """The character offset of 1-based ``line``:``column`` in ``text``."""
    start = 0
    for _ in range(max(0, line - 1)):
        found = text.find("\n", start)
        if found == -1:
            break
        start = found + 1
    return start + max(0, column - 1)


@dataclass
class _Statement:
    tree: exp.Expr
    tokens: list[Token]
    """The statement's tokens (offsets into the substituted text)."""

    @property
    def start(self) -> int:
        """Offset of the statement's first token."""
        return self.tokens[0].start

    @property
    def end(self) -> int:
        """Offset just after the statement's last token."""
        return self.tokens[-1].end + 1

    def query_start(self) -> int:
        """Offset of the statement's query: after the first top-level ``AS`` of a
        ``CREATE VIEW``, at the first top-level ``SELECT``/``WITH``/``(`` after
        ``INTO name`` of an ``INSERT``."""
        depth, after_as = 0, False
        is_view = isinstance(self.tree, exp.Create)
        for i, token in enumerate(self.tokens):
            kind = token.token_type
            if after_as:
                return token.start
            if is_view and depth == 0 and kind == TokenType.ALIAS:
                after_as = True
            elif (not is_view and depth == 0 and i > 2
                  and kind in (TokenType.SELECT, TokenType.WITH, TokenType.L_PAREN)):
                return token.start
            if kind == TokenType.L_PAREN:
                depth += 1
            elif kind == TokenType.R_PAREN:
                depth -= 1
        return self.start


class _Compiler:
    def __init__(self, source: Substituted, file: str) -> None:
        self.source = source
        self.text = source.text
        self.file = file
        self.tables: dict[str, TableDef] = {}
        self.views: dict[str, tuple[exp.Query, _Statement]] = {}
        self.queries: list[ScriptQuery] = []
        self.settings: dict[str, str] = {}
        """``SET`` options in force, by name (applied to the queries after them)."""

    def run(self) -> Script:
        for statement in self._statements():
            self._statement(statement)
        if not self.queries:
            raise SQLError(
                "the script defines no query: it only declares tables.", line=1, column=1,
                construct="script",
                fix="Add INSERT INTO sink SELECT ... or CREATE MATERIALIZED VIEW name AS "
                    "SELECT ...",
            )
        return Script(self.file, dict(self.tables), list(self.queries),
                      {name: view for name, (view, _) in self.views.items()})

    # -------------------------------------------------------------- splitting

    def _statements(self) -> list[_Statement]:
        trees = parse_statements(self.text)
        groups: list[list[Token]] = [[]]
        for token in MicrobatchDialect().tokenize(self.text):
            if token.token_type == TokenType.SEMICOLON:
                groups.append([])
            else:
                groups[-1].append(token)
        groups = [g for g in groups if g]
        if len(groups) != len(trees):  # pragma: no cover - sqlglot splits on the same tokens
            raise SQLError("the script's statements could not be told apart.", line=1,
                           column=1, construct="script", fix="End every statement with ';'.")
        return [_Statement(tree, tokens) for tree, tokens in zip(trees, groups, strict=True)]

    def _locate(self, node: exp.Expression | None) -> tuple[int | None, int | None]:
        starts = [n.meta["start"] for n in (node.walk() if node is not None else ())
                  if isinstance(n.meta.get("start"), int)]
        if not starts:
            return None, None
        return line_column(self.text, min(starts))

    def _refuse(self, node: exp.Expression | int, *, construct: str, problem: str,
                fix: str) -> SQLError:
        if isinstance(node, int):
            line, column = line_column(self.text, node)
        else:
            located = self._locate(node)
            line, column = (located[0] or 1, located[1] or 1)
        return SQLError(problem, line=line, column=column, construct=construct, fix=fix)

    # -------------------------------------------------------------- statements

    def _statement(self, statement: _Statement) -> None:
        tree = statement.tree
        if isinstance(tree, exp.Create) and str(tree.args.get("kind")).upper() == "TABLE":
            self._create_table(tree, statement)
        elif isinstance(tree, exp.Create) and str(tree.args.get("kind")).upper() == "VIEW":
            self._create_view(tree, statement)
        elif isinstance(tree, exp.Insert):
            self._insert(tree, statement)
        elif isinstance(tree, exp.Set):
            self._set(tree, statement)
        elif isinstance(tree, exp.Command):
            raise self._refuse(statement.start, construct="statement",
                               problem="this statement cannot be parsed as one statement.",
                               fix="End every statement with ';' and check its syntax "
                                   "(docs/sql.md lists the forms a script takes).")
        else:
            head = self.text[statement.start:].split(None, 2)[:2]
            shown = " ".join(head).upper()
            fix = ("Write the query into a table: INSERT INTO sink SELECT ..., or CREATE "
                   "MATERIALIZED VIEW name AS SELECT ..." if isinstance(tree, exp.Query)
                   else "A script holds CREATE TABLE, CREATE [MATERIALIZED] VIEW and "
                        "INSERT INTO statements.")
            raise self._refuse(statement.start, construct=shown,
                               problem="this statement is not run by a script.", fix=fix)

    def _create_table(self, tree: exp.Create, statement: _Statement) -> None:
        if isinstance(tree.args.get("expression"), exp.Query):
            raise self._refuse(statement.start, construct="CREATE TABLE AS SELECT",
                               problem="a table is declared, not filled, by CREATE TABLE.",
                               fix="Use CREATE MATERIALIZED VIEW name WITH (...) AS SELECT ...")
        table = TableDef.from_create(tree, self._locate)
        self._new_name(table.name, tree.this, statement)
        self.tables[table.name] = table

    def _create_view(self, tree: exp.Create, statement: _Statement) -> None:
        target = tree.this
        name = target.name
        query = tree.args.get("expression")
        properties = tree.args.get("properties")
        materialized = properties is not None and any(
            isinstance(p, exp.MaterializedProperty) for p in properties.expressions)
        if not isinstance(query, exp.Query):  # pragma: no cover - the parser requires AS
            raise self._refuse(statement.start, construct="CREATE VIEW",
                               problem="a view needs AS SELECT ...", fix="Add AS SELECT ...")
        self._new_name(name, target, statement)
        if not materialized:
            self.views[name] = (query, statement)
            return
        stream = self._select(query, statement)
        options = table_options(tree, self._locate)
        self._check_emit(stream, query, options.get("output_mode"))
        mode = stream.emit_mode or ("update" if stream.is_aggregated else "append")
        if mode == "update":
            self._check_keys_kept(name, stream, target)
        if options:
            line, column = self._locate(target)
            sink = TableDef.from_options(name, options, line=line, column=column,
                                         locate=self._locate)
            writer = sink.writer(stream, output_mode=mode)
        else:
            writer = stream.write_memory(name, output_mode=mode)
        self._add_query(name, writer, f"CREATE MATERIALIZED VIEW {name}", target)

    def _insert(self, tree: exp.Insert, statement: _Statement) -> None:
        target = tree.this
        if isinstance(target, exp.Schema):
            raise self._refuse(target, construct="INSERT INTO t (columns)",
                               problem="a column list after the table is not taken.",
                               fix="Select the table's columns, in its order, with AS.")
        name = target.name
        table = self.tables.get(name)
        if table is None:
            known = ", ".join(self.tables) or "none"
            raise self._refuse(target, construct=f"INSERT INTO {name}",
                               problem=f"no table {name} is declared before this statement "
                                       f"(tables: {known}).",
                               fix=f"Declare it first: CREATE TABLE {name} WITH "
                                   "('connector' = 'delta', 'path' = '...').")
        query = tree.args.get("expression")
        if not isinstance(query, exp.Query):
            raise self._refuse(target, construct="INSERT INTO ... VALUES",
                               problem="a script inserts the rows of a query.",
                               fix=f"Write INSERT INTO {name} SELECT ... FROM a source table.")
        stream = self._select(query, statement)
        self._check_emit(stream, query, table.options.get("output_mode"))
        writer = table.writer(stream, output_mode=stream.emit_mode)
        self._add_query(name, writer, f"INSERT INTO {name}", target)

    def _set(self, tree: exp.Set, statement: _Statement) -> None:
        """``SET 'name' = 'value'``: an option of the queries after it
        (``SQLContext.set``; the one option is Flink's allowed lateness)."""
        from microbatch.sql.context import SQLContext

        for item in tree.expressions:
            pair = item.this if isinstance(item, exp.SetItem) else None
            if not (isinstance(pair, exp.EQ) and isinstance(pair.this, exp.Literal)
                    and isinstance(pair.expression, exp.Literal)):
                raise self._refuse(statement.start, construct="SET",
                                   problem="a script's SET takes one quoted option and value.",
                                   fix="Write SET 'table.exec.emit.allow-lateness' = '1 h';")
            name, value = pair.this.name, pair.expression.name
            try:
                SQLContext().set(name, value)
            except PlanError as exc:
                where = pair.this if name != ALLOW_LATENESS else pair.expression
                raise self._refuse(where, construct=f"SET '{name}'", problem=f"{exc}.",
                                   fix="Write SET 'table.exec.emit.allow-lateness' = '1 h';"
                                   ) from None
            self.settings[name] = value

    # -------------------------------------------------------------- helpers

    def _check_emit(self, stream: Stream, query: exp.Query, option: Option | None) -> None:
        """An ``EMIT`` clause and the sink's ``'output_mode'`` option must agree."""
        emit = query.args.get("emit")
        if stream.emit_mode is None or option is None or option.value == stream.emit_mode:
            return
        clause = f"EMIT {emit.policy}" if isinstance(emit, Emit) else "EMIT"
        where: exp.Expression = emit if isinstance(emit, Emit) else query  # type: ignore[assignment]
        raise self._refuse(
            where, construct=clause,
            problem=f"{clause} writes in output_mode '{stream.emit_mode}', but the table's "
                    f"'output_mode' = '{option.value}' (line {option.line}, column "
                    f"{option.column}) says otherwise.",
            fix="Keep one: drop the 'output_mode' option (EMIT chooses), or the EMIT clause.")

    def _check_keys_kept(self, name: str, stream: Stream, target: exp.Expression) -> None:
        """An updating view upserts by its grouping keys (and window bounds): the
        SELECT must keep them all, else no row could be replaced."""
        missing = [k for k in output_keys(stream.plan) if k not in stream.schema]
        if missing:
            raise self._refuse(
                target, construct=f"CREATE MATERIALIZED VIEW {name}",
                problem=f"the view is kept up to date by upserting rows by "
                        f"{', '.join(output_keys(stream.plan))}, but its SELECT drops "
                        f"{', '.join(missing)}.",
                fix=f"Select {', '.join(missing)} too.")

    def _new_name(self, name: str, node: exp.Expression, statement: _Statement) -> None:
        if name in self.tables or name in self.views:
            raise self._refuse(node, construct=name,
                               problem=f"{name} is already declared in this script.",
                               fix="Give each table and view its own name.")

    def _add_query(self, name: str, writer: DataStreamWriter, statement: str,
                   node: exp.Expression) -> None:
        if any(q.name == name for q in self.queries):
            raise self._refuse(node, construct=statement,
                               problem=f"a query already writes {name} (each query keeps its "
                                       "own checkpoint under the table's name).",
                               fix="Combine the SELECTs with UNION ALL in one INSERT, or write "
                                   "to another table.")
        line, column = self._locate(node)
        self.queries.append(ScriptQuery(name, writer, statement, line or 1, column or 1))

    def _select(self, query: exp.Query, statement: _Statement) -> Stream:
        """The stream of ``query`` through :func:`microbatch.sql`, with the script's
        tables and views it names (errors at the script's line and column)."""
        from microbatch.sql.context import SQLContext

        start = statement.query_start()
        text = self.text[start:statement.end]
        names = {t.name for t in query.find_all(exp.Table)}
        streams: dict[str, Any] = {}
        for name in sorted(names):
            if name in self.views:
                view, view_statement = self.views[name]
                streams[name] = self._select(view, view_statement)
            elif name in self.tables:
                streams[name] = self.tables[name].source()
        try:
            context = SQLContext(**streams)
            for option, value in self.settings.items():
                context.set(option, value)
            stream: Stream = context.sql(text)
            return stream
        except SQLError as exc:
            raise _located(exc, self.source, self.file, base=start) from None
