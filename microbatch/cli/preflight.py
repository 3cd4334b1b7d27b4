"""Checks ``run`` and ``backfill`` make before starting a query, so a mistake in a
path is exit code 2 at start, naming the path and the fix, not a failure in
batch 0 (or a native library's panic):

- a ``read_files`` directory that does not exist, is a file, or is a Delta
  table (its Parquet files read raw would include removed ones);
- a local Parquet or Delta output (and the late and dead-letter outputs)
  under a file, or in a directory this user cannot write.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from microbatch.api.writer import DataStreamWriter
from microbatch.cli.common import CliError
from microbatch.sources.files import FileSource
from sinks.base import Sink
from sinks.delta import DeltaSink
from sinks.fanout import FanOutSink
from sinks.parquet import ParquetSink
from sinks.routed import Routed


def check(writer: DataStreamWriter) -> None:
    """Raise :class:`CliError` (exit 2) for the first input or output that cannot work."""
    for source in writer.plan.sources():
        if isinstance(source, FileSource):
            check_input_directory(source.path)
    for sink in (writer.sink, writer.late_sink, writer.dead_letter):
        for path in _local_outputs(sink):
            check_writable(path)


def check_input_directory(path: Path) -> None:
    """A ``read_files`` directory must exist, be a directory and not a Delta table."""
    if not path.exists():
        raise CliError(
            f"input directory {path} does not exist: create it (files landing there are "
            "read as they arrive), or fix the path (--param input=DIR)"
        )
    if not path.is_dir():
        raise CliError(f"input {path} is a file, not a directory: read_files reads the "
                       "files landing in a directory; give the directory")
    if (path / "_delta_log").is_dir():
        raise CliError(
            f"input {path} is a Delta table: read_files would read its Parquet files raw "
            f"(removed and rewritten files included); read it with mb.read_delta({str(path)!r})"
        )


def check_writable(path: Path) -> None:
    """``path`` (an output directory) can be created or written by this user."""
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise CliError(
            f"cannot write the output {path}: {existing} is a file, not a directory; "
            "choose another output path or move the file"
        )
    for directory in (existing, existing / "_delta_log"):
        if directory.is_dir() and not os.access(directory, os.W_OK | os.X_OK):
            raise CliError(
                f"cannot write the output {path}: permission denied on {directory}; give "
                "this user write access to it, or choose another output path"
            )


def _local_outputs(sink: Sink | None) -> Iterator[Path]:
    if isinstance(sink, FanOutSink):
        for inner in sink.sinks:
            yield from _local_outputs(inner)
    elif isinstance(sink, Routed):
        yield from _local_outputs(sink.sink)
    elif isinstance(sink, DeltaSink) and "://" not in sink.uri:
        yield Path(sink.uri)
    elif isinstance(sink, ParquetSink):
        yield sink.path.expanduser().absolute()


__all__ = ["check", "check_input_directory", "check_writable"]
