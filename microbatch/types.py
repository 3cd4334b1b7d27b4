"""The type aliases of the public API, in one place (as ``polars._typing``).

``sinks`` and ``statestore`` are packages of their own and keep their aliases;
the ones a job meets are re-exported here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Literal, TypeAlias

from sinks.base import OutputMode
from sinks.kafka import DeliveryGuarantee
from sinks.schema_check import SchemaMode

__all__ = [
    "AccumulationMode",
    "DataLossMode",
    "DeliveryGuarantee",
    "Duration",
    "FileFormat",
    "JoinHow",
    "KafkaFormat",
    "MissingColumns",
    "Offset",
    "OutputMode",
    "PathLike",
    "SchemaMode",
    "StartingOffsets",
    "StaticHow",
    "WatermarkPolicy",
]

Duration: TypeAlias = str | int | float | timedelta
"""``"10s"``, ``"1m30s"``, ``"500ms"``, a number of seconds, or a ``timedelta``."""
PathLike: TypeAlias = str | os.PathLike[str]
Offset: TypeAlias = Any
"""A source's position: any JSON value the source understands (recorded in ``offsets/N``)."""
FileFormat: TypeAlias = Literal["parquet", "json", "csv"]
MissingColumns: TypeAlias = Literal["dead_letter", "null"]
"""What ``read_files`` does with a file that lacks a column of the schema:
``"dead_letter"`` (the whole file, counted as ``schema_mismatch``) or ``"null"``."""
KafkaFormat: TypeAlias = Literal["json", "csv", "raw", "debezium-json", "upsert"]
"""How Kafka record values are encoded (``read_kafka`` and ``write_kafka``; the sink
writes ``json``, ``raw``, ``debezium-json`` or ``upsert``). ``debezium-json`` and
``upsert`` are changelogs: their rows carry ``_change_type``."""
StartingOffsets: TypeAlias = Literal["earliest", "latest"] | int | Mapping[Any, int]
DataLossMode: TypeAlias = Literal["fail", "skip"]
JoinHow: TypeAlias = Literal["inner", "left", "right", "full"]
StaticHow: TypeAlias = Literal["inner", "left"]
WatermarkPolicy: TypeAlias = Literal["min", "max"]
AccumulationMode: TypeAlias = Literal["accumulating", "discarding"]
"""What a ``group_by`` emits per batch (Beam's ``AccumulationMode``): the running
value of each group (``"accumulating"``) or only the batch's increment
(``"discarding"``, for sinks that add)."""
