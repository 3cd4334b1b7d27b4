"""Changelog test inputs and their oracle, shared by the sink suites.

:data:`operations` draws edits of a small keyed table (keys ``(g, k)``);
:func:`change_batches` turns them into valid change rows (an insert for a new
key, a preimage/postimage pair for an existing one, a delete with the row's
last values) cut into batches at edit boundaries. :func:`apply_changes` is the
oracle: a dict that applies each change row in order, independent of
``sinks.changelog.split_changes``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import polars as pl
from hypothesis import strategies as st

KEYS = ("g", "k")
SCHEMA = {"g": pl.String, "k": pl.Int64, "v": pl.Int64, "note": pl.String,
          "_change_type": pl.String}
Row = dict[str, Any]

operations = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),                 # g
        st.integers(0, 2),                           # k
        st.sampled_from(["upsert", "upsert", "delete"]),
        st.integers(-5, 5),                          # v
    ),
    min_size=1,
    max_size=25,
)
cuts = st.lists(st.integers(0, 25), max_size=6)


def change_batches(ops: Sequence[tuple[str, int, str, int]], cut_at: Iterable[int]
                   ) -> list[pl.DataFrame]:
    """The change rows of ``ops`` (valid against the table they build), one frame per
    batch; a batch may be empty (a no-data batch)."""
    table: dict[tuple[str, int], Row] = {}
    per_op: list[list[Row]] = []
    for i, (g, k, action, v) in enumerate(ops):
        key = (g, k)
        new = {"g": g, "k": k, "v": v, "note": f"op{i}"}
        old = table.get(key)
        if action == "delete":
            if old is None:
                per_op.append([])
                continue
            per_op.append([{**old, "_change_type": "delete"}])
            del table[key]
        elif old is None:
            per_op.append([{**new, "_change_type": "insert"}])
            table[key] = new
        else:
            per_op.append([{**old, "_change_type": "update_preimage"},
                           {**new, "_change_type": "update_postimage"}])
            table[key] = new
    bounds = sorted({0, len(per_op), *(min(c, len(per_op)) for c in cut_at)})
    return [
        pl.DataFrame([r for rows in per_op[lo:hi] for r in rows], schema=SCHEMA)
        for lo, hi in itertools.pairwise(bounds)
    ]


def apply_changes(table: dict[tuple[Any, ...], Row], frame: pl.DataFrame,
                  keys: Sequence[str] = KEYS) -> None:
    """Apply each change row of ``frame`` to ``table`` (key tuple -> row), in order."""
    for row in frame.iter_rows(named=True):
        kind = row.pop("_change_type")
        key = tuple(row[c] for c in keys)
        if kind in ("insert", "update_postimage"):
            table[key] = row
        elif kind == "delete":
            table.pop(key, None)
        else:
            assert kind == "update_preimage", kind
            assert table.get(key) == row, "a preimage must be the row in the table"


def oracle(batches: Iterable[pl.DataFrame], keys: Sequence[str] = KEYS) -> pl.DataFrame:
    """The table left by applying every batch, sorted by ``keys``."""
    table: dict[tuple[Any, ...], Row] = {}
    for frame in batches:
        apply_changes(table, frame, keys)
    return as_frame(table.values())


def as_frame(rows: Iterable[Row]) -> pl.DataFrame:
    """Rows (without ``_change_type``) as a frame sorted by the keys, in SCHEMA's types."""
    schema = {n: t for n, t in SCHEMA.items() if n != "_change_type"}
    return pl.DataFrame(list(rows), schema=schema).sort(list(KEYS))
