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
"""

from __future__ import annotations

from typing import Final, Literal

import polars as pl

__all__ = ["ENGINE", "collect"]

ENGINE: Final[Literal["in-memory"]] = "in-memory"
"""The Polars engine of every collect on the batch path."""


def collect(lf: pl.LazyFrame) -> pl.DataFrame:
    """``lf`` evaluated with the in-memory engine: the same rows give the same
    bits (floats included), run after run and process after process."""
    return lf.collect(engine=ENGINE)
