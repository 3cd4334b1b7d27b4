"""The jobs of the savepoint tests, in an old and a new version (``--param version=``).

``window``: per 1-minute window and key ``n``, ``total`` and (old) ``top`` = max
or (new) ``low`` = min of ``v``; the old code keeps ``v >= 0``, the new ``v >= 1``.
``transform``: per key a running ``n`` (old state) and, new, a running ``total``
of ``v`` (a state column added: null in the savepoint's state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import polars as pl

import microbatch as mb

SCHEMA = {"k": pl.Int64, "ts": pl.Datetime("ms", "UTC"), "v": pl.Float64}


def _count(inp: mb.StateInput) -> mb.StateOutput:
    new = inp.rows.group_by("k", maintain_order=True).agg(pl.len().alias("c"))
    state = new.join(inp.state, on="k", how="left").select(
        "k", (pl.col("c") + pl.col("n").fill_null(0)).alias("n"))
    return mb.StateOutput(rows=state, upserts=state)


def _count_and_total(inp: mb.StateInput) -> mb.StateOutput:
    new = inp.rows.group_by("k", maintain_order=True).agg(pl.len().alias("c"),
                                                           pl.col("v").sum().alias("s"))
    state = new.join(inp.state, on="k", how="left").select(
        "k", (pl.col("c") + pl.col("n").fill_null(0)).alias("n"),
        (pl.col("s") + pl.col("total").fill_null(0.0)).alias("total"))
    return mb.StateOutput(rows=state, upserts=state)


@dataclass(frozen=True)
class Params:
    """The job's parameters."""

    input: Annotated[str, "directory of Parquet files (one batch each)"]
    output: Annotated[str, "Parquet output directory"]
    kind: Annotated[str, "window | transform"]
    version: Annotated[str, "old | new"]


def build(params: Params) -> mb.DataStreamWriter:
    """The ``kind`` job (window|transform) in ``version`` old|new, files -> Parquet."""
    new = params.version == "new"
    source = mb.read_files(params.input, format="parquet", schema=SCHEMA,
                           max_files_per_batch=1).with_watermark("ts", delay="0s")
    if params.kind == "window":
        kept = source.filter(pl.col("v") >= (1 if new else 0))
        last = pl.col("v").min().alias("low") if new else pl.col("v").max().alias("top")
        stream = kept.group_by(mb.window("ts", "1m"), "k").agg(
            pl.len().alias("n"), pl.col("v").sum().alias("total"), last)
    else:
        stream = source.group_by("k").transform_with_state(
            _count_and_total if new else _count,
            state_schema={"n": pl.Int64, "total": pl.Float64} if new else {"n": pl.Int64})
    return stream.write_parquet(params.output)
