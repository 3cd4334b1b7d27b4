"""``CREATE TABLE ... WITH (...)``: a source stream or a sink, from Flink-style options.

A table declared in a script is a name, optional columns (with types), an
optional ``WATERMARK FOR col AS col - INTERVAL ...`` and its options::

    CREATE TABLE tx (
        card_id BIGINT, amount DECIMAL(18, 2), event_time TIMESTAMP(3),
        WATERMARK FOR event_time AS event_time - INTERVAL '10' SECOND
    ) WITH ('connector' = 'files', 'path' = 'landing/tx', 'format' = 'parquet');

Read from (``FROM tx``) it is a source :class:`~microbatch.Stream` with the
watermark declared; written to (``INSERT INTO tx``) it is a sink. What each
``'connector'`` takes, and as what role, is :data:`CONNECTORS`; the options map
one to one onto the keyword arguments of the matching ``mb.read_*`` function
or ``Stream.write_*`` method, with the same names and meaning.

Guarantees: an option that the connector does not take (a typo, or a sink's
option on a source) is refused naming the closest valid names; a value that
does not convert (``'max_files_per_batch' = 'two'``) is refused naming what it
expects; a required option that is missing is refused; all of them at the
line and column of the table or of the option, never at run time. Column types
map to Polars types (:func:`polars_type`); ``TIMESTAMP(p)``,
``TIMESTAMP_LTZ(p)`` and ``TIMESTAMP WITH TIME ZONE`` are all instants in UTC
(``Datetime(unit, "UTC")``, the engine's event time), ``p`` 0-3 milliseconds,
4-6 microseconds, 7-9 nanoseconds.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import polars as pl
from sqlglot import exp

from microbatch.api.stream import Stream
from microbatch.api.writer import DataStreamWriter
from microbatch.exceptions import SQLError
from microbatch.sql.positions import script_error

__all__ = [
    "CONNECTORS",
    "Option",
    "TableDef",
    "interval_duration",
    "polars_type",
]

Role = Literal["source", "sink"]
Locate = Callable[[exp.Expression | None], tuple[int | None, int | None]]
"""The ``(line, column)`` in the script as written of a parsed expression."""


# ------------------------------------------------------------------ option values


def _text(value: str) -> str:
    return value


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError("an integer") from None


def _float(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError("a number") from None


def _bool(value: str) -> bool:
    word = value.strip().lower()
    if word not in ("true", "false"):
        raise ValueError("'true' or 'false'")
    return word == "true"


def _names(value: str) -> list[str]:
    names = [part.strip() for part in value.split(",") if part.strip()]
    if not names:
        raise ValueError("one or more comma-separated column names")
    return names


def _fields(value: str) -> list[str]:
    """Comma-separated partition fields, commas inside a transform's parentheses
    kept: ``'day(ts), bucket(16, card_id), k'``."""
    fields, depth, start = [], 0, 0
    for at, char in enumerate(value):
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            fields.append(value[start:at].strip())
            start = at + 1
    fields.append(value[start:].strip())
    if depth != 0 or not all(fields):
        raise ValueError("comma-separated columns or transforms, e.g. 'day(ts), card_id'")
    return fields


def _snapshot(value: str) -> str | int:
    if value in ("earliest", "latest"):
        return value
    try:
        return int(value)
    except ValueError:
        raise ValueError("'earliest', 'latest' or a snapshot id") from None


def _optional(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(value: str) -> Any:
        return None if value.strip().lower() in ("", "none") else convert(value)

    return parse


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in choices:
            raise ValueError("one of " + ", ".join(repr(c) for c in choices))
        return value

    return parse


def _offsets(value: str) -> str | int:
    if value in ("earliest", "latest"):
        return value
    try:
        return int(value)
    except ValueError:
        raise ValueError("'earliest', 'latest' or a timestamp in epoch milliseconds") from None


_OUTPUT_MODE = _choice("append", "update", "complete", "changelog")

CONNECTORS: dict[str, dict[Role, dict[str, Callable[[str], Any]]]] = {
    "files": {
        "source": {"path": _text, "format": _choice("parquet", "json", "csv"),
                   "max_files_per_batch": _int, "glob": _text,
                   "on_missing_columns": _choice("dead_letter", "null")},
        "sink": {"path": _text, "format": _choice("parquet"), "partition_by": _names,
                 "output_mode": _OUTPUT_MODE},
    },
    "kafka": {
        "source": {"topic": _names, "bootstrap": _text,
                   "format": _choice("json", "csv", "raw", "debezium-json", "upsert"),
                   "max_records_per_batch": _int, "starting_offsets": _offsets,
                   "commit_group": _text, "key_columns": _names, "broker_timeout": _text,
                   "on_data_loss": _choice("fail", "skip")},
        "sink": {"topic": _text, "bootstrap": _text,
                 "format": _choice("json", "raw", "debezium-json", "upsert"),
                 "key": _text, "key_columns": _names,
                 "delivery_guarantee": _choice("exactly_once", "at_least_once"),
                 "output_mode": _OUTPUT_MODE},
    },
    "delta": {
        "source": {"path": _text, "changes": _bool, "starting_version": _int,
                   "starting_timestamp": _text, "max_files_per_batch": _int,
                   "ignore_changes": _bool},
        "sink": {"path": _text, "merge_keys": _names, "partition_by": _names,
                 "change_data_feed": _bool, "optimize_every": _int,
                 "schema_mode": _choice("merge"), "output_mode": _OUTPUT_MODE},
    },
    "iceberg": {
        "source": {"table": _text, "catalog": _text, "starting_snapshot": _snapshot,
                   "starting_timestamp": _text, "max_files_per_batch": _int,
                   "ignore_changes": _bool, "skip_change_commits": _bool},
        "sink": {"table": _text, "catalog": _text, "merge_keys": _names,
                 "partition_by": _fields, "schema_mode": _choice("merge"), "location": _text,
                 "output_mode": _OUTPUT_MODE},
    },
    "generator": {
        "source": {"rows_per_second": _optional(_float), "total_rows": _optional(_int),
                   "cards": _int, "zipf": _float, "partitions": _int, "max_delay": _text,
                   "late_fraction": _float, "start": _text, "seed": _int,
                   "max_records_per_batch": _optional(_int), "event_rate": _optional(_float)},
    },
    "console": {"sink": {"num_rows": _int, "output_mode": _OUTPUT_MODE}},
    "memory": {"sink": {"name": _text, "output_mode": _OUTPUT_MODE}},
}
"""Per ``'connector'``, the options it takes as a source and as a sink, with
their converters (``'parquet'`` is another name of ``'files'``)."""

_ALIASES = {"parquet": "files"}
_REQUIRED: dict[tuple[str, Role], tuple[str, ...]] = {
    ("files", "source"): ("path",), ("files", "sink"): ("path",),
    ("kafka", "source"): ("topic", "bootstrap"), ("kafka", "sink"): ("topic", "bootstrap"),
    ("delta", "source"): ("path",), ("delta", "sink"): ("path",),
    ("iceberg", "source"): ("table", "catalog"), ("iceberg", "sink"): ("table", "catalog"),
}
_EXAMPLE = ("WITH ('connector' = 'files', 'path' = 'landing/tx', 'format' = 'parquet')")


@dataclass(frozen=True)
class Option:
    """One ``'name' = 'value'`` of a ``WITH`` list, with where it was written."""

    name: str
    value: str
    line: int | None = None
    column: int | None = None


# ------------------------------------------------------------------ types


_UNITS = {**dict.fromkeys(range(4), "ms"), **dict.fromkeys(range(4, 7), "us"),
          **dict.fromkeys(range(7, 10), "ns")}
_SIMPLE: dict[Any, pl.DataType] = {
    exp.DataType.Type.TINYINT: pl.Int8(), exp.DataType.Type.SMALLINT: pl.Int16(),
    exp.DataType.Type.INT: pl.Int32(), exp.DataType.Type.BIGINT: pl.Int64(),
    exp.DataType.Type.UTINYINT: pl.UInt8(), exp.DataType.Type.USMALLINT: pl.UInt16(),
    exp.DataType.Type.UINT: pl.UInt32(), exp.DataType.Type.UBIGINT: pl.UInt64(),
    exp.DataType.Type.FLOAT: pl.Float32(), exp.DataType.Type.DOUBLE: pl.Float64(),
    exp.DataType.Type.BOOLEAN: pl.Boolean(), exp.DataType.Type.DATE: pl.Date(),
    exp.DataType.Type.TEXT: pl.String(), exp.DataType.Type.VARCHAR: pl.String(),
    exp.DataType.Type.CHAR: pl.String(), exp.DataType.Type.NVARCHAR: pl.String(),
    exp.DataType.Type.BINARY: pl.Binary(), exp.DataType.Type.VARBINARY: pl.Binary(),
}
_TIMESTAMPS = {exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPLTZ,
               exp.DataType.Type.TIMESTAMPTZ, exp.DataType.Type.DATETIME}


def polars_type(kind: exp.DataType) -> pl.DataType:
    """The Polars type of a SQL column type; ``ValueError`` names the types taken."""
    params = [int(p.name) for p in kind.expressions if p.name.isdigit()]
    if kind.this in _SIMPLE:
        return _SIMPLE[kind.this]
    if kind.this in _TIMESTAMPS:
        precision = params[0] if params else 6
        if precision not in _UNITS:
            raise ValueError(f"a timestamp precision of 0 to 9, not {precision}")
        return pl.Datetime(_UNITS[precision], "UTC")  # type: ignore[arg-type]
    if kind.this == exp.DataType.Type.DECIMAL:
        precision = params[0] if params else 38
        return pl.Decimal(precision, params[1] if len(params) > 1 else 0)
    raise ValueError(
        "one of BOOLEAN, TINYINT, SMALLINT, INT, BIGINT, FLOAT, DOUBLE, DECIMAL(p, s), "
        "STRING/VARCHAR, BINARY/VARBINARY, DATE, TIMESTAMP(p) (UTC)"
    )


_INTERVAL_UNITS = {
    "MILLISECOND": "ms", "MILLISECONDS": "ms", "SECOND": "s", "SECONDS": "s",
    "MINUTE": "m", "MINUTES": "m", "HOUR": "h", "HOURS": "h", "DAY": "d", "DAYS": "d",
}


def interval_duration(node: exp.Expression) -> str:
    """``INTERVAL '10' SECOND`` as the engine's duration text ``"10s"``.

    Raises ``ValueError`` saying what is taken for any other expression.
    """
    if isinstance(node, exp.Interval):
        amount = node.this.name if node.this is not None else ""
        unit = node.unit.name.upper() if node.unit is not None else ""
        if not unit and " " in amount:  # INTERVAL '10 SECOND'
            amount, unit = (part.upper() if i else part
                            for i, part in enumerate(amount.split(None, 1)))
        if amount.isdigit() and unit in _INTERVAL_UNITS:
            return f"{amount}{_INTERVAL_UNITS[unit]}"
    raise ValueError(
        "an interval of a whole number of MILLISECOND, SECOND, MINUTE, HOUR or DAY, "
        "e.g. INTERVAL '10' SECOND"
    )


# ------------------------------------------------------------------ tables


@dataclass(frozen=True)
class TableDef:
    """A table declared with ``CREATE TABLE``: what it reads or writes, checked.

    ``columns`` is ``None`` when the statement lists none (a Parquet or Delta
    source then has the files' columns; a sink takes the query's columns).
    """

    name: str
    connector: str
    options: Mapping[str, Option]
    columns: pl.Schema | None
    watermark: tuple[str, str] | None
    """``(column, delay)`` from ``WATERMARK FOR``."""
    line: int | None = None
    column: int | None = None
    _locate: Locate | None = field(default=None, repr=False, compare=False)
    processing_time: str | None = None
    """The column declared ``name AS PROCTIME()``: ``with_processing_time(name)``."""

    # -------------------------------------------------------------- building

    @classmethod
    def from_create(cls, create: exp.Create, locate: Locate) -> TableDef:
        """The table a parsed ``CREATE TABLE`` declares (options checked against
        every role of its connector; each role's own set is checked on use)."""
        schema_node = create.this
        table = schema_node.this if isinstance(schema_node, exp.Schema) else schema_node
        name = table.name
        line, column = locate(table)
        columns: dict[str, pl.DataType] = {}
        watermark: tuple[str, str] | None = None
        proctime: str | None = None
        if isinstance(schema_node, exp.Schema):
            for item in schema_node.expressions:
                if isinstance(item, exp.ColumnDef) and _computed(item) is not None:
                    proctime = _proctime_column(name, item, proctime, locate)
                elif isinstance(item, exp.ColumnDef):
                    columns[item.name] = _column_type(name, item, locate)
                elif isinstance(item, exp.WatermarkColumnConstraint):
                    watermark = _watermark(name, item, locate)
                else:
                    where = locate(item)
                    raise script_error(
                        f"table {name}: {item.sql()!r} is not taken in a column "
                        "list; list columns with their types and at most one "
                        "WATERMARK FOR col AS col - INTERVAL 'n' SECOND",
                        line=where[0], column=where[1], construct=item.sql(),
                    )
        if proctime is not None and proctime in columns:
            raise script_error(
                f"table {name}: {proctime} is declared twice, as a column and AS PROCTIME(); "
                "name the processing-time column differently",
                line=line, column=column, construct=f"{proctime} AS PROCTIME()",
            )
        if watermark is not None and watermark[0] == proctime:
            raise script_error(
                f"table {name}: {proctime} AS PROCTIME() is a processing-time attribute, "
                "its watermark is the batch's own time; drop WATERMARK FOR "
                f"{proctime} (a watermark is for an event-time column)",
                line=line, column=column, construct=f"WATERMARK FOR {proctime}",
            )
        if watermark is not None and columns and watermark[0] not in columns:
            raise script_error(
                f"table {name}: WATERMARK FOR {watermark[0]} names no "
                f"column of the table ({', '.join(columns)}); declare the column",
                line=line, column=column, construct=f"WATERMARK FOR {watermark[0]}",
            )
        options = table_options(create, locate)
        table = cls.from_options(name, options,
                                 columns=pl.Schema(columns) if columns else None,
                                 watermark=watermark, line=line, column=column, locate=locate)
        if proctime is None:
            return table
        if "source" not in table.roles:
            raise script_error(
                f"table {name}: {proctime} AS PROCTIME() is taken on a source, and the "
                f"'{table.connector}' connector is only a sink; drop the column",
                line=line, column=column, construct=f"{proctime} AS PROCTIME()",
            )
        return replace(table, processing_time=proctime)

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Option], *,
                     columns: pl.Schema | None = None,
                     watermark: tuple[str, str] | None = None,
                     line: int | None = None, column: int | None = None,
                     locate: Locate | None = None) -> TableDef:
        """The table ``name`` with ``options`` (``'connector'`` among them), checked."""
        connector_option = options.get("connector")
        if connector_option is None:
            raise script_error(
                f"table {name} has no 'connector' option: add one of "
                f"{', '.join(repr(c) for c in CONNECTORS)}, e.g. {_EXAMPLE}",
                line=line, column=column, construct=f"CREATE TABLE {name}",
            )
        connector = _ALIASES.get(connector_option.value, connector_option.value)
        if connector not in CONNECTORS:
            at = (connector_option.line, connector_option.column)
            close = difflib.get_close_matches(connector, list(CONNECTORS), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise script_error(
                f"table {name}: unknown connector {connector_option.value!r}; "
                f"{hint}the connectors are {', '.join(repr(c) for c in CONNECTORS)}",
                line=at[0], column=at[1], construct=f"'connector' = '{connector_option.value}'",
            )
        taken = set().union(*(set(o) for o in CONNECTORS[connector].values()))
        table = cls(name, connector, dict(options), columns, watermark, line, column, locate)
        table._check_names(taken, "either role")
        for option in table.options.values():
            # a value must convert for some role taking it; each role checks its own on use
            roles = [r for r, names in CONNECTORS[connector].items() if option.name in names]
            errors = []
            for role in roles:
                try:
                    table._converted(role, only_known=True, names={option.name})
                except SQLError as exc:
                    errors.append(exc)
            if roles and len(errors) == len(roles):
                raise errors[0]
        return table

    # -------------------------------------------------------------- roles

    @property
    def roles(self) -> tuple[Role, ...]:
        """What the connector can be: ``("source",)``, ``("sink",)`` or both."""
        return tuple(CONNECTORS[self.connector])

    def source(self) -> Stream:
        """The stream this table reads, with its watermark; refused for a sink-only
        connector or an option only a sink takes."""
        kwargs = self._role_kwargs("source")
        stream = _SOURCES[self.connector](self, kwargs)
        if self.watermark is not None:
            stream = stream.with_watermark(*self.watermark)
        if self.processing_time is not None:
            stream = stream.with_processing_time(self.processing_time)
        return stream

    def writer(self, stream: Stream, *, output_mode: str | None = None) -> DataStreamWriter:
        """``stream`` written to this table: its columns checked against the
        declared ones (same names, in order; values cast to the declared types).

        ``output_mode`` is the statement's (a materialized view: ``update``)
        unless the table's ``'output_mode'`` option says otherwise.
        """
        kwargs = self._role_kwargs("sink")
        if self.columns is not None:
            stream = self._conform(stream)
        mode = kwargs.pop("output_mode", None) or output_mode or "append"
        return _SINKS[self.connector](self, stream, mode, kwargs)

    # -------------------------------------------------------------- helpers

    def _role_kwargs(self, role: Role) -> dict[str, Any]:
        if role not in CONNECTORS[self.connector]:
            can = " and ".join(self.roles)
            fix = ("read it in FROM" if role == "sink" else
                   "write to it with INSERT INTO, or declare a source with 'connector' = "
                   "'files', 'kafka', 'delta' or 'generator'")
            raise script_error(
                f"table {self.name} ('connector' = "
                f"'{self.connector}') is only a {can}, so it cannot be "
                f"{'read' if role == 'source' else 'written'}: {fix}",
                line=self.line, column=self.column, construct=f"table {self.name}",
            )
        self._check_names(set(CONNECTORS[self.connector][role]), f"a {role}")
        kwargs = self._converted(role, only_known=False)
        missing = [n for n in _REQUIRED.get((self.connector, role), ()) if n not in kwargs]
        if missing:
            raise script_error(
                f"table {self.name}: a '{self.connector}' "
                f"{role} needs {' and '.join(repr(m) for m in missing)}: add "
                + ", ".join(f"'{m}' = '...'" for m in missing) + " to its WITH list",
                line=self.line, column=self.column, construct=f"table {self.name}",
            )
        return kwargs

    def _check_names(self, taken: set[str], role: str) -> None:
        for option in self.options.values():
            if option.name == "connector" or option.name in taken:
                continue
            close = difflib.get_close_matches(option.name, sorted(taken), n=2, cutoff=0.6)
            hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
            raise script_error(
                f"table {self.name}: the "
                f"'{self.connector}' connector takes no option {option.name!r} as "
                f"{role}; {hint}it takes {', '.join(repr(t) for t in sorted(taken))}",
                line=option.line, column=option.column, construct=f"'{option.name}'",
            )

    def _converted(self, role: Role, *, only_known: bool,
                   names: set[str] | None = None) -> dict[str, Any]:
        converters = CONNECTORS[self.connector][role]
        kwargs: dict[str, Any] = {}
        for option in self.options.values():
            if names is not None and option.name not in names:
                continue
            convert = converters.get(option.name)
            if option.name == "connector" or (convert is None and only_known):
                continue
            assert convert is not None
            try:
                kwargs[option.name] = convert(option.value)
            except ValueError as exc:
                raise script_error(
                    f"table {self.name}: "
                    f"'{option.name}' = {option.value!r} is not valid: expected {exc}",
                    line=option.line, column=option.column,
                    construct=f"'{option.name}' = '{option.value}'",
                ) from None
        return kwargs

    def _conform(self, stream: Stream) -> Stream:
        assert self.columns is not None
        got = list(stream.schema.names())
        want = list(self.columns.names())
        if got != want:
            raise script_error(
                f"the query written to {self.name} has the "
                f"columns ({', '.join(got)}), the table declares ({', '.join(want)}): "
                "select the table's columns in its order (rename with AS), or change the "
                "table's column list",
                line=self.line, column=self.column, construct=f"INSERT INTO {self.name}",
            )
        casts = [pl.col(n).cast(t) if stream.schema[n] != t else pl.col(n)
                 for n, t in self.columns.items()]
        if all(stream.schema[n] == t for n, t in self.columns.items()):
            return stream
        return stream.select(casts)


def table_options(create: exp.Create, locate: Locate) -> dict[str, Option]:
    """The ``'k' = 'v'`` options of a parsed ``CREATE ... WITH (...)``."""
    properties = create.args.get("properties")
    options: dict[str, Option] = {}
    for prop in properties.expressions if properties is not None else []:
        if not isinstance(prop, exp.Property) or isinstance(prop, exp.MaterializedProperty):
            continue  # MATERIALIZED of CREATE MATERIALIZED VIEW is a property too
        key, value = prop.this, prop.args.get("value")
        line, column = locate(key if isinstance(key, exp.Expression) else prop)
        name = key.name if isinstance(key, exp.Expression) else str(key)
        if not isinstance(value, exp.Literal):
            shown = value.sql() if isinstance(value, exp.Expression) else str(value)
            raise script_error(
                f"option {name!r}: the value {shown} is not a literal; "
                f"write it quoted, '{name}' = '...'",
                line=line, column=column, construct=f"'{name}'",
            )
        if name in options:
            raise script_error(
                f"option {name!r} is given twice; keep one",
                line=line, column=column, construct=f"'{name}'",
            )
        options[name] = Option(name, value.name, line, column)
    return options


def _column_type(table: str, item: exp.ColumnDef, locate: Locate) -> pl.DataType:
    kind = item.args.get("kind")
    where = locate(item.this)
    if not isinstance(kind, exp.DataType):
        raise script_error(
            f"table {table}: column {item.name} has no type; write "
            f"`{item.name} BIGINT` (or another type)",
            line=where[0], column=where[1], construct=item.name,
        )
    try:
        return polars_type(kind)
    except ValueError as exc:
        raise script_error(
            f"table {table}: column {item.name} has the type {kind.sql()}, "
            f"not taken; use {exc}",
            line=where[0], column=where[1], construct=kind.sql(),
        ) from None


def _computed(item: exp.ColumnDef) -> exp.ComputedColumnConstraint | None:
    """The ``AS expr`` of a computed column (``name AS PROCTIME()``), if any."""
    for constraint in item.args.get("constraints") or []:
        if isinstance(constraint.args.get("kind"), exp.ComputedColumnConstraint):
            kind: exp.ComputedColumnConstraint = constraint.args["kind"]
            return kind
    return None


def _proctime_column(table: str, item: exp.ColumnDef, seen: str | None,
                     locate: Locate) -> str:
    """``name AS PROCTIME()``: the table's processing-time column (Flink's form);
    any other computed column, or a second one, is refused at the column."""
    computed = _computed(item)
    assert computed is not None
    call = computed.this
    where = locate(item.this)
    if not (isinstance(call, exp.Anonymous) and str(call.this).upper() == "PROCTIME"
            and not call.expressions):
        raise script_error(
            f"table {table}: the computed column {item.name} AS {call.sql()} is not "
            f"taken; the only computed column is `{item.name} AS PROCTIME()` (compute "
            "other values in the query's SELECT)",
            line=where[0], column=where[1], construct=item.name,
        )
    if seen is not None:
        raise script_error(
            f"table {table}: {seen} is already its PROCTIME() column; keep one",
            line=where[0], column=where[1], construct=item.name,
        )
    return item.name


def _watermark(table: str, item: exp.WatermarkColumnConstraint,
               locate: Locate) -> tuple[str, str]:
    column_node, expression = item.this, item.expression
    where = locate(column_node if isinstance(column_node, exp.Expression) else item)
    name = column_node.name if isinstance(column_node, exp.Expression) else ""
    shape = f"WATERMARK FOR {name or 'col'} AS {name or 'col'} - INTERVAL '10' SECOND"
    if isinstance(expression, exp.Column) and expression.name == name:
        return name, "0s"
    if (isinstance(expression, exp.Sub) and isinstance(expression.this, exp.Column)
            and expression.this.name == name):
        try:
            return name, interval_duration(expression.expression)
        except ValueError as exc:
            where = locate(expression.expression)
            raise script_error(
                f"table {table}: the watermark delay "
                f"{expression.expression.sql()} is not taken; write {exc}",
                line=where[0], column=where[1], construct=expression.expression.sql(),
            ) from None
    shown = expression.sql() if isinstance(expression, exp.Expression) else "nothing"
    raise script_error(
        f"table {table}: the watermark must be the column minus a fixed "
        f"interval, not {shown}; write {shape}",
        line=where[0], column=where[1], construct=f"WATERMARK FOR {name}",
    )


# ------------------------------------------------------------------ connectors


def _cast_to_declared(table: TableDef, stream: Stream) -> Stream:
    """A source whose columns are fixed (generator, Delta): the declared ones, cast."""
    if table.columns is None:
        return stream
    have = stream.schema
    unknown = [n for n in table.columns.names() if n not in have]
    if unknown:
        raise script_error(
            f"table {table.name}: the '{table.connector}' "
            f"source has no column {unknown[0]!r}; it has {', '.join(have.names())}",
            line=table.line, column=table.column, construct=unknown[0],
        )
    return stream.select([pl.col(n).cast(t) for n, t in table.columns.items()])


def _files_source(table: TableDef, kwargs: dict[str, Any]) -> Stream:
    from microbatch.api.readers import read_files

    fmt = kwargs.get("format", "parquet")
    if fmt != "parquet" and table.columns is None:
        raise script_error(
            f"table {table.name}: a '{fmt}' files source "
            "needs its columns: list them with their types, CREATE TABLE "
            f"{table.name} (id BIGINT, ...) WITH (...)",
            line=table.line, column=table.column, construct=f"table {table.name}",
        )
    return read_files(kwargs.pop("path"), schema=table.columns, **kwargs)


def _kafka_source(table: TableDef, kwargs: dict[str, Any]) -> Stream:
    from microbatch.api.readers import read_kafka

    if table.columns is None and kwargs.get("format", "json") != "raw":
        raise script_error(
            f"table {table.name}: a Kafka source needs the "
            "columns of its values: list them with their types",
            line=table.line, column=table.column, construct=f"table {table.name}",
        )
    topics = kwargs.pop("topic")
    return read_kafka(topics, schema=table.columns, metadata_columns=(), **kwargs)


def _delta_source(table: TableDef, kwargs: dict[str, Any]) -> Stream:
    from microbatch.api.readers import read_delta

    return _cast_to_declared(table, read_delta(kwargs.pop("path"), **kwargs))


def _iceberg_source(table: TableDef, kwargs: dict[str, Any]) -> Stream:
    from microbatch.api.readers import read_iceberg

    return _cast_to_declared(table, read_iceberg(kwargs.pop("table"), **kwargs))


def _generator_source(table: TableDef, kwargs: dict[str, Any]) -> Stream:
    from microbatch.api.readers import generate

    return _cast_to_declared(table, generate(**kwargs))


_SOURCES: dict[str, Callable[[TableDef, dict[str, Any]], Stream]] = {
    "files": _files_source, "kafka": _kafka_source, "delta": _delta_source,
    "iceberg": _iceberg_source, "generator": _generator_source,
}


def _files_sink(table: TableDef, stream: Stream, mode: Any,
                kwargs: dict[str, Any]) -> DataStreamWriter:
    kwargs.pop("format", None)
    return stream.write_parquet(kwargs.pop("path"), output_mode=mode, **kwargs)


def _kafka_sink(table: TableDef, stream: Stream, mode: Any,
                kwargs: dict[str, Any]) -> DataStreamWriter:
    return stream.write_kafka(kwargs.pop("topic"), output_mode=mode, **kwargs)


def _delta_sink(table: TableDef, stream: Stream, mode: Any,
                kwargs: dict[str, Any]) -> DataStreamWriter:
    return stream.write_delta(kwargs.pop("path"), output_mode=mode, **kwargs)


def _iceberg_sink(table: TableDef, stream: Stream, mode: Any,
                  kwargs: dict[str, Any]) -> DataStreamWriter:
    return stream.write_iceberg(kwargs.pop("table"), output_mode=mode, **kwargs)


def _console_sink(table: TableDef, stream: Stream, mode: Any,
                  kwargs: dict[str, Any]) -> DataStreamWriter:
    return stream.write_console(output_mode=mode, **kwargs)


def _memory_sink(table: TableDef, stream: Stream, mode: Any,
                 kwargs: dict[str, Any]) -> DataStreamWriter:
    return stream.write_memory(kwargs.pop("name", table.name), output_mode=mode)


_SINKS: dict[str, Callable[[TableDef, Stream, Any, dict[str, Any]], DataStreamWriter]] = {
    "files": _files_sink, "kafka": _kafka_sink, "delta": _delta_sink,
    "iceberg": _iceberg_sink, "console": _console_sink, "memory": _memory_sink,
}
