"""microbatch: micro-batch stream processing on Arrow and Polars.

>>> import polars as pl
>>> import microbatch as mb
>>> stream = mb.generate(total_rows=1000, rows_per_second=None, seed=1,
...                      start="2026-01-01T00:00:00+00:00")
>>> query = stream.filter(pl.col("amount") > 100).write_memory("doc_big").start(
...     trigger="available-now")
>>> query.await_termination()
True
>>> mb.table("doc_big").height
134
"""

from __future__ import annotations

# First: in the `microbatch` command, a Ctrl-C during the imports below exits 130
# with one line instead of a traceback (microbatch/_interrupt.py; no-op otherwise).
from microbatch import _interrupt  # noqa: F401

# isort: split
from microbatch import _compat
from microbatch.api import (
    DataStreamWriter,
    MemoryStream,
    Stream,
    StreamingQuery,
    generate,
    parquet_table,
    read_delta,
    read_files,
    read_iceberg,
    read_kafka,
    read_memory,
    read_parquet_output,
    table,
)
from microbatch.distributed import RayExecutor
from microbatch.engine.executors import LocalExecutor
from microbatch.exceptions import (
    ChangeDataFeedError,
    ChangelogInputError,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointFormatError,
    CheckpointLockedError,
    ExecutorError,
    IncompatibleCheckpointError,
    JobError,
    MicrobatchError,
    PlanError,
    QueryTerminatedError,
    ReplayError,
    SavepointError,
    SourceError,
    SQLError,
    StateBudgetExceededError,
    StateReadError,
    TransformError,
    TriggerError,
    UnknownColumnError,
)
from microbatch.plan.stateful import StateInput, StateOutput
from microbatch.plan.triggers import AvailableNow, Once, ProcessingTime
from microbatch.plan.windows import cumulate_window, session_window, window
from microbatch.sql.context import SQLContext, sql
from microbatch.state import read_state

_compat.install()

__version__ = "0.1.0"

__all__ = [
    "AvailableNow",
    "ChangeDataFeedError",
    "ChangelogInputError",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointFormatError",
    "CheckpointLockedError",
    "DataStreamWriter",
    "ExecutorError",
    "IncompatibleCheckpointError",
    "JobError",
    "LocalExecutor",
    "MemoryStream",
    "MicrobatchError",
    "Once",
    "PlanError",
    "ProcessingTime",
    "QueryTerminatedError",
    "RayExecutor",
    "ReplayError",
    "SQLContext",
    "SQLError",
    "SavepointError",
    "SourceError",
    "StateBudgetExceededError",
    "StateInput",
    "StateOutput",
    "StateReadError",
    "Stream",
    "StreamingQuery",
    "TransformError",
    "TriggerError",
    "UnknownColumnError",
    "__version__",
    "cumulate_window",
    "generate",
    "parquet_table",
    "read_delta",
    "read_files",
    "read_iceberg",
    "read_kafka",
    "read_memory",
    "read_parquet_output",
    "read_state",
    "session_window",
    "sql",
    "table",
    "window",
]
