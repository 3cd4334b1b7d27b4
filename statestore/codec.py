"""Rows as bytes, column-wise: how the on-disk backend encodes keys and values.

One :class:`RowCodec` per column set (the key columns, or the value columns)
turns a conformed frame into one ``bytes`` object per row and back, with numpy
over whole columns (no Python loop per row; the per-row ``bytes`` objects are
made and read by Arrow in C++):

    row = [one validity byte per column][fixed part of each native column]
          [uint32 length of each String/Binary column][their bytes, in order]

Native columns (numeric, Boolean, temporal) are held as their physical value,
little-endian in values and big-endian with the sign bit flipped in keys
(``ordered=True``: the bytes of non-null keys sort as their values, so a
window's keys are neighbours in the database); a null's bytes are zero.
Decimal columns are Arrow's 16-byte decimal128. Floats are canonicalized (``-0.0`` is
``0.0``, every NaN the same NaN), so equal keys always encode to equal bytes:
the encoding of a key *is* its identity in the database (never a hash). Other
types (List, Struct, Categorical...) are refused with
:class:`~statestore.exceptions.StateStoreError` when the store is built: they
stay on the in-memory backend.

The layout is versioned (:data:`CODEC_VERSION`, kept in the database beside the
rows); a database written by another layout is rebuilt from the Arrow files.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl
import pyarrow as pa

from statestore.exceptions import StateStoreError
from statestore.schema import ColumnSpec

__all__ = ["CODEC_VERSION", "MAX_KEY_BYTES", "RowCodec", "binary_parts", "with_flag"]

CODEC_VERSION = 2
MAX_KEY_BYTES = 500
"""LMDB's key limit is 511 bytes; the time index puts 8 more before a key."""


def binary_parts(items: Sequence[bytes | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(offsets int64[n+1], data uint8, valid bool[n])`` of a list of bytes/None,
    built by Arrow in one call."""
    arr = pa.array(items, type=pa.large_binary())
    _valid_buf, off_buf, data_buf = arr.buffers()
    n = len(arr)
    offsets = np.frombuffer(off_buf, dtype=np.int64, count=n + 1) if off_buf else np.zeros(1)
    data = (
        np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None
        else np.empty(0, np.uint8)
    )
    valid = (
        np.ones(n, dtype=np.bool_)
        if arr.null_count == 0
        else arr.is_valid().to_numpy(zero_copy_only=False)
    )
    return offsets, data, valid


def with_flag(items: Sequence[bytes | None]) -> list[bytes]:
    """``b"\\0"`` for each ``None``, ``b"\\1" + item`` for the others (before-images),
    built with numpy and Arrow."""
    offsets, data, present = binary_parts(items)
    n = len(present)
    lengths = np.where(present, np.diff(offsets) + 1, 1)
    out_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=out_off[1:])
    out = np.zeros(int(out_off[-1]), dtype=np.uint8)
    out[out_off[:-1]] = present
    body = np.where(present, np.diff(offsets), 0)
    out[_ranges(out_off[:-1] + 1, body)] = data[_ranges(offsets[:-1], body)]
    arr = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(out_off), pa.py_buffer(out)]
    )
    return arr.to_pylist()  # type: ignore[no-any-return]


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenated index ranges ``starts[i] .. starts[i] + lengths[i]``."""
    total = int(lengths.sum())
    if not total:
        return np.empty(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    shift = np.repeat(starts - (ends - lengths), lengths)
    out: np.ndarray = np.arange(total, dtype=np.int64) + shift
    return out


class RowCodec:
    """Encodes the columns ``specs`` of a conformed frame to one ``bytes`` per row.

    Guarantees: ``decode(encode(f)) == f`` for every supported column type,
    nulls included; equal rows (with floats compared as values) encode to
    equal bytes.
    """

    def __init__(self, specs: Sequence[ColumnSpec], *, what: str, ordered: bool = False) -> None:
        self.specs = tuple(specs)
        self.ordered = ordered
        """Keys: native columns big-endian, signed ones with the sign bit flipped, so
        the bytes of non-null keys sort as their values (keys of one window are
        neighbours in the database: a batch touches few of its pages)."""
        self.fixed = [c for c in self.specs if c.native]
        self.decimal = [c for c in self.specs if isinstance(c.dtype, pl.Decimal)]
        self.var = [c for c in self.specs if not c.native and c not in self.decimal]
        bad = [c for c in self.var if not isinstance(c.dtype, pl.String | pl.Binary)]
        if bad:
            raise StateStoreError(
                f"the disk state backend cannot hold {what} column(s) "
                f"{ {c.name: str(c.dtype) for c in bad} }: it stores numeric, Boolean, "
                "temporal, String and Binary columns. Use state_backend='memory' for this "
                "query, or cast the column(s) to a supported type."
            )
        self.widths = [c.np_dtype.itemsize for c in self.fixed]
        ncols = len(self.specs)
        self.header = ncols + sum(self.widths) + 16 * len(self.decimal) + 4 * len(self.var)
        self._pos = {c.name: i for i, c in enumerate(self.specs)}

    # ------------------------------------------------------------------ encode

    def encode(self, frame: pl.DataFrame) -> list[bytes]:
        """One ``bytes`` per row of ``frame`` (which holds the codec's columns, cast)."""
        n = frame.height
        head = np.zeros((n, self.header), dtype=np.uint8)
        at = len(self.specs)
        for c in self.specs:
            head[:, self._pos[c.name]] = frame[c.name].is_not_null().to_numpy()
        for c, width in zip(self.fixed, self.widths, strict=True):
            phys = frame[c.name].to_physical()
            filler = False if c.dtype == pl.Boolean else 0
            values = phys.fill_null(filler).to_numpy().astype(
                c.np_dtype.newbyteorder("<"), copy=False
            )
            if c.is_float:  # one encoding per value: -0.0 is 0.0, one NaN
                values = np.where(np.isnan(values), np.nan, values + 0.0).astype(
                    c.np_dtype.newbyteorder("<")
                )
            raw = np.ascontiguousarray(values).view(np.uint8).reshape(n, width)
            if self.ordered:
                raw = raw[:, ::-1]
                if c.np_dtype.kind == "i":
                    raw = raw.copy()
                    raw[:, 0] ^= 0x80
            head[:, at : at + width] = raw
            at += width
        for c in self.decimal:  # Arrow's decimal128: 16 little-endian bytes per value
            arr = frame[c.name].to_arrow()
            if isinstance(arr, pa.ChunkedArray):
                arr = arr.combine_chunks()
            raw = np.frombuffer(arr.buffers()[1], dtype=np.uint8)[
                arr.offset * 16 : (arr.offset + n) * 16
            ].reshape(n, 16).copy()
            if arr.null_count:
                raw[~arr.is_valid().to_numpy(zero_copy_only=False)] = 0
            head[:, at : at + 16] = raw
            at += 16
        pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        lengths_total = np.zeros(n, dtype=np.int64)
        for c in self.var:
            arrow = frame[c.name].cast(pl.Binary).to_arrow()
            offsets, data, _ = _arrow_parts(arrow)
            lengths = np.diff(offsets)
            head[:, at : at + 4] = lengths.astype("<u4").view(np.uint8).reshape(n, 4)
            at += 4
            pieces.append((offsets, data, lengths))
            lengths_total += lengths
        row_len = self.header + lengths_total
        row_off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(row_len, out=row_off[1:])
        out = np.empty(int(row_off[-1]), dtype=np.uint8)
        starts = row_off[:-1]
        out[_ranges(starts, np.full(n, self.header, dtype=np.int64))] = head.reshape(-1)
        cursor = starts + self.header
        for offsets, data, lengths in pieces:
            out[_ranges(cursor, lengths)] = data[_ranges(offsets[:-1], lengths)]
            cursor = cursor + lengths
        arr = pa.LargeBinaryArray.from_buffers(
            pa.large_binary(), n, [None, pa.py_buffer(row_off), pa.py_buffer(out)]
        )
        return arr.to_pylist()  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ decode

    def decode(self, items: Sequence[bytes | None]) -> tuple[pl.DataFrame, np.ndarray]:
        """The rows encoded in ``items`` (``None``: absent, decoded as nulls) and
        the mask of the present ones."""
        offsets, data, present = binary_parts(items)
        return self.decode_parts(offsets, data, present), present

    def decode_parts(
        self, offsets: np.ndarray, data: np.ndarray, present: np.ndarray
    ) -> pl.DataFrame:
        """As :meth:`decode`, from the Arrow parts of the list."""
        n = len(present)
        starts = offsets[:-1].copy()
        # an absent row reads the zero header of a 1-row scratch area at the end
        scratch = np.zeros(self.header, dtype=np.uint8)
        data = np.concatenate([data, scratch])
        starts[~present] = len(data) - self.header
        head = data[_ranges(starts, np.full(n, self.header, dtype=np.int64))].reshape(
            n, self.header
        )
        cols: dict[str, pl.Series] = {}
        at = len(self.specs)
        for c, width in zip(self.fixed, self.widths, strict=True):
            part = head[:, at : at + width]
            if self.ordered:
                part = part[:, ::-1].copy()
                if c.np_dtype.kind == "i":
                    part[:, width - 1] ^= 0x80
            raw = np.ascontiguousarray(part).view(c.np_dtype.newbyteorder("<")).reshape(n)
            at += width
            valid = head[:, self._pos[c.name]].astype(np.bool_)
            cols[c.name] = c.from_parts(raw.astype(c.np_dtype, copy=False), valid)
        for c in self.decimal:
            raw = np.ascontiguousarray(head[:, at : at + 16])
            at += 16
            valid = head[:, self._pos[c.name]].astype(np.bool_)
            mask = pa.py_buffer(np.packbits(valid, bitorder="little")) if not valid.all() else None
            dtype = c.dtype
            assert isinstance(dtype, pl.Decimal)
            arrow = pa.Array.from_buffers(
                pa.decimal128(dtype.precision or 38, dtype.scale), n, [mask, pa.py_buffer(raw)]
            )
            cols[c.name] = pl.Series(c.name, arrow).cast(dtype)
        cursor = starts + self.header
        for c in self.var:
            lengths = (
                np.ascontiguousarray(head[:, at : at + 4]).view("<u4").reshape(n).astype(np.int64)
            )
            at += 4
            valid = head[:, self._pos[c.name]].astype(np.bool_)
            out_off = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(lengths, out=out_off[1:])
            body = data[_ranges(cursor, lengths)]
            cursor = cursor + lengths
            mask = pa.py_buffer(np.packbits(valid, bitorder="little")) if not valid.all() else None
            arrow_type = pa.large_string() if c.dtype == pl.String else pa.large_binary()
            arr = pa.Array.from_buffers(
                arrow_type, n, [mask, pa.py_buffer(out_off), pa.py_buffer(body)]
            )
            cols[c.name] = pl.Series(c.name, arr)
        return pl.DataFrame([cols[c.name] for c in self.specs])


def _arrow_parts(arr: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(offsets, data, valid)`` of a (large) binary Arrow array, nulls as empty."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if arr.type != pa.large_binary():
        arr = arr.cast(pa.large_binary())
    n = len(arr)
    _, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int64, count=n + 1 + arr.offset)[arr.offset :]
    data = (
        np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None
        else np.empty(0, np.uint8)
    )
    lengths = np.diff(offsets)
    if arr.null_count:
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        lengths = np.where(valid, lengths, 0)
        fixed = np.zeros(n + 1, dtype=np.int64)
        # nulls contribute no bytes: rebase the starts of the non-null values
        starts = offsets[:-1]
        data = data[_ranges(starts, lengths)]
        np.cumsum(lengths, out=fixed[1:])
        return fixed, data, valid
    base = int(offsets[0])
    return offsets - base, data[base:], np.ones(n, np.bool_)
