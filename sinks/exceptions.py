"""Errors raised by sinks."""

from __future__ import annotations


class SinkError(Exception):
    """A sink could not write a batch. The batch is not committed and will be
    retried from the write-ahead log on the next start."""


class SinkConfigError(SinkError):
    """A sink was configured wrongly (bad path, unsupported output mode)."""
