"""Errors raised by sinks.

They derive from the project's one error root, :class:`MicrobatchError`, which
lives in ``statestore.exceptions`` (the lowest layer) so that sinks need not
import ``microbatch``.
"""

from __future__ import annotations

from statestore.exceptions import MicrobatchError

__all__ = [
    "OtherWriterError",
    "PromoteUnfinishedError",
    "RetiredWriterError",
    "SinkConfigError",
    "SinkError",
]


class SinkError(MicrobatchError):
    """A sink could not write a batch. The batch is not committed and will be
    retried from the write-ahead log on the next start."""


class SinkConfigError(SinkError):
    """A sink was configured wrongly (bad path, unsupported output mode)."""


class OtherWriterError(SinkConfigError):
    """The table is written by another streaming query: writing it too would
    duplicate rows. Nothing was written."""


class RetiredWriterError(SinkConfigError):
    """This query was retired from the table (``microbatch promote`` replaced its
    rows with a rebuild's). Nothing was written."""


class PromoteUnfinishedError(SinkConfigError):
    """A ``microbatch promote`` handing the table to this query did not finish
    (killed between its two commits). Nothing was written."""
