"""Shared pieces of the join tests: row builders, split runs, one-shot oracles."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl

from microbatch.testing import JoinStreamTest

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TS = pl.Datetime("ms", "UTC")
LEFT = {"lid": pl.Int64, "k": pl.Int64, "ts": TS}
RIGHT = {"rid": pl.Int64, "k": pl.Int64, "ts": TS}


def frame(rows: list[tuple[int | None, int]], id_col: str, base: int = 0) -> pl.DataFrame:
    """Rows ``(key, event time ms)`` with a unique id column ``id_col``."""
    return pl.DataFrame(
        {
            id_col: list(range(base, base + len(rows))),
            "k": [k for k, _ in rows],
            "ts": [T0 + timedelta(milliseconds=t) for _, t in rows],
        },
        schema={id_col: pl.Int64, "k": pl.Int64, "ts": TS},
    )


def chunks(df: pl.DataFrame, cuts: list[int]) -> list[pl.DataFrame]:
    bounds = [0, *sorted({c for c in cuts if 0 < c < df.height}), df.height]
    return [df.slice(lo, hi - lo) for lo, hi in itertools.pairwise(bounds)]


def run_two(
    build: Callable,
    left: pl.DataFrame,
    right: pl.DataFrame,
    cuts: tuple[list[int], list[int]],
    tmp: Path,
    *,
    left_schema: dict | None = None,
    right_schema: dict | None = None,
    restart_every: int = 0,
) -> JoinStreamTest:
    """Feed both inputs split at the cuts, one chunk of each per batch."""
    test = JoinStreamTest(
        build,
        left_schema=left_schema or LEFT,
        right_schema=right_schema or RIGHT,
        checkpoint=tmp,
    )
    lc, rc = chunks(left, cuts[0]), chunks(right, cuts[1])
    for step in range(max(len(lc), len(rc))):
        if step < len(lc) and lc[step].height:
            test.add_left(lc[step])
        if step < len(rc) and rc[step].height:
            test.add_right(rc[step])
        test.process()
        if restart_every and step % restart_every == restart_every - 1:
            test.restart()
    return test


def batch_watermarks(test: JoinStreamTest) -> dict[int, int | None]:
    return {p["batch_id"]: p["watermark_ms"] for p in test.progress}


def late_of(test: JoinStreamTest, side: str) -> pl.DataFrame:
    late = test.late_rows
    if late.height == 0 or "join_side" not in late.columns:
        return pl.DataFrame()
    return late.filter(pl.col("join_side") == side)


def not_late(rows: pl.DataFrame, test: JoinStreamTest, side: str, id_col: str) -> pl.DataFrame:
    late = late_of(test, side)
    if late.height == 0:
        return rows
    return rows.filter(~pl.col(id_col).is_in(late[id_col].implode()))


def check_late_rows(test: JoinStreamTest, time_of: Callable[[dict], int | None]) -> None:
    """Every late row was at or before its batch's watermark (or had a null time),
    and the progress records counted them all."""
    marks = batch_watermarks(test)
    for row in test.late_rows.iter_rows(named=True):
        t = time_of(row)
        wm = marks[row["batch_id"]]
        assert t is None or (wm is not None and t <= wm), (row, wm)
    assert sum(p["late_rows"] for p in test.progress) == test.late_rows.height


def ms(col: str) -> pl.Expr:
    return pl.col(col).dt.epoch("ms")


def interval_oracle(
    left: pl.DataFrame, right: pl.DataFrame, *, lower_ms: int, upper_ms: int
) -> pl.DataFrame:
    """The one-shot inner interval join (columns as the engine's)."""
    return left.join(right, on="k", how="inner", coalesce=True).filter(
        (ms("ts_right") >= ms("ts") + lower_ms) & (ms("ts_right") <= ms("ts") + upper_ms)
    )


def sort_all(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(df.columns, nulls_last=True)


def assert_same_rows(got: pl.DataFrame, want: pl.DataFrame) -> None:
    """Equal as multisets of rows (column order of ``want``)."""
    if got.width == 0:
        got = pl.DataFrame(schema=want.schema)
    got = sort_all(got.select(want.columns))
    want = sort_all(want)
    assert got.height == want.height, f"engine:\n{got}\noracle:\n{want}"
    assert got.equals(want, null_equal=True), f"engine:\n{got}\noracle:\n{want}"
