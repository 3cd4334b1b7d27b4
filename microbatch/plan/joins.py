"""Join specs: small frozen, validated descriptions of the four stream joins.

What runs is built from these by the executor (:mod:`microbatch.operators`):

- :class:`IntervalJoinSpec` — stream-stream, rows whose right time falls in
  ``[left time + lower, left time + upper]`` (``join_interval``; ``join_window``
  is built on it);
- :class:`AggregateJoinSpec` — two append-mode windowed aggregations joined per
  window (``join``);
- :class:`StaticJoinSpec` — a stream enriched from a static table that is
  re-read when it changes (``join_static``);
- :class:`AsOfJoinSpec` — a stream enriched from a changelog stream with the
  version valid at each event's time (``join_asof_table``).

The serialized form (``describe()``) goes into the operator's signature, so a
restart with a changed join on the same checkpoint is refused.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

import polars as pl

from microbatch._deprecation import moved_names
from microbatch.durations import parse_duration_ms
from microbatch.exceptions import PlanError
from microbatch.types import JoinHow, StaticHow
from sinks.changelog import CHANGE_TYPE

SUFFIX = "_right"
"""Suffix of right-side columns whose name the left side already uses (as Polars)."""


def parse_keys(on: str | Sequence[str], *, what: str) -> tuple[str, ...]:
    """``on`` as a non-empty tuple of distinct column names."""
    keys = (on,) if isinstance(on, str) else tuple(on)
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise PlanError(f"{what} needs on=<column name or list of names>, got {on!r}")
    if len(set(keys)) != len(keys):
        raise PlanError(f"{what}: on={list(keys)} names a column twice")
    return keys


H = TypeVar("H", bound=str)


def parse_how(how: str, allowed: tuple[H, ...], *, what: str) -> H:
    """``how`` as one of ``allowed`` (typed as them), or a PlanError listing them."""
    for choice in allowed:
        if how == choice:
            return choice
    raise PlanError(f"{what}: how={how!r} is not supported; use one of {list(allowed)}")


@dataclass(frozen=True)
class IntervalJoinSpec:
    """``left.join_interval(right, on, left_time, right_time, lower, upper, how)``.

    A left row ``l`` and a right row ``r`` match when their ``on`` columns are
    equal (nulls never match, as in Polars) and
    ``l.left_time + lower <= r.right_time <= l.left_time + upper``.
    """

    on: tuple[str, ...]
    left_time: str
    right_time: str
    lower_ms: int
    upper_ms: int
    how: JoinHow = "inner"
    suffix: str = SUFFIX

    @classmethod
    def parse(
        cls,
        on: str | Sequence[str],
        *,
        left_time: str,
        right_time: str,
        lower: str | float | timedelta | None,
        upper: str | float | timedelta | None,
        how: str,
    ) -> IntervalJoinSpec:
        what = "join_interval"
        keys = parse_keys(on, what=what)
        for name, col in (("left_time", left_time), ("right_time", right_time)):
            if not isinstance(col, str) or not col:
                raise PlanError(f"{what} needs {name}=<event-time column>, got {col!r}")
        if upper is None:
            raise PlanError(
                f"{what} without an upper bound is refused: a left row could then match "
                "right rows arriving arbitrarily later, so its state could never be "
                "evicted. Pass upper='0s' (or another finite duration, e.g. '10m')."
            )
        if lower is None:
            raise PlanError(
                f"{what} without a lower bound is refused: a right row could then match "
                "left rows arriving arbitrarily later, so its state could never be "
                "evicted. Pass lower='-10m' (or another finite duration)."
            )
        lower_ms = parse_duration_ms(lower, what=f"{what} lower", signed=True)
        upper_ms = parse_duration_ms(upper, what=f"{what} upper", signed=True)
        if lower_ms > upper_ms:
            raise PlanError(
                f"{what}: lower ({lower!r}) is after upper ({upper!r}); the interval "
                "[left time + lower, left time + upper] would be empty"
            )
        return cls(
            keys,
            left_time,
            right_time,
            lower_ms,
            upper_ms,
            parse_how(how, get_args(JoinHow), what=what),
        )

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "interval_join",
            "on": list(self.on),
            "left_time": self.left_time,
            "right_time": self.right_time,
            "lower_ms": self.lower_ms,
            "upper_ms": self.upper_ms,
            "how": self.how,
        }


@dataclass(frozen=True)
class AggregateJoinSpec:
    """``left.join(right, on=[window_start, keys...], how)`` of two windowed aggregations."""

    on: tuple[str, ...]
    how: JoinHow = "inner"
    suffix: str = SUFFIX

    def describe(self) -> dict[str, Any]:
        return {"kind": "window_join", "on": list(self.on), "how": self.how}


@dataclass(frozen=True)
class AsOfJoinSpec:
    """``events.join_asof_table(dim, on, time, dim_time, how)``.

    Each event gets the ``dim`` row of its key with the latest
    ``dim_time <= time`` (Polars ``join_asof(strategy="backward")``).
    """

    on: tuple[str, ...]
    time: str
    dim_time: str
    how: StaticHow = "left"
    suffix: str = SUFFIX

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "asof_join",
            "on": list(self.on),
            "time": self.time,
            "dim_time": self.dim_time,
            "how": self.how,
        }


@dataclass(frozen=True, eq=False)
class StaticTable:
    """The static side of ``join_static``: a DataFrame, Parquet file(s) or a Delta table."""

    frame: pl.DataFrame | None = None
    path: str | None = None
    kind: Literal["frame", "parquet", "delta"] = "frame"
    storage_options: dict[str, str] | None = None

    @classmethod
    def of(
        cls,
        other: pl.DataFrame | str | os.PathLike[str],
        storage_options: dict[str, str] | None = None,
    ) -> StaticTable:
        if isinstance(other, pl.DataFrame):
            return cls(frame=other)
        if isinstance(other, pl.LazyFrame):
            raise PlanError("join_static takes a DataFrame, not a LazyFrame: .collect() it first")
        if not isinstance(other, str | os.PathLike):
            raise PlanError(
                "join_static takes a polars DataFrame, a Parquet file or directory path, or a "
                f"Delta table path; got {type(other).__name__}"
            )
        path = os.fspath(other)
        remote = "://" in path
        if remote or (Path(path) / "_delta_log").is_dir():
            return cls(path=path, kind="delta", storage_options=storage_options)
        if not Path(path).exists():
            raise PlanError(
                f"join_static: {path!r} does not exist; pass a Parquet file or directory, "
                "or a Delta table path"
            )
        return cls(path=path, kind="parquet")

    def known_schema(self) -> pl.Schema | None:
        """The table's schema when it is known without reading rows: a
        DataFrame's, or a Parquet file's footer (the first file of a directory);
        ``None`` for a Delta table (its schema may change between batches)."""
        if self.frame is not None:
            return self.frame.schema
        if self.kind != "parquet" or self.path is None:
            return None
        root = Path(self.path)
        first = root if root.is_file() else next(iter(sorted(root.rglob("*.parquet"))), None)
        return None if first is None else pl.Schema(pl.read_parquet_schema(first))

    def describe(self) -> dict[str, Any]:
        if self.kind == "frame":
            assert self.frame is not None
            return {"kind": "frame", "columns": self.frame.columns, "rows": self.frame.height}
        return {"kind": self.kind, "path": self.path}


@dataclass(frozen=True)
class StaticJoinSpec:
    """``stream.join_static(other, on, how)``."""

    table: StaticTable
    on: tuple[str, ...]
    how: StaticHow = "inner"
    suffix: str = SUFFIX

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "static_join",
            "table": self.table.describe(),
            "on": list(self.on),
            "how": self.how,
        }


def events_changelog_refusal() -> str:
    """Why ``join_asof_table`` refuses events that carry ``_change_type``, and the fix."""
    return (
        "join_asof_table: the events (this stream) are a changelog (they carry "
        f"{CHANGE_TYPE!r}); a temporal join enriches each event once, when the watermark "
        "reaches it, and cannot retract an event that is later updated or deleted. Keep "
        f"the inserts only (.filter(pl.col({CHANGE_TYPE!r}) == 'insert').drop({CHANGE_TYPE!r})) "
        "if the events are append-only, or pass the changelog as the dimension "
        "(dim=...) if it is the table to look values up in."
    )


def output_columns(
    left: pl.Schema, right: pl.Schema, on: Sequence[str], suffix: str = SUFFIX
) -> tuple[list[str], dict[str, str]]:
    """Polars' join layout: the left columns in order, then the right's non-key
    columns, renamed with ``suffix`` where the left side already has the name.

    Returns (output column names, right column -> output name).
    """
    rename: dict[str, str] = {}
    taken = set(left)
    for name in right:
        if name in on:
            continue
        out = name if name not in taken else f"{name}{suffix}"
        rename[name] = out
        taken.add(out)
    return [*left, *rename.values()], rename


if not TYPE_CHECKING:  # mypy would take every missing name for a moved one
    __getattr__ = moved_names(
        __name__, {"WindowJoinSpec": "microbatch.plan.joins:AggregateJoinSpec"}, version="0.2.0"
    )
    """``WindowJoinSpec`` is ``AggregateJoinSpec``."""
