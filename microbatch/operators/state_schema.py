"""The recorded column types of an operator's state: one helper for every operator.

A stateful operator learns its state's column types from the first batch
that has columns (a source without a declared schema shows them only then),
and must find exactly those types again after a restart: casting to a
guessed type could silently change values. Every operator records them with
:class:`StateSchemaFile`, in two files of its state directory:

1. ``<name>.arrow``: an empty Arrow IPC file holding the exact types;
2. a JSON checkpoint file of the operator's own kind (column names and what
   else the operator needs), written **last**: it is the commit point. A
   crash between the two leaves only the Arrow file, which the next start
   overwrites; a reader never sees types without their record.

The file names are the ones existing checkpoints hold
(:func:`keyed_schema_file` for aggregations, sessions, dedupe and
``fire_once``; ``schema.arrow`` + ``meta.json`` per join input;
``state-schema.*`` for ``transform_with_state``).
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from microbatch.checkpoint.files import (
    make_dirs,
    read_json,
    write_bytes_atomic,
    write_json_atomic,
)

__all__ = [
    "StateSchemaFile",
    "keyed_schema_file",
    "read_keyed_schema",
    "read_types",
    "write_keyed_schema",
    "write_types",
]


def write_types(path: Path, columns: Mapping[str, pl.DataType]) -> None:
    """``columns`` as an empty Arrow IPC file at ``path`` (atomic, durable)."""
    buf = io.BytesIO()
    pl.Schema(columns).to_frame().write_ipc(buf)
    write_bytes_atomic(path, buf.getvalue())


def read_types(path: Path) -> pl.Schema:
    """The exact column types :func:`write_types` recorded at ``path``."""
    return pl.Schema(pl.read_ipc_schema(path))


@dataclass(frozen=True)
class StateSchemaFile:
    """The state's column types (``types_path``) and their record
    (``record_path``, a JSON checkpoint file of kind ``kind``): the record is
    written last and is the commit point."""

    types_path: Path
    record_path: Path
    kind: str

    def committed(self) -> bool:
        """Whether a :meth:`write` finished (its record exists)."""
        return self.record_path.exists()

    def write(self, columns: Mapping[str, pl.DataType], record: Mapping[str, Any]) -> None:
        """Record ``columns``' exact types, then (the commit point) ``record``."""
        make_dirs(self.types_path.parent)
        write_types(self.types_path, columns)
        write_json_atomic(self.record_path, self.kind, dict(record))

    def read(self) -> tuple[pl.Schema, dict[str, Any]]:
        """The recorded types and record (call only when :meth:`committed`)."""
        record = read_json(self.record_path, self.kind)
        return read_types(self.types_path), record


def keyed_schema_file(state_dir: Path) -> StateSchemaFile:
    """Where aggregations, sessions, dedupe and ``fire_once`` record their
    store's key and value columns: ``schema.arrow`` and ``schema.json``."""
    return StateSchemaFile(state_dir / "schema.arrow", state_dir / "schema.json", "state-schema")


OUT_TIME = "__out_time"
"""The column of ``schema.arrow`` holding the output's time type (windows, sessions)."""


def write_keyed_schema(state_dir: Path, schema: Mapping[str, Any]) -> None:
    """Record a keyed store's ``schema``: ``keys`` and ``values`` (name -> type),
    ``out_time`` (the type window bounds are emitted in, or ``None``) and
    ``layout`` (``"keyed"`` or ``"append"``)."""
    columns = {**schema["keys"], **schema["values"]}
    if schema["out_time"] is not None:
        columns[OUT_TIME] = schema["out_time"]
    record = {
        "keys": list(schema["keys"]),
        "values": list(schema["values"]),
        # NOTE: only the append buffer is recorded; absent means a keyed store
        **({"layout": "append"} if schema.get("layout") == "append" else {}),
    }
    keyed_schema_file(state_dir).write(columns, record)


def read_keyed_schema(state_dir: Path) -> dict[str, Any] | None:
    """What :func:`write_keyed_schema` recorded, or ``None`` before its commit point."""
    file = keyed_schema_file(state_dir)
    if not file.committed():
        return None
    types, names = file.read()
    return {
        "keys": {k: types[k] for k in names["keys"]},
        "values": {k: types[k] for k in names["values"]},
        "out_time": types.get(OUT_TIME),
        # NOTE: checkpoints written before the append buffer existed keep a keyed store
        "layout": names.get("layout", "keyed"),
    }
