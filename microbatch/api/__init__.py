"""The user API: readers that make a :class:`Stream`, the stream's steps, the
writer that attaches a sink, and the handle of a started query.

``import microbatch as mb`` re-exports everything a job needs; this package is
where those names live.
"""

from __future__ import annotations

from microbatch.api.query import StreamingQuery
from microbatch.api.readers import (
    MemoryStream,
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
from microbatch.api.stream import Stream
from microbatch.api.writer import DataStreamWriter

__all__ = [
    "DataStreamWriter",
    "MemoryStream",
    "Stream",
    "StreamingQuery",
    "generate",
    "parquet_table",
    "read_delta",
    "read_files",
    "read_iceberg",
    "read_kafka",
    "read_memory",
    "read_parquet_output",
    "table",
]
