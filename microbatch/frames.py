"""How the engine turns a lazy plan into rows: one place, one Polars engine.

NOTE: replays are bit-identical only because every ``collect`` of the engine
goes through :func:`collect`. Polars' streaming engine (``LazyFrame.collect()``'s
default since Polars 2) splits a frame into morsels and combines per-morsel
partial aggregates in an order that changes from call to call: the same
``group_by(...).agg(pl.col("x").sum())`` over the same rows gives float sums
that differ in the last bits between two calls in one process, even with one
thread. The in-memory engine folds each group's values in row order, so its
result is a function of the rows alone, whatever the chunk layout of the frame
or the size of Polars' thread pool (``tests/engine/test_determinism.py``).

NOTE: that holds only with ``POLARS_NO_PARTITION`` set, which importing this
module does (unless the environment sets it). Without it, a ``group_by`` with
few groups (a window without keys, a batch with three cards) takes the
in-memory engine's *partitioned* path: each thread aggregates a slice, and the
slices' partial sums are combined in the order the threads finish (14
different float sums in 30 runs of one 1M-row, 3-group sum). Polars reads the
variable at every ``group_by``; it is set once, before any query thread runs.

One exception, :func:`collect_exact`: a plan whose every value is exact under
any order of the rows (counts, integer sums, integer min/max, float sums made
integer sums by :mod:`microbatch.operators.exact_partials`) runs on the
streaming engine, which groups on every thread; no morsel order can change a bit.
"""

from __future__ import annotations

import os
from typing import Final, Literal

import polars as pl

os.environ.setdefault("POLARS_NO_PARTITION", "1")

__all__ = ["ENGINE", "collect", "collect_exact"]

ENGINE: Final[Literal["in-memory"]] = "in-memory"
"""The Polars engine of every collect on the batch path but :func:`collect_exact`'s."""


def collect(lf: pl.LazyFrame) -> pl.DataFrame:
    """``lf`` evaluated with the in-memory engine: the same rows give the same
    bits (floats included), run after run and process after process."""
    return lf.collect(engine=ENGINE)


def collect_exact(lf: pl.LazyFrame) -> pl.DataFrame:
    """``lf`` evaluated with Polars' streaming engine (every thread).

    Only for plans whose every value is exact whatever the order of the rows
    (see the module's note); the order of the rows it returns is not fixed.
    """
    return lf.collect(engine="streaming")
