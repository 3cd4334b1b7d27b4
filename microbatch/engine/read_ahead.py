"""Reading the next batch's input while the current batch is in its sink.

With a backlog (``available-now`` backfills, a query falling behind), the
range of batch N+1 is already known while batch N is being written: it
starts where N ends and is capped by the source's per-batch limit. Reading it
on a background thread overlaps the source's decode with the sink's encode.

Batch N+1 is still planned, written ahead and recorded as usual. The
planner adopts a read-ahead's end offsets when they do not pass what the
sources have now (:meth:`ReadAhead.ends_within`): on a live source (a Kafka
topic still being written to) the latest offsets move between the guess and
the plan, and a batch planned afresh would never match, so every read-ahead
would be wasted and its records read twice. The read-ahead result is used
only when the planned ranges are exactly the ones read (sources return the
same rows for the same range, so the result is the same as a fresh read).
Otherwise it is dropped. The engine waits for a read-ahead to finish before it plans again,
so a source is never used by two threads at once.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from microbatch.sources.base import Source, SourceBatch
from microbatch.types import Offset

log = logging.getLogger("microbatch.engine.read_ahead")

Ranges = dict[str, tuple[Offset, Offset]]


def read_ranges(sources: dict[str, Source], ranges: Ranges) -> dict[str, SourceBatch | None]:
    """Each source's rows for its range (``None`` for an empty range)."""
    return {
        sid: sources[sid].read(start, end) if sources[sid].compare(end, start) > 0 else None
        for sid, (start, end) in ranges.items()
    }


class ReadAhead:
    """At most one background read of a planned-to-be range."""

    def __init__(self, sources: dict[str, Source]) -> None:
        self.sources = sources
        self._pool: ThreadPoolExecutor | None = None
        self._ranges: Ranges | None = None
        self._future: Future[dict[str, SourceBatch | None]] | None = None
        self.hits = 0

    def start(self, ranges: Ranges) -> None:
        """Begin reading ``ranges`` in the background (replacing any earlier one)."""
        self.wait()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="microbatch-read-ahead")
        self._ranges = ranges
        self._future = self._pool.submit(read_ranges, self.sources, ranges)

    def ends_within(self, ranges: Ranges) -> Ranges | None:
        """The read-ahead's ranges when each starts where ``ranges`` does and ends
        no later (``ranges``: what the sources offer now), else ``None``."""
        mine = self._ranges
        if mine is None or mine.keys() != ranges.keys():
            return None
        for sid, (start, end) in ranges.items():
            source = self.sources[sid]
            my_start, my_end = mine[sid]
            if source.compare(my_start, start) != 0 or source.compare(my_end, end) > 0:
                return None
        return dict(mine)

    def wait(self) -> None:
        """Block until the background read (if any) finished; keep its result."""
        if self._future is not None:
            self._future.exception()

    def take(self, ranges: Ranges) -> dict[str, SourceBatch | None] | None:
        """The result for exactly ``ranges``, or ``None`` (then read afresh)."""
        future, wanted = self._future, self._ranges
        self._future = self._ranges = None
        if future is None:
            return None
        error = future.exception()
        if wanted != ranges or error is not None:
            if error is not None:
                log.debug("read-ahead failed (%s); reading again", error)
            return None
        self.hits += 1
        return future.result()

    def close(self) -> None:
        self.wait()
        self._future = self._ranges = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def describe(self) -> dict[str, Any]:
        return {"hits": self.hits}
