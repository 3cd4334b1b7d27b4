"""Step 3 of the lifecycle, wherever the rows are read.

On the driver, step 3 reads every source's recorded range
(:func:`~microbatch.engine.read_ahead.read_ranges`). When the executor's
workers can read (:class:`~microbatch.engine.executors.SplitRunner`) and every
source with new rows offers splits (:meth:`~microbatch.sources.base.Source.read_splits`),
step 3 only *plans*: each source's range becomes one split per worker, cut
from the range recorded in ``offsets/N`` (so a re-run of the batch plans the
same splits), and no row crosses the driver. Worker ``w`` reads split ``w``
of every source; split order is row order, so the rows of the batch are the
concatenation of the workers' rows in worker order, as on the driver.

Either way one function turns what a source returned into the frame the plan
reads (:func:`input_of`), and the batch's facts (rows per source, dead
letters, the input schemas seen) are gathered in :class:`BatchInputs`: on the
driver as it reads, from the workers' answers when they read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from microbatch.engine.watermark import PARTITION_COLUMN
from microbatch.sources.base import ReadSplit, SourceBatch


def input_of(read: SourceBatch, schema: pl.Schema | None, *, partitions: bool) -> pl.DataFrame:
    """The frame the plan reads for one source's ``read``: the declared
    ``schema`` when it has no columns, and the per-row partition id
    (``PARTITION_COLUMN``) when the plan keeps per-partition watermarks."""
    frame = read.data
    if frame.width == 0 and schema is not None:
        frame = schema.to_frame()
    if partitions and read.partitions is not None:
        frame = frame.with_columns(read.partitions.alias(PARTITION_COLUMN))
    return frame


@dataclass
class BatchInputs:
    """What step 3 produced for batch N.

    Either ``frames`` holds every source's rows (read on the driver), or
    ``splits`` holds, for the sources with new rows, one split per worker
    (``frames`` then holds only the empty frames of the sources without new
    rows). ``rows``, ``dead`` and ``schemas`` are complete once step 4 ran:
    filled as the driver reads, or by the runner from its workers' answers.
    """

    frames: dict[str, pl.DataFrame]
    splits: dict[str, list[ReadSplit]] = field(default_factory=dict)
    partitions: bool = False
    """Add ``PARTITION_COLUMN`` from the reads (the plan has watermarks)."""
    rows: dict[str, int] = field(default_factory=dict)
    dead: list[pl.DataFrame] = field(default_factory=list)
    schemas: dict[str, pl.Schema] = field(default_factory=dict)
    """The schema of each source's rows, when they had columns."""

    @property
    def on_workers(self) -> bool:
        """The workers read this batch's rows (the driver planned splits)."""
        return bool(self.splits)

    def input_rows(self) -> dict[str, int]:
        """Rows read per source, every source of the batch included."""
        counts = {sid: frame.height for sid, frame in self.frames.items()}
        counts.update(self.rows)
        return counts

    def dead_letters(self, batch_id: int) -> pl.DataFrame:
        """The batch's dead letters with its id (no columns when there are none)."""
        dead = [d for d in self.dead if d.height]
        if not dead:
            return pl.DataFrame()
        return pl.concat(dead).with_columns(pl.lit(batch_id, pl.Int64).alias("batch_id"))


def splits_for(inputs: BatchInputs, worker: int) -> dict[str, ReadSplit]:
    """The split of each source that worker ``worker`` reads."""
    return {sid: splits[worker] for sid, splits in inputs.splits.items()}
