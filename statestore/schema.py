"""Column specs: how each state column is held in numpy and turned back into Polars.

Numeric, Boolean and temporal columns are held as their physical numpy dtype
(``Datetime``/``Duration``/``Time`` as int64, ``Date`` as int32) plus an
optional validity mask; every other type (String, Binary, Decimal, List,
Struct, Categorical, ...) as a numpy object array with ``None`` for null.
Both support vectorized scatter (``a[rows] = v``) and gather (``a[rows]``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from statestore.exceptions import StateStoreError

#: Fixed seed of the key hash. Hashes live only in memory (rebuilt on load),
#: so a Polars upgrade that changes ``hash_rows`` cannot corrupt lookups.
HASH_SEED = 0x5EED_0F_57A7E

FOUND_COLUMN = "__found"
OP_COLUMN = "__op"
RESERVED = frozenset({FOUND_COLUMN, OP_COLUMN})

_NATIVE: dict[type[pl.DataType], np.dtype] = {
    pl.Int8: np.dtype(np.int8),
    pl.Int16: np.dtype(np.int16),
    pl.Int32: np.dtype(np.int32),
    pl.Int64: np.dtype(np.int64),
    pl.UInt8: np.dtype(np.uint8),
    pl.UInt16: np.dtype(np.uint16),
    pl.UInt32: np.dtype(np.uint32),
    pl.UInt64: np.dtype(np.uint64),
    pl.Float32: np.dtype(np.float32),
    pl.Float64: np.dtype(np.float64),
    pl.Boolean: np.dtype(np.bool_),
    pl.Datetime: np.dtype(np.int64),
    pl.Duration: np.dtype(np.int64),
    pl.Time: np.dtype(np.int64),
    pl.Date: np.dtype(np.int32),
}
_TIME_TYPES = (pl.Datetime, pl.Date)
_ORDERABLE = (pl.String, pl.Binary, pl.Boolean, pl.Decimal)

#: A column held in numpy: the values and a validity mask (None: no nulls).
Parts = tuple[np.ndarray, np.ndarray | None]


@dataclass(frozen=True)
class ColumnSpec:
    """One state column: its name, Polars dtype and numpy representation."""

    name: str
    dtype: pl.DataType
    np_dtype: np.dtype  # object for non-native columns

    @property
    def native(self) -> bool:
        """True when held as a physical numpy array (not Python objects)."""
        return self.np_dtype != np.dtype(object)

    @property
    def is_float(self) -> bool:
        """True for Float32/Float64 (NaN needs care in key equality)."""
        return self.np_dtype.kind == "f"

    @property
    def orderable(self) -> bool:
        """True when Polars can sort by this column (used to order outputs)."""
        return self.native or isinstance(self.dtype, _ORDERABLE)

    def to_parts(self, series: pl.Series) -> Parts:
        """Convert a conformed Series to (values, validity) without a Python loop per row."""
        if self.native:
            phys = series.to_physical()
            if phys.null_count():
                valid = phys.is_not_null().to_numpy()
                filler = False if self.dtype == pl.Boolean else 0
                return phys.fill_null(filler).to_numpy().astype(self.np_dtype, copy=False), valid
            return phys.to_numpy().astype(self.np_dtype, copy=False), None
        if isinstance(self.dtype, pl.String | pl.Binary):
            return series.to_numpy().astype(object, copy=False), None
        return np.fromiter(series.to_list(), dtype=object, count=len(series)), None

    def from_parts(self, values: np.ndarray, valid: np.ndarray | None) -> pl.Series:
        """Build the Polars Series of this column from gathered (values, validity)."""
        if self.native:
            if valid is None or valid.all():
                series = pl.Series(self.name, values)
            else:
                series = pl.Series(self.name, pa.array(values, mask=~valid))
            return series if series.dtype == self.dtype else series.cast(self.dtype)
        if isinstance(self.dtype, pl.String | pl.Binary):
            arrow_type = pa.large_string() if self.dtype == pl.String else pa.large_binary()
            mask = None if valid is None else ~valid
            return pl.Series(self.name, pa.array(values, type=arrow_type, mask=mask))
        items = values.tolist()
        if valid is not None:
            items = np.where(valid, values.astype(object), np.array(None)).tolist()
        return pl.Series(self.name, items, dtype=self.dtype)


def make_spec(name: str, dtype: pl.DataType | type[pl.DataType]) -> ColumnSpec:
    """Return the spec of column ``name``; raise StateStoreError for a non-dtype."""
    if isinstance(dtype, type) and issubclass(dtype, pl.DataType):
        dtype = dtype()
    if not isinstance(dtype, pl.DataType):
        raise StateStoreError(f"column {name!r}: {dtype!r} is not a Polars data type")
    return ColumnSpec(name, dtype, _NATIVE.get(type(dtype), np.dtype(object)))


@dataclass(frozen=True)
class StateSchema:
    """The validated key and value columns of a store, and its time column."""

    keys: tuple[ColumnSpec, ...]
    values: tuple[ColumnSpec, ...]
    time_column: str | None

    @classmethod
    def build(
        cls,
        key_schema: dict[str, pl.DataType],
        value_schema: dict[str, pl.DataType],
        time_column: str | None,
    ) -> StateSchema:
        """Validate the schemas; raise StateStoreError naming the offending column."""
        if not key_schema:
            raise StateStoreError(
                "key_schema is empty: a state store needs at least one key column"
            )
        both = set(key_schema) & set(value_schema)
        if both:
            raise StateStoreError(f"columns {sorted(both)} are in both key_schema and value_schema")
        reserved = (set(key_schema) | set(value_schema)) & RESERVED
        if reserved:
            raise StateStoreError(
                f"column names {sorted(reserved)} are reserved by the state store"
            )
        keys = tuple(make_spec(n, d) for n, d in key_schema.items())
        values = tuple(make_spec(n, d) for n, d in value_schema.items())
        schema = cls(keys, values, time_column)
        if time_column is not None:
            spec = schema.spec(time_column)
            if spec is None:
                raise StateStoreError(
                    f"time_column {time_column!r} is neither a key nor a value column"
                )
            if not (isinstance(spec.dtype, _TIME_TYPES) or spec.dtype.is_integer()):
                raise StateStoreError(
                    f"time_column {time_column!r} has type {spec.dtype}; it must be an "
                    "integer, Datetime or Date column"
                )
        return schema

    @property
    def columns(self) -> tuple[ColumnSpec, ...]:
        """Key columns then value columns."""
        return self.keys + self.values

    @property
    def key_names(self) -> list[str]:
        """Names of the key columns, in schema order."""
        return [c.name for c in self.keys]

    @property
    def value_names(self) -> list[str]:
        """Names of the value columns, in schema order."""
        return [c.name for c in self.values]

    @property
    def polars_schema(self) -> dict[str, pl.DataType]:
        """Name → dtype of key then value columns."""
        return {c.name: c.dtype for c in self.columns}

    def spec(self, name: str) -> ColumnSpec | None:
        """The spec of column ``name``, or None."""
        return next((c for c in self.columns if c.name == name), None)

    def conform(
        self, frame: pl.DataFrame, specs: tuple[ColumnSpec, ...], what: str
    ) -> pl.DataFrame:
        """Select ``specs`` from ``frame`` in order, cast to the schema's dtypes.

        Raises StateStoreError when a column is missing or cannot be cast.
        """
        if not isinstance(frame, pl.DataFrame):
            raise StateStoreError(f"{what} expects a polars DataFrame, got {type(frame).__name__}")
        missing = [c.name for c in specs if c.name not in frame.columns]
        if missing:
            raise StateStoreError(
                f"{what}: the frame lacks column(s) {missing}; it has {frame.columns}"
            )
        exprs = [
            pl.col(c.name) if frame.schema[c.name] == c.dtype else pl.col(c.name).cast(c.dtype)
            for c in specs
        ]
        try:
            return frame.select(exprs)
        except pl.exceptions.PolarsError as exc:
            raise StateStoreError(f"{what}: cannot cast to the state schema: {exc}") from exc

    def hash_keys(self, keys: pl.DataFrame, bits: int = 64) -> np.ndarray:
        """64-bit hash of each row of conformed key columns (uint64).

        Floats are canonicalized (-0.0 → 0.0, NaN → null) and categoricals hashed
        as strings, so equal keys always hash equally. ``bits < 64`` keeps only the
        low bits: a test hook that forces collisions.
        """
        exprs = []
        for c in self.keys:
            expr = pl.col(c.name)
            if c.is_float:
                expr = (expr + 0.0).fill_nan(None)
            elif isinstance(c.dtype, pl.Categorical):
                expr = expr.cast(pl.String)
            exprs.append(expr)
        hashes = keys.select(exprs).hash_rows(seed=HASH_SEED).to_numpy()
        if bits < 64:
            hashes = hashes & np.uint64((1 << bits) - 1)
        return hashes

    def time_to_physical(self, t: object) -> int:
        """Convert a ``pop_expired`` threshold to the time column's physical integer."""
        spec = self.spec(self.time_column) if self.time_column is not None else None
        if spec is None:
            raise StateStoreError(
                "pop_expired needs a time_column; pass time_column=... to StateStoreProvider"
            )
        if isinstance(t, bool) or not isinstance(t, int | np.integer | dt.date):
            raise StateStoreError(
                f"pop_expired({t!r}): the threshold must be an int or a datetime/date "
                f"(time column {spec.name!r} is {spec.dtype})"
            )
        if isinstance(t, int | np.integer):
            return int(t)
        if not isinstance(spec.dtype, _TIME_TYPES):
            raise StateStoreError(
                f"pop_expired({t!r}): time column {spec.name!r} is {spec.dtype}; pass an int"
            )
        return int(pl.Series([t]).cast(spec.dtype).to_physical()[0])


def lookup_for_upsert(
    schema: StateSchema, rows: pl.DataFrame, last: tuple[Any, ...] | None, mutations: int,
    *, keys_from_lookup: bool,
) -> tuple[Any, ...] | None:
    """What every keyed store checks before an upsert: no column outside
    ``schema``; with ``keys_from_lookup``, the store's last lookup (``(mutations
    then, keys, ...)``) whose keys ``rows`` carries, refused after a change to
    the store or for another row count. ``None`` without ``keys_from_lookup``."""
    extra = [c for c in rows.columns if schema.spec(c) is None]
    if extra:
        raise StateStoreError(f"upsert: columns {extra} are not in the state schema")
    if not keys_from_lookup:
        return None
    if last is None or last[0] != mutations or len(last[1]) != rows.height:
        raise StateStoreError(
            "upsert(keys_from_lookup=True) needs the rows of the last lookup() with "
            "no change to the store in between; call upsert without it"
        )
    return last
