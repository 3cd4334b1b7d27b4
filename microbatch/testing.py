"""A harness to unit-test streaming jobs batch by batch, as our own tests do.

>>> import polars as pl, microbatch as mb
>>> from microbatch.testing import StreamTest
>>> t = StreamTest(
...     lambda src: src.with_watermark("ts", "10s")
...     .group_by(mb.window("ts", "1m"), "k").agg(pl.len().alias("n")),
...     schema={"ts": pl.Datetime("ms", "UTC"), "k": pl.Int64},
... )
>>> _ = t.add({"ts": [t.at("00:00:05"), t.at("00:00:30")], "k": [1, 1]}).process()
>>> t.add({"ts": [t.at("00:01:30")], "k": [2]}).process()["n"].to_list()
[2]

Each ``process()`` runs the batch the added rows make (one batch, all of
them) and then the no-data batch that the advanced watermark calls for, and
returns the rows the sink received. ``restart()`` drops the running engine
and recovers a new one from the checkpoint, as a process restart would;
``advance_clock`` moves the processing-time clock (idle timeouts).

:class:`JoinStreamTest` is the same with two memory sources, for joins:
``build(left, right)``, ``add_left(rows)`` / ``add_right(rows)``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Self

import polars as pl

from microbatch.api.readers import MemoryStream, read_memory
from microbatch.api.stream import Stream
from microbatch.api.writer import output_keys, validate_aggregations
from microbatch.checkpoint import Checkpoint
from microbatch.engine.batch_executor import validate_joins
from microbatch.engine.execution import MicroBatchExecution
from microbatch.engine.state_backend import parse_state_backend
from microbatch.observability.progress_schema import ProgressRecord
from microbatch.plan.triggers import ProcessingTime
from microbatch.types import OutputMode
from sinks.base import BatchContext, Sink

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


class CollectSink(Sink):
    """An in-process sink for tests: keeps each batch's frame exactly as it came
    (``batches``: batch id -> frame, changelog rows included); a re-written
    batch id replaces its frame, so it is idempotent per batch id like every sink."""

    supported_modes: tuple[OutputMode, ...] = ("append", "update", "complete", "changelog")

    def __init__(self) -> None:
        self.batches: dict[int, pl.DataFrame] = {}

    def is_written(self, batch: BatchContext) -> bool:
        return batch.batch_id in self.batches

    def write(self, batch: BatchContext, df: pl.DataFrame) -> None:
        self.batches[batch.batch_id] = df

    def rows(self, since: int = 0) -> pl.DataFrame:
        """The rows of batches ``since`` and later, in batch order."""
        frames = [df for bid, df in sorted(self.batches.items()) if bid >= since and df.width]
        return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()


class _Harness:
    """The engine side of the test harnesses: a query on a fake clock."""

    stream: Stream

    def _setup(
        self,
        *,
        output_mode: OutputMode,
        checkpoint: str | Path | None,
        start: datetime,
        state_backend: str = "memory",
    ) -> None:
        self.state_backend = state_backend
        validate_aggregations(self.stream.plan, output_mode)
        validate_joins(self.stream.plan, output_mode)
        self.output_mode = output_mode
        self.checkpoint = Path(checkpoint or tempfile.mkdtemp(prefix="microbatch-test-"))
        self.sink = CollectSink()
        self.late = CollectSink()
        self.start_time = start
        self.now = start.timestamp()
        self._exec: MicroBatchExecution | None = None
        self._open()

    def at(self, clock: str, day: int = 0) -> datetime:
        """A timestamp ``HH:MM:SS[.fff]`` on ``day`` days after the start date."""
        parts = [float(p) for p in clock.split(":")]
        while len(parts) < 3:
            parts.insert(0, 0.0)
        h, m, s = parts
        return self.start_time + timedelta(days=day, hours=h, minutes=m, seconds=s)

    def _open(self) -> None:
        self._exec = MicroBatchExecution(
            plan=self.stream.plan,
            sink=self.sink,
            output_mode=self.output_mode,
            checkpoint=Checkpoint(self.checkpoint),
            trigger=ProcessingTime(0),
            late_sink=self.late,
            key_columns=tuple(output_keys(self.stream.plan)),
            clock=lambda: self.now,
            state_backend=self.state_backend,
        )
        self._exec.open()

    @property
    def execution(self) -> MicroBatchExecution:
        assert self._exec is not None
        return self._exec

    def process(self) -> pl.DataFrame:
        """Run the pending batch and any no-data batch; return what the sink got."""
        ex = self.execution
        first = ex.next_batch_id
        ex.run_batch(capped=False)
        while ex.run_batch(bounds=dict(ex.committed)):
            pass
        return self.sink.rows(first)

    def advance_clock(self, seconds: float) -> Self:
        """Move processing time forward (affects idle timeouts and timestamps)."""
        self.now += seconds
        return self

    def restart(self) -> Self:
        """Drop the engine and recover a new one from the checkpoint."""
        self.execution.close()
        self._open()
        return self

    def close(self) -> None:
        if self._exec is not None:
            self._exec.close()
            self._exec = None

    @property
    def output(self) -> pl.DataFrame:
        """Every row the sink received so far, in batch order."""
        return self.sink.rows()

    @property
    def late_rows(self) -> pl.DataFrame:
        """Every row routed to the late-data output so far."""
        return self.late.rows()

    @property
    def watermark_ms(self) -> int | None:
        """The watermark the next batch will use."""
        return self.execution.tracker.current

    @property
    def progress(self) -> list[ProgressRecord]:
        """The progress records of the batches run so far, oldest first."""
        return list(self.execution.progress.recent)

    def expect(
        self, rows: pl.DataFrame | Mapping[str, Sequence[Any]], *, got: pl.DataFrame | None = None
    ) -> None:
        """Assert the sink's rows (or ``got``) equal ``rows``, ignoring row order."""
        expected = rows if isinstance(rows, pl.DataFrame) else pl.DataFrame(rows)
        actual = self.output if got is None else got
        actual = actual.select(expected.columns) if actual.width else actual
        cols = expected.columns
        if actual.height != expected.height or (
            actual.height and not actual.sort(cols).equals(expected.sort(cols), null_equal=True)
        ):
            raise AssertionError(f"stream output differs\nexpected:\n{expected}\ngot:\n{actual}")


Rows = pl.DataFrame | Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]]


class StreamTest(_Harness):
    """Drive ``build(source_stream)`` with explicit rows, batch by batch."""

    def __init__(
        self,
        build: Callable[[MemoryStream], Stream],
        *,
        schema: Mapping[str, Any],
        output_mode: OutputMode = "append",
        checkpoint: str | Path | None = None,
        start: datetime = EPOCH,
        partition_column: str | None = None,
        state_backend: str = "memory",
    ) -> None:
        """``state_backend``: as ``writer.start``'s (``"memory"``, ``"lmdb"``/``"disk"``)."""
        self.source = read_memory(schema=schema, partition_column=partition_column)
        self.stream = build(self.source)
        self._setup(output_mode=output_mode, checkpoint=checkpoint, start=start,
                    state_backend=parse_state_backend(state_backend))

    def add(self, rows: Rows) -> StreamTest:
        """Append input rows (they form the next batch)."""
        self.source.add(rows)
        return self


class JoinStreamTest(_Harness):
    """Drive ``build(left, right)`` — two memory sources — batch by batch.

    A schema of ``None`` is taken from the first rows added to that input
    (until then its batches have no columns, like a schemaless file source).

    >>> import polars as pl
    >>> from microbatch.testing import JoinStreamTest
    >>> schema = {"k": pl.Int64, "ts": pl.Datetime("ms", "UTC")}
    >>> t = JoinStreamTest(
    ...     lambda l, r: l.with_watermark("ts", "0s").join_interval(
    ...         r.with_watermark("ts", "0s"), on="k", left_time="ts", lower="0s", upper="1m"),
    ...     left_schema=schema, right_schema=schema,
    ... )
    >>> _ = t.add_left({"k": [1], "ts": [t.at("00:00:10")]})
    >>> t.add_right({"k": [1], "ts": [t.at("00:00:30")]}).process().height
    1
    """

    def __init__(
        self,
        build: Callable[[MemoryStream, MemoryStream], Stream],
        *,
        left_schema: Mapping[str, Any] | None,
        right_schema: Mapping[str, Any] | None,
        output_mode: OutputMode = "append",
        checkpoint: str | Path | None = None,
        start: datetime = EPOCH,
        left_partition_column: str | None = None,
        right_partition_column: str | None = None,
    ) -> None:
        self.left = read_memory(schema=left_schema, partition_column=left_partition_column)
        self.right = read_memory(schema=right_schema, partition_column=right_partition_column)
        self.stream = build(self.left, self.right)
        self._setup(output_mode=output_mode, checkpoint=checkpoint, start=start)

    def add_left(self, rows: Rows) -> JoinStreamTest:
        """Append rows to the left input (they join the next batch)."""
        self.left.add(rows)
        return self

    def add_right(self, rows: Rows) -> JoinStreamTest:
        """Append rows to the right input (they join the next batch)."""
        self.right.add(rows)
        return self
