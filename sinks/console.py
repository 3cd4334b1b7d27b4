"""Print each batch to the terminal, like Spark's console sink."""

from __future__ import annotations

import sys
import threading
from typing import Any, TextIO

import polars as pl

from sinks.base import BatchContext, Sink
from sinks.exceptions import SinkConfigError

# ``pl.Config`` changes process-wide settings for the duration of a block:
# serialize our own uses of it so two console sinks do not undo each other.
_CONFIG_LOCK = threading.Lock()
_RULE = "-" * 43
_MAX_STR_LEN = 1_000_000
_MAX_WIDTH = 65_535  # polars keeps the table width in a u16


class ConsoleSink(Sink):
    """Prints ``Batch: N`` and the batch's frame to stdout or ``stream``.

    Printing cannot be undone, so exactly-once is impossible here: the sink
    remembers, per query, the last batch id it printed and skips a repeated
    (or older) id. That memory lives in the sink object only, so a batch that
    is replayed by a new process, or by a fresh sink object, is printed again.

    Parameters
    ----------
    num_rows
        At most this many rows are printed (the head and tail of the frame,
        as polars shows them); the shape line gives the full row count.
    truncate
        Shorten long strings and hide columns that do not fit the width, as
        polars does by default. ``False`` prints every column and full strings.
    stream
        A text stream to write to; ``None`` means the current ``sys.stdout``.
    """

    def __init__(
        self, num_rows: int = 20, truncate: bool = True, stream: TextIO | None = None
    ) -> None:
        if isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < 1:
            raise SinkConfigError(f"num_rows must be a positive integer, got {num_rows!r}")
        self.num_rows = num_rows
        self.truncate = truncate
        self.stream = stream
        self._last_printed: dict[str, int] = {}

    def is_written(self, batch: BatchContext) -> bool:
        """This sink object printed ``batch_id`` (or a later id) of the query."""
        last = self._last_printed.get(batch.query_id)
        return last is not None and batch.batch_id <= last

    def write(self, batch: BatchContext, df: pl.DataFrame) -> None:
        """Print the batch."""
        out = self.stream if self.stream is not None else sys.stdout
        out.write(self.render(batch.batch_id, df))
        out.flush()
        self._last_printed[batch.query_id] = batch.batch_id

    def render(self, batch_id: int, df: pl.DataFrame) -> str:
        """The text printed for one batch: a header, then the frame."""
        options: dict[str, Any] = {"tbl_rows": self.num_rows}
        if not self.truncate:
            options |= {
                "tbl_cols": -1,
                "fmt_str_lengths": _MAX_STR_LEN,
                "fmt_table_cell_list_len": -1,
                "tbl_width_chars": _MAX_WIDTH,
            }
        with _CONFIG_LOCK, pl.Config(**options):
            table = str(df)
        return f"{_RULE}\nBatch: {batch_id}\n{_RULE}\n{table}\n\n"

    def describe(self) -> dict[str, Any]:
        """The sink kind and its display options."""
        return {"kind": type(self).__name__, "num_rows": self.num_rows, "truncate": self.truncate}
