"""SQL text to sqlglot trees in the microbatch dialect, with errors at line and column.

:func:`parse_statements` is the one entry point: every syntax error becomes a
:class:`~microbatch.exceptions.SQLError` naming the line and column (1-based)
of the offending token. :func:`position` and :func:`refuse` let the
translators (SELECT here, DDL and scripts in ``microbatch.sql.ddl``) point a
refusal at the construct it is about.
"""

from __future__ import annotations

import re

from sqlglot import exp
from sqlglot.errors import ErrorLevel, ParseError, TokenError

from microbatch.exceptions import SQLError
from microbatch.sql.dialect import MicrobatchDialect

__all__ = ["line_column", "parse_statements", "position", "refuse", "render"]

_DIALECT = MicrobatchDialect()


def line_column(text: str, offset: int) -> tuple[int, int]:
    """The 1-based (line, column) of a character offset into ``text``."""
    offset = max(0, min(offset, len(text)))
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return line, column


def parse_statements(text: str) -> list[exp.Expr]:
    """Parse ``text`` (one or more statements separated by ``;``) in the
    microbatch dialect; empty statements are dropped.

    Raises :class:`~microbatch.exceptions.SQLError` with the line and column of
    the first syntax error (``construct="syntax"``).

    Examples
    --------
    >>> from microbatch.sql.parse import parse_statements
    >>> [s.key for s in parse_statements("SELECT 1; SELECT 2")]
    ['select', 'select']
    """
    try:
        trees = _DIALECT.parse(text, error_level=ErrorLevel.IMMEDIATE)
    except TokenError as err:
        line, column = line_column(text, _token_error_offset(err))
        raise SQLError(
            "a string literal or quoted identifier starts here and is never closed.",
            line=line,
            column=column,
            construct="syntax",
            fix="Close every string literal and quoted identifier.",
        ) from None
    except ParseError as err:
        first = err.errors[0] if err.errors else {}
        line = int(first.get("line") or 1)
        end_column = int(first.get("col") or 1)
        highlight = str(first.get("highlight") or "")
        # NOTE: sqlglot reports the column where the token ends; point at its start.
        column = end_column
        if highlight and "\n" not in highlight:
            column = end_column - len(highlight) + 1
        description = str(first.get("description") or err)
        raise SQLError(
            f"{description} (near {highlight!r})." if highlight else f"{description}.",
            line=line,
            column=max(1, column),
            construct="syntax",
            fix="Correct the SQL at that position (docs/sql.md lists the supported forms).",
        ) from None
    return [tree for tree in trees if tree is not None]


def _token_error_offset(err: TokenError) -> int:
    """Where tokenizing failed: the cause's ``from LINE:OFFSET`` (an unclosed
    string's start), else the middle of the quoted context."""
    found = re.search(r"from \d+:(\d+)", str(err.__cause__ or ""))
    if found:
        return int(found.group(1))
    start = err.start if isinstance(err.start, int) else 0
    return start + 50 if start else 0


def position(node: exp.Expr, text: str, *, keyword: str | None = None) -> tuple[int, int]:
    """The 1-based (line, column) where ``node`` starts in ``text``: the earliest
    token under it that the parser located (``(1, 1)`` when none was). With
    ``keyword`` (a clause's first word, e.g. ``"ORDER"``, which the parser does
    not locate), the last occurrence of that word before it, or else the first
    after it."""
    starts = [
        int(n.meta["start"])
        for n in node.walk()
        if isinstance(n, exp.Expr) and isinstance(n.meta.get("start"), int)
    ]
    offset = min(starts) if starts else None
    if keyword is not None:
        end = offset if offset is not None else len(text)
        found = [
            m.start() for m in re.finditer(rf"\b{re.escape(keyword)}\b", text[:end], re.IGNORECASE)
        ]
        if found:
            offset = found[-1]
    return line_column(text, offset) if offset is not None else (1, 1)


def refuse(
    node: exp.Expr,
    text: str,
    *,
    construct: str,
    problem: str,
    fix: str,
    keyword: str | None = None,
) -> SQLError:
    """A :class:`~microbatch.exceptions.SQLError` about ``node`` in ``text``
    (its line and column; see :func:`position` for ``keyword``), to ``raise``."""
    line, column = position(node, text, keyword=keyword)
    return SQLError(problem, line=line, column=column, construct=construct, fix=fix)


def render(node: exp.Expr) -> str:
    """``node`` back as SQL text in the microbatch dialect."""
    return node.sql(dialect=_DIALECT)
