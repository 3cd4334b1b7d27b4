"""Errors raised by sinks.

They derive from the project's one error root, :class:`MicrobatchError`, which
lives in ``statestore.exceptions`` (the lowest layer) so that sinks need not
import ``microbatch``.
"""

from __future__ import annotations

from statestore.exceptions import MicrobatchError

__all__ = ["SinkConfigError", "SinkError"]


class SinkError(MicrobatchError):
    """A sink could not write a batch. The batch is not committed and will be
    retried from the write-ahead log on the next start."""


class SinkConfigError(SinkError):
    """A sink was configured wrongly (bad path, unsupported output mode)."""
