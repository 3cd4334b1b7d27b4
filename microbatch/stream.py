"""``Stream``: the user-facing, immutable, lazy description of a streaming query."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import polars as pl

from microbatch.exceptions import PlanError
from microbatch.executor import BatchExecutor, input_frame
from microbatch.plan import PlanNode, SourceNode, Step, StepNode, expr_step, map_batches_step
from microbatch.sources.base import SourceContext
from microbatch.writer import DataStreamWriter
from sinks.base import OutputMode, Sink

IntoExpr = pl.Expr | str | Any


class Stream:
    """An unbounded table described by a plan; every method returns a new Stream.

    Nothing runs until a writer's ``start``. Stateless steps take Polars
    expressions and run on whole batches.
    """

    def __init__(self, plan: PlanNode) -> None:
        self._plan = plan

    @property
    def plan(self) -> PlanNode:
        """The logical plan this stream describes."""
        return self._plan

    @property
    def is_aggregated(self) -> bool:
        """True when the plan contains a streaming aggregation."""
        return any(getattr(node, "is_aggregation", False) for node in self._plan.walk())

    def _then(self, step: Step) -> Stream:
        return Stream(StepNode(self._plan, step))

    # ----------------------------------------------------------- stateless

    def select(self, *exprs: IntoExpr, **named: IntoExpr) -> Stream:
        """Keep/compute columns, as ``pl.LazyFrame.select``."""
        return self._then(expr_step("select", "select", exprs, named))

    def with_columns(self, *exprs: IntoExpr, **named: IntoExpr) -> Stream:
        """Add or replace columns, as ``pl.LazyFrame.with_columns``."""
        return self._then(expr_step("with_columns", "with_columns", exprs, named))

    def filter(self, *predicates: IntoExpr, **constraints: Any) -> Stream:
        """Keep rows matching all predicates, as ``pl.LazyFrame.filter``."""
        return self._then(expr_step("filter", "filter", predicates, constraints))

    def drop(self, *columns: str, strict: bool = True) -> Stream:
        """Remove columns."""
        return self._then(expr_step("drop", "drop", columns, {"strict": strict}))

    def rename(self, mapping: Mapping[str, str]) -> Stream:
        """Rename columns ``{old: new}``."""
        return self._then(expr_step("rename", "rename", (dict(mapping),), {}))

    def explode(self, columns: str | Sequence[str]) -> Stream:
        """One row per element of list column(s)."""
        cols = [columns] if isinstance(columns, str) else list(columns)
        return self._then(expr_step("explode", "explode", (cols,), {}))

    def map_batches(self, fn: Callable[[pl.DataFrame], pl.DataFrame]) -> Stream:
        """Apply ``fn`` to each whole batch (escape hatch; keep ``fn`` deterministic
        so replays give the same rows)."""
        if not callable(fn):
            raise PlanError(f"map_batches needs a function DataFrame -> DataFrame, got {fn!r}")
        return self._then(map_batches_step(fn))

    # ------------------------------------------------------------- writers

    def write_to(self, sink: Sink, *, output_mode: OutputMode = "append") -> DataStreamWriter:
        """Attach any :class:`sinks.Sink`."""
        return DataStreamWriter(self, sink, output_mode)

    def write_memory(self, name: str, *, output_mode: OutputMode = "append") -> DataStreamWriter:
        """Attach an in-process table readable with ``mb.table(name)``."""
        from sinks.memory import MemorySink

        return self.write_to(MemorySink(name), output_mode=output_mode)

    def write_console(
        self, *, num_rows: int = 20, output_mode: OutputMode = "append"
    ) -> DataStreamWriter:
        """Print each batch to stdout."""
        from sinks.console import ConsoleSink

        return self.write_to(ConsoleSink(num_rows=num_rows), output_mode=output_mode)

    def write_parquet(
        self,
        path: str | os.PathLike[str],
        *,
        output_mode: OutputMode = "append",
        partition_by: Sequence[str] | None = None,
    ) -> DataStreamWriter:
        """Write Parquet files plus a manifest keyed by batch id (exactly once);
        read the result with ``mb.read_parquet_output(path)``."""
        from sinks.parquet import ParquetSink

        sink = ParquetSink(path, partition_by=list(partition_by) if partition_by else None)
        return self.write_to(sink, output_mode=output_mode)

    def foreach_batch(
        self, fn: Callable[[pl.DataFrame, int], None], *, output_mode: OutputMode = "append"
    ) -> DataStreamWriter:
        """Call ``fn(df, batch_id)`` per batch; make ``fn`` idempotent on batch_id."""
        from sinks.foreach import ForeachBatchSink

        return self.write_to(ForeachBatchSink(fn), output_mode=output_mode)

    # ---------------------------------------------------------- inspection

    def explain(self) -> str:
        """The plan as a tree, root first."""
        return self._plan.explain()

    def preview(self, n: int = 10) -> pl.DataFrame:
        """Run the plan on the first batch of each source, without a checkpoint.

        Returns at most ``n`` result rows. Reads only what one capped batch of
        each source holds, so it is cheap on large inputs.
        """
        inputs = {}
        for sid, source in enumerate(self._plan.sources()):
            source.open(SourceContext(str(sid), None))
            try:
                start = source.initial_offset()
                end = source.latest_offset(start)
                batch = source.read(start, end).data if source.compare(end, start) > 0 else None
                inputs[str(sid)] = input_frame(source, batch if batch is not None else pl.DataFrame())
            finally:
                source.close()
        return BatchExecutor(self._plan).execute(inputs).head(n)

    def __repr__(self) -> str:
        return f"Stream(\n{self._plan.explain(1)}\n)"

    def _repr_html_(self) -> str:
        import html

        return f"<b>microbatch Stream</b><pre>{html.escape(self._plan.explain())}</pre>"


def stream_of(source: Any) -> Stream:
    """A stream reading from ``source``."""
    return Stream(SourceNode(source))
