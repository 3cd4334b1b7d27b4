"""A plain-Python model of the state store, and helpers shared by its tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from statestore import StateStore, StateStoreProvider

Key = tuple[Any, ...]
Value = tuple[Any, ...]


@dataclass
class Model:
    """The expected state: key tuple → value tuple, in the schema's column order."""

    keys: dict[str, pl.DataType]
    values: dict[str, pl.DataType]
    rows: dict[Key, Value] = field(default_factory=dict)

    def key_frame(self, keys: list[Key]) -> pl.DataFrame:
        return pl.DataFrame(keys, schema=self.keys, orient="row")

    def row_frame(self, rows: list[tuple[Key, Value]]) -> pl.DataFrame:
        schema = {**self.keys, **self.values}
        return pl.DataFrame([k + v for k, v in rows], schema=schema, orient="row")

    def as_dict(self, frame: pl.DataFrame) -> dict[Key, Value]:
        """A store's frame as key → values, asserting its keys are unique."""
        nk = len(self.keys)
        names = [*self.keys, *self.values]
        out = {row[:nk]: row[nk:] for row in frame.select(names).iter_rows()}
        assert len(out) == frame.height, "duplicate keys in the store's output"
        return out

    def check(self, store: StateStore, probes: list[Key]) -> None:
        """The store's full content and a lookup of ``probes`` match the model."""
        assert store.num_rows == len(self.rows)
        assert self.as_dict(store.to_frame()) == self.rows
        if not probes:
            return
        out = store.lookup(self.key_frame(probes))
        assert out.columns == [*self.keys, *self.values, "__found"]
        nk = len(self.keys)
        for probe, row in zip(probes, out.iter_rows(), strict=True):
            assert row[:nk] == probe
            expected = self.rows.get(probe)
            assert row[-1] == (expected is not None)
            assert row[nk:-1] == (expected if expected is not None else (None,) * len(self.values))


def make_provider(
    directory: Path,
    keys: dict[str, pl.DataType] | None = None,
    values: dict[str, pl.DataType] | None = None,
    **options: Any,
) -> StateStoreProvider:
    """A provider with small defaults: Int64 key ``k``, Int64 value ``v``."""
    return StateStoreProvider(
        directory,
        keys if keys is not None else {"k": pl.Int64},
        values if values is not None else {"v": pl.Int64},
        **options,
    )
