"""``mb.SQLContext`` and ``mb.sql``: SQL over registered streams and static tables."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from microbatch.api.stream import Stream
from microbatch.durations import format_duration_ms
from microbatch.exceptions import DurationError, PlanError, SQLError

if TYPE_CHECKING:
    from microbatch.sql.translate import StaticInput

# NOTE: sqlglot and the translator are imported when a query is translated, not with
# ``import microbatch``: every job process (and Ray worker) would pay ~0.15 s for them

__all__ = ["ALLOW_LATENESS", "SQLContext", "flink_duration", "sql"]

ALLOW_LATENESS = "table.exec.emit.allow-lateness"
"""Flink's table option for how long a closed window still takes late rows: the
one ``SET`` option (``SQLContext.set``, ``SET '...' = '1 h'`` in a script)."""

_FLINK_UNITS_MS = {
    **dict.fromkeys(("ms", "milli", "millis", "millisecond", "milliseconds"), 1),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1_000),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60_000),
    **dict.fromkeys(("h", "hour", "hours"), 3_600_000),
    **dict.fromkeys(("d", "day", "days"), 86_400_000),
}


def flink_duration(value: str) -> str:
    """A duration as Flink's configuration writes it (``'1 h'``, ``'10 min'``,
    ``'3600 s'``, ``'500'`` = milliseconds) as the engine's (``'1h'``).

    Raises :class:`~microbatch.exceptions.DurationError` for anything else.

    Examples
    --------
    >>> flink_duration("1 h"), flink_duration("90 s"), flink_duration("250")
    ('1h', '90s', '250ms')
    """
    found = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", value)
    unit = found.group(2).lower() if found else ""
    if found is None or (unit and unit not in _FLINK_UNITS_MS):
        raise DurationError(
            f"{value!r} is not a duration: write a whole number and a unit, as Flink "
            "does: '1 h', '10 min', '30 s', '500 ms' (no unit: milliseconds)"
        )
    return format_duration_ms(int(found.group(1)) * _FLINK_UNITS_MS.get(unit, 1))


class SQLContext:
    """Streams and static tables registered by name, queried with SQL.

    A registered ``Stream`` is what ``FROM`` reads (windows need its
    ``with_watermark``); a static table (a ``pl.DataFrame``, or the path of a
    Parquet file or directory or of a Delta table) is what a ``JOIN`` enriches
    it with, re-read when it changes (``Stream.join_static``). :meth:`sql`
    returns a ``Stream`` built from the same plan nodes and operators as the
    Python API, so it composes with every step and sink. What has no
    incremental form is refused when the query is built, with a
    :class:`~microbatch.SQLError` naming its line and column.

    Examples
    --------
    >>> from datetime import UTC, datetime
    >>> tx = mb.read_memory(pl.DataFrame({
    ...     "card_id": [1, 1, 1, 2],
    ...     "amount": [5.0, 7.0, 9.0, 1.0],
    ...     "event_time": [datetime(2026, 1, 1, 0, m, s, tzinfo=UTC)
    ...                    for m, s in ((0, 1), (0, 2), (0, 3), (2, 0))],
    ... })).with_watermark("event_time", "10s")
    >>> ctx = mb.SQLContext(tx=tx)
    >>> ctx.tables()
    ['tx']
    >>> alerts = ctx.sql('''
    ...     SELECT window_start, window_end, card_id, COUNT(*) AS n, SUM(amount) AS total
    ...     FROM TABLE(TUMBLE(TABLE tx, DESCRIPTOR(event_time), INTERVAL '1' MINUTE))
    ...     GROUP BY window_start, window_end, card_id
    ...     HAVING COUNT(*) >= 3''')
    >>> query = alerts.write_memory("doc_sql_context").start(trigger="available-now")
    >>> query.await_termination()
    True
    >>> mb.table("doc_sql_context").select("card_id", "n", "total").rows()
    [(1, 3, 21.0)]
    """

    def __init__(self, **streams_and_tables: Stream | StaticInput) -> None:
        self._streams: dict[str, Stream] = {}
        self._tables: dict[str, StaticInput] = {}
        self._settings: dict[str, str] = {}
        for name, value in streams_and_tables.items():
            self.register(name, value)

    def register(self, name: str, value: Stream | StaticInput) -> SQLContext:
        """Register a stream or a static table as ``name`` (replacing one of that
        name); returns the context, for chaining."""
        if not isinstance(name, str) or not name:
            raise PlanError(f"SQLContext.register needs a table name, got {name!r}")
        self._streams.pop(name, None)
        self._tables.pop(name, None)
        if isinstance(value, Stream):
            self._streams[name] = value
        elif isinstance(value, pl.DataFrame | str | os.PathLike):
            self._tables[name] = value if isinstance(value, pl.DataFrame) else Path(value)
        else:
            raise PlanError(
                f"SQLContext.register({name!r}, ...) takes a Stream or a static table "
                f"(a pl.DataFrame, a Parquet or Delta path), got {type(value).__name__}"
            )
        return self

    def unregister(self, name: str) -> SQLContext:
        """Forget ``name`` (a no-op when it is not registered)."""
        self._streams.pop(name, None)
        self._tables.pop(name, None)
        return self

    def set(self, name: str, value: str) -> SQLContext:
        """Flink's ``SET 'name' = 'value'`` for the queries built after it; returns
        the context. The one option is ``'table.exec.emit.allow-lateness'``
        (:data:`ALLOW_LATENESS`): TUMBLE and HOP windows keep their state that
        long after the watermark closes them, and rows that late still count
        (``mb.window(..., allowed_lateness=value)``); ``'0'`` turns it off.

        Raises :class:`~microbatch.PlanError` for another option, and
        :class:`~microbatch.exceptions.DurationError` for a value that is not a
        duration (``'1 h'``, ``'30 min'``)."""
        if name != ALLOW_LATENESS:
            raise PlanError(
                f"SQL option {name!r} is not known; the one option is {ALLOW_LATENESS!r} "
                "(docs/sql.md, EMIT and allowed lateness)"
            )
        lateness = flink_duration(value)
        if lateness in ("0s", "0ms", "0"):
            self._settings.pop(name, None)
        else:
            self._settings[name] = lateness
        return self

    def tables(self) -> list[str]:
        """The registered names, streams and static tables, sorted."""
        return sorted([*self._streams, *self._tables])

    def sql(self, query: str) -> Stream:
        """The ``Stream`` of one ``SELECT`` over the registered names.

        Raises :class:`~microbatch.SQLError` (line, column, construct, fix) for
        a syntax error, an unknown name, or a construct without an incremental
        form (docs/sql.md, "Queries")."""
        from sqlglot import exp

        from microbatch.sql.parse import parse_statements, refuse
        from microbatch.sql.translate import translate_select

        statements = parse_statements(query)
        if len(statements) != 1:
            line, column = (1, 1)
            raise SQLError(
                f"expected one SELECT, got {len(statements)} statements.",
                line=line,
                column=column,
                construct="statements",
                fix="Pass one query; run a script of statements with `microbatch sql FILE`.",
            )
        (tree,) = statements
        if not isinstance(tree, exp.Select):
            raise refuse(
                tree,
                query,
                construct=tree.key.upper(),
                problem="SQLContext.sql runs one SELECT query.",
                fix="Write SELECT ... FROM <stream>; DDL and INSERT run in `microbatch sql FILE`.",
            )
        stream = translate_select(
            tree,
            query,
            streams=self._streams,
            tables=self._tables,
            allowed_lateness=self._settings.get(ALLOW_LATENESS),
        )
        return stream._from_sql(query)


def sql(query: str, **streams_and_tables: Stream | StaticInput) -> Stream:
    """The ``Stream`` of a SQL ``SELECT`` over the streams and static tables given
    by name: ``SQLContext(**streams_and_tables).sql(query)``.

    The result runs on the same plan nodes, operators and state as the Python
    API (Flink SQL's window TVFs map to ``group_by(mb.window(...))``, ``HAVING``
    to a ``filter`` after it); what has no incremental form is refused when
    the query is built with a :class:`~microbatch.SQLError` at its line and column.

    Examples
    --------
    >>> tx = mb.read_memory(pl.DataFrame({"card_id": [1, 2, 3], "amount": [5.0, 150.0, 300.0]}))
    >>> big = mb.sql(
    ...     "SELECT card_id, amount * 2 AS doubled FROM tx WHERE amount > 100", tx=tx
    ... )
    >>> query = big.write_memory("doc_sql").start(trigger="available-now")
    >>> query.await_termination()
    True
    >>> mb.table("doc_sql").rows()
    [(2, 300.0), (3, 600.0)]
    >>> mb.sql("SELECT card_id FROM tx ORDER BY amount", tx=tx)
    Traceback (most recent call last):
    ...
    microbatch.exceptions.SQLError: SQL line 1, column 24: ORDER BY: ...
    """
    return SQLContext(**streams_and_tables).sql(query)
