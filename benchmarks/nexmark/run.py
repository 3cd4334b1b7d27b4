"""Running one Nexmark query on this engine (available-now over a dataset's files)
and its one-shot oracle, and comparing the two."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import polars as pl

import microbatch as mb
from benchmarks.nexmark.generator import NexmarkConfig
from benchmarks.nexmark.queries import Query, Streams, check

Form = Literal["python", "sql"]


class EventDirs(Protocol):
    """Where each stream's Parquet files are (:class:`~benchmarks.nexmark.data.NexmarkDataset`)."""

    @property
    def config(self) -> NexmarkConfig: ...

    def stream_dir(self, stream: str) -> Path: ...

    def schema(self, stream: str) -> pl.Schema: ...

    def scan(self, stream: str) -> pl.LazyFrame: ...


@dataclass
class EngineRun:
    """What one available-now run of a query did."""

    seconds: float
    batches: int
    output: pl.DataFrame


def streams_for(ds: EventDirs, inputs: tuple[str, ...], files_per_batch: int) -> Streams:
    """A fresh ``read_files`` stream per input, one file (of each stream) per batch."""

    def reader(name: str) -> Any:
        return lambda: mb.read_files(ds.stream_dir(name), schema=ds.schema(name),
                                     max_files_per_batch=files_per_batch)

    return {name: reader(name) for name in inputs}


def final_table(query: Query, parts: list[pl.DataFrame]) -> pl.DataFrame:
    """Everything the sink got, or for an updating result the last row per key."""
    frames = [p.with_columns(_batch=pl.lit(i)) for i, p in enumerate(parts) if p.height]
    if not frames:
        return pl.DataFrame()
    out = pl.concat(frames, how="vertical_relaxed")
    if query.keys:
        out = out.sort("_batch", maintain_order=True).group_by(
            list(query.keys), maintain_order=True).last()
    return out.drop("_batch")


def run_engine(query: Query, ds: EventDirs, checkpoint: Path, *,
               files_per_batch: int = 1, form: Form = "python") -> EngineRun:
    """Run ``query`` over every file of ``ds`` (available-now, every window flushed at
    the end) into an in-memory sink that keeps the batches' frames (no copy, as
    Flink's blackhole sink keeps nothing); the time includes starting the query."""
    streams = streams_for(ds, query.inputs, files_per_batch)
    parts: list[pl.DataFrame] = []
    t0 = time.perf_counter()
    if form == "sql":
        if query.sql is None:
            raise ValueError(f"{query.name} has no SQL form")
        stream = mb.sql(query.sql(ds.config), **{name: query.source_for_sql(name, make)
                                      for name, make in streams.items()})
    else:
        stream = query.build(streams, ds.config)
    handle = stream.foreach_batch(lambda df, _id: parts.append(df),
                                  output_mode=query.output_mode).start(
        checkpoint=checkpoint, trigger="available-now", flush_at_end=True)
    handle.await_termination()
    seconds = time.perf_counter() - t0
    return EngineRun(seconds, len(parts), final_table(query, parts))


def run_oracle(query: Query, ds: EventDirs) -> tuple[float, pl.DataFrame]:
    """Seconds of the one-shot Polars computation over every event, and its result."""
    t0 = time.perf_counter()
    frames = {name: ds.scan(name) for name in query.inputs}
    result = query.oracle(frames, ds.config).collect()
    return time.perf_counter() - t0, result


def verdict(query: Query, out: pl.DataFrame, oracle: pl.DataFrame) -> str | None:
    """None when the engine's output equals the oracle's (see :func:`check`)."""
    return check(query, out, oracle)
