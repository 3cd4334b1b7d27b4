"""A directory of files as a replayable log.

The directory's file list is the log. Each time the engine plans, new files
are *admitted* in a stable order, ``(modification time, name)``, and appended
to a durable, append-only **file ledger** kept in the source's state
directory. An offset is the number of files admitted so far, so the range
``[start, end)`` always names the same files, across restarts too: a file is
never read twice and never skipped.

Decoding is bulk (one Polars call per file on the good path). Bad input never
loses good data: an unreadable file, a malformed JSON line or a value that
does not fit the schema becomes a dead-letter row with its location (file, or
``file:line``), the reason and, for text formats, the raw bytes; the rest of
the batch goes on. A file that does not fit the declared schema as a whole (a
column missing, or a Parquet column of a type that does not convert) is one
dead letter whose reason begins ``schema mismatch:``, counted as
``schema_mismatch`` in the progress record; the file is left in place.

NOTE: writers should create files under a hidden or temporary name
(``.name``, ``_name`` or ``*.tmp``) and rename them into place: a visible file
is admitted as soon as it is listed, and only the bytes present at admission
(its recorded size) are ever read.
"""

from __future__ import annotations

import io
import json
import os
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from microbatch.exceptions import PlanError, SourceError
from microbatch.sources.base import (
    DEAD_LETTER_SCHEMA,
    SCHEMA_MISMATCH,
    ReadSplit,
    Source,
    SourceBatch,
    SourceContext,
    balanced_runs,
    check_batch_cap,
    empty_dead_letters,
)
from microbatch.sources.decoding import (
    DECODE_ERRORS,
    bisect_bad,
    castable,
    conform,
    short_reason,
)
from microbatch.sources.file_ledger import FileLedger, LedgerFile
from microbatch.types import FileFormat, MissingColumns

DEFAULT_GLOBS: dict[str, tuple[str, ...]] = {
    "parquet": ("*.parquet",),
    "json": ("*.json", "*.jsonl", "*.ndjson"),
    "csv": ("*.csv",),
}
"""File name patterns listed per format when no ``glob`` is given."""

TEMP_SUFFIXES = (".tmp", ".temp", ".crc", ".part", ".partial", ".swp", ".inprogress", "~")
"""Files ending like this are being written by someone and are never admitted."""

_UTF8_BOM = b"\xef\xbb\xbf"


# --------------------------------------------------------------------------- source


class FileSource(Source):
    """Files in a directory, read in admission order; each file exactly once.

    Parameters
    ----------
    path
        The directory to watch. It is listed (not recursively, unless ``glob``
        says ``**``) each time the engine plans a batch.
    format
        ``"parquet"``, ``"json"`` (newline-delimited JSON) or ``"csv"`` (with a
        header line).
    schema
        Columns and types of the output; the output has exactly these columns,
        in this order. Required for ``json`` and ``csv``; inferred from the
        files for ``parquet`` when ``None``. JSON and CSV values are read as
        text and converted: numbers, ``true``/``false``, ISO-8601 strings into
        ``pl.Datetime`` (offsets converted to the schema's time zone, naive
        strings taken to be in it) and ``pl.Date``, JSON text into nested
        types. A non-null value that does not convert (``"abc"`` for
        ``Int64``, ``1.5`` for ``Int64``, an epoch number for ``Datetime``)
        sends its row to the dead letters with the column named. A field
        missing from some JSON records, and missing trailing CSV fields, are
        null; a column missing from the whole file follows
        ``on_missing_columns``. Columns not in the schema are dropped.
    max_files_per_batch
        At most this many files per batch (``None``: all new files).
    on_missing_columns
        What a file with records that lacks a column of ``schema`` does (a
        Parquet or CSV file without the column, a JSON file none of whose
        records has the key): ``"dead_letter"`` (the default, strict) sends
        the whole file to the dead letters, reason ``schema mismatch: missing
        column 'x' ...``, counted as ``schema_mismatch`` in the progress
        record, and leaves it in place; ``"null"`` reads the column as null.
        A Parquet column whose type does not convert to the schema's
        (:func:`~microbatch.sources.decoding.castable`: a list for a number,
        a number for a timestamp) is a schema mismatch under either policy.
        Files without records and sources without a schema are never one.
    glob
        File name pattern relative to ``path`` (default per format:
        ``*.parquet``; ``*.json``, ``*.jsonl``, ``*.ndjson``; ``*.csv``). Hidden
        files (``.``/``_`` prefix) and temporary files are never admitted.

    Guarantees: offsets are file counts in a durable ledger, so ``read(a, b)``
    returns the same rows every time, after restarts too; rows that cannot be
    decoded go to ``dead_letters`` and never stop the batch.

    Examples
    --------
    >>> src = FileSource("landing/", format="json", schema={"id": pl.Int64})  # doctest: +SKIP
    """

    kind = "files"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        format: FileFormat,
        schema: pl.Schema | Mapping[str, Any] | None = None,
        max_files_per_batch: int | None = None,
        glob: str | None = None,
        on_missing_columns: MissingColumns = "dead_letter",
    ) -> None:
        if format not in DEFAULT_GLOBS:
            raise PlanError(
                f"read_files: format must be 'parquet', 'json' or 'csv', got {format!r}"
            )
        if schema is None and format != "parquet":
            raise PlanError(
                f"read_files({str(path)!r}, format={format!r}) needs a schema: JSON and CSV "
                "files carry no types. Pass schema={'col': pl.Int64, ...}."
            )
        check_batch_cap(max_files_per_batch, option="max_files_per_batch", reader="read_files")
        if on_missing_columns not in ("dead_letter", "null"):
            raise PlanError(
                f"read_files: on_missing_columns must be 'dead_letter' (a file lacking a "
                f"column of the schema goes to the dead letters) or 'null' (the column is "
                f"read as null), got {on_missing_columns!r}"
            )
        self.on_missing_columns: MissingColumns = on_missing_columns
        self.path = Path(path).resolve()
        self.format: FileFormat = format
        self._schema = pl.Schema(schema) if schema is not None else None
        self.max_files_per_batch = max_files_per_batch
        self._listed: tuple[int, int] | None = None  # (directory mtime, listing start), ns
        self.globs: tuple[str, ...] = (glob,) if glob else DEFAULT_GLOBS[format]
        self._ledger: FileLedger | None = None

    # -- identity ---------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """Kind, resolved path, format, schema, patterns, the per-batch cap and
        the missing-columns policy."""
        return {
            "kind": self.kind,
            "path": str(self.path),
            "format": self.format,
            "max_files_per_batch": self.max_files_per_batch,
            "glob": list(self.globs),
            "on_missing_columns": self.on_missing_columns,
            "schema": None
            if self._schema is None
            else {name: str(dtype) for name, dtype in self._schema.items()},
        }

    def identity(self) -> dict[str, Any]:
        """Kind, resolved path and format: the same offsets name the same files."""
        return {"kind": self.kind, "path": str(self.path), "format": self.format}

    @property
    def schema(self) -> pl.Schema | None:
        """The output schema when one was given."""
        return self._schema

    # -- lifecycle --------------------------------------------------------------

    def open(self, ctx: SourceContext) -> None:
        """Load the file ledger from ``ctx.state_dir / "ledger"`` (memory if ``None``)."""
        self._ledger = FileLedger(None if ctx.state_dir is None else ctx.state_dir / "ledger")

    def close(self) -> None:
        """Forget the in-memory copy of the ledger; :meth:`open` reloads it."""
        self._ledger = None

    @property
    def ledger(self) -> FileLedger:
        """The file ledger (an in-memory one when :meth:`open` was never called)."""
        if self._ledger is None:
            self._ledger = FileLedger(None)
        return self._ledger

    def initial_offset(self) -> int:
        """No file admitted yet."""
        return 0

    def latest_offset(self, start: Any, *, capped: bool = True) -> int:
        """Admit new files, then return the end of the next batch.

        New files are appended to the ledger (durably) in ``(mtime, name)``
        order; the result is the ledger length, or ``start +
        max_files_per_batch`` if that is smaller and ``capped``.
        """
        begin = self._check_offset(start)
        ledger = self.ledger
        if begin > len(ledger):
            raise self._lost_ledger_error(begin)
        ledger.append(self._list_new_files(ledger))
        total = len(ledger)
        if capped and self.max_files_per_batch is not None:
            return min(total, begin + self.max_files_per_batch)
        return total

    def compare(self, a: Any, b: Any) -> int:
        """Integer comparison of two file counts."""
        x, y = self._check_offset(a), self._check_offset(b)
        return (x > y) - (x < y)

    def read(self, start: Any, end: Any) -> SourceBatch:
        """Decode exactly the ledger's files ``[start, end)``.

        Raises :class:`SourceError` when one of them is no longer in the
        directory: silently skipping it would change a recorded batch.
        """
        begin, stop = self._check_offset(start), self._check_offset(end)
        return self.read_entries(self._recorded_files(begin, stop), begin, stop)

    def read_splits(self, start: Any, end: Any, pieces: int) -> list[ReadSplit] | None:
        """The ledger's files ``[start, end)`` as ``pieces`` contiguous runs of
        about equal bytes (:class:`FileSplit`); ``None`` without a declared
        schema (Parquet files of one batch are then unified as a whole, which
        pieces read apart could not reproduce)."""
        if self._schema is None:
            return None
        begin, stop = self._check_offset(start), self._check_offset(end)
        files = self._recorded_files(begin, stop)
        reader = self.reader()
        return [
            FileSplit(reader, tuple(files[lo:hi]), begin, stop)
            for lo, hi in balanced_runs([f.size for f in files], pieces)
        ]

    def reader(self) -> FileSource:
        """A source with this one's options and no ledger: what a split reads with."""
        return FileSource(self.path, format=self.format, schema=self._schema,
                          glob=self.globs[0] if len(self.globs) == 1 else None,
                          on_missing_columns=self.on_missing_columns)

    def _recorded_files(self, begin: int, stop: int) -> list[LedgerFile]:
        ledger = self.ledger
        if stop > len(ledger):
            raise self._lost_ledger_error(stop)
        return ledger.files(begin, stop)

    def read_entries(self, entries: Sequence[LedgerFile], start: int, end: int) -> SourceBatch:
        """Decode ``entries`` (files of the recorded range ``[start, end)``, named in
        messages) in order: their rows, and dead letters for what does not decode."""
        frames: list[pl.DataFrame] = []
        dead: list[pl.DataFrame] = []
        for entry in entries:
            data, letters = self._read_file(entry, start, end)
            if data is not None:
                frames.append(data)
            if letters.height:
                dead.append(letters)
        return SourceBatch(
            data=self._concat(frames),
            dead_letters=pl.concat(dead) if dead else empty_dead_letters(),
        )

    # -- listing ----------------------------------------------------------------

    def _list_new_files(self, ledger: FileLedger) -> list[tuple[str, int, int]]:
        if not self.path.is_dir():
            raise SourceError(
                f"files source: {self.path} is not a directory (missing or a file); "
                "create it, or fix the path given to read_files"
            )
        # Skip the listing when the directory did not change since the last one.
        # NOTE: only trusted when that listing began over a second after the
        # directory's mtime, so a file created after the listing (even on a
        # filesystem with coarse timestamps) must give the directory a new mtime.
        flat = all("/" not in g and "**" not in g for g in self.globs)
        dir_mtime = self.path.stat().st_mtime_ns
        listed = self._listed
        if flat and listed is not None and listed[0] == dir_mtime and listed[1] - dir_mtime > 10**9:
            return []
        self._listed = (dir_mtime, time.time_ns())
        seen: dict[str, tuple[int, int]] = {}
        for pattern in self.globs:
            for candidate in self.path.glob(pattern):
                rel = candidate.relative_to(self.path).as_posix()
                if rel in seen or rel in ledger or _is_hidden_or_temp(rel):
                    continue
                try:
                    st = candidate.stat()
                except FileNotFoundError:  # renamed or removed while listing
                    continue
                if stat.S_ISREG(st.st_mode):
                    seen[rel] = (st.st_size, st.st_mtime_ns)
        order = sorted(seen, key=lambda rel: (seen[rel][1], rel))
        return [(rel, seen[rel][0], seen[rel][1]) for rel in order]

    # -- reading ----------------------------------------------------------------

    def _read_file(
        self, entry: LedgerFile, start: int, end: int
    ) -> tuple[pl.DataFrame | None, pl.DataFrame]:
        where = self.path / entry.path
        try:
            size_now = where.stat().st_size
        except FileNotFoundError:
            raise SourceError(
                f"files source {self.path}: file {entry.path!r} (ledger seq {entry.seq}, part of "
                f"offsets [{start}, {end})) is gone. Put the file back to replay this batch, or "
                "start the query on a new checkpoint to skip it."
            ) from None
        changed = size_now < entry.size or (self.format == "parquet" and size_now != entry.size)
        if changed:
            return None, self._file_letter(
                where,
                f"file changed after it was admitted (size {entry.size} then, {size_now} now); "
                "it was not read and is left in place: write new data to a new file",
            )
        if entry.size == 0:
            return None, empty_dead_letters()
        with where.open("rb") as fh:
            buf = fh.read(entry.size)
        if self.format == "parquet":
            return self._decode_parquet(buf, where)
        return self._decode_text(buf, where)

    def _decode_parquet(self, buf: bytes, where: Path) -> tuple[pl.DataFrame | None, pl.DataFrame]:
        try:
            frame = pl.read_parquet(io.BytesIO(buf))
        except DECODE_ERRORS as exc:
            return None, self._file_letter(
                where,
                f"cannot read Parquet file ({short_reason(exc)}); the file is left in place and "
                "is not retried: fix or replace it under a new name",
            )
        if self._schema is None:
            return frame, empty_dead_letters()
        if frame.height:
            missing = [name for name in self._schema if name not in frame.columns]
            mismatch = self._mismatch_letter(where, missing, frame.schema, found=frame.columns)
            if mismatch is not None:
                return None, mismatch
        try:
            data, reasons = conform(frame, self._schema)
        except DECODE_ERRORS as exc:  # a conversion castable() allows but Polars refuses
            return None, self._file_letter(
                where,
                f"{SCHEMA_MISMATCH}the file's columns do not convert to the schema "
                f"({short_reason(exc)}); {_LEFT_IN_PLACE}",
            )
        bad = reasons.is_not_null()
        if not bad.any():
            return data, empty_dead_letters()
        rows = np.flatnonzero(bad.to_numpy())
        raw = frame.filter(bad).write_ndjson().encode().splitlines()
        letters = pl.DataFrame(
            {
                "source": f"files:{self.path}",
                "location": [f"{where}#row={r}" for r in rows],
                "reason": reasons.filter(bad),
                "raw": raw,
            },
            schema=DEAD_LETTER_SCHEMA,
        )
        return data.filter(~bad), letters

    def _decode_text(self, buf: bytes, where: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Decode a JSON-lines or CSV file.

        The good path is one parse and one cast of the whole file. Only when
        that fails, or some rows do not fit the schema, are the records located
        (numpy over the bytes) and, if needed, the failing ones found by
        bisection.
        """
        schema = self._text_schema
        csv = self.format == "csv"
        if buf.startswith(_UTF8_BOM):  # written by some Windows tools; not part of the data
            buf = buf[len(_UTF8_BOM) :]
        whole: pl.DataFrame | None
        try:
            whole = self._parse_whole(buf)
        except DECODE_ERRORS:
            whole = None
        if whole is not None and whole.height:
            mismatch = self._text_mismatch(buf, whole, where)
            if mismatch is not None:
                return schema.to_frame(), mismatch
        if whole is not None:
            data, reasons = conform(whole, schema)
            # the CSV reader turns a blank line into a row of nulls
            blank_rows = csv and bool(
                whole.select(pl.all_horizontal(pl.all().is_null()).any()).item()
            )
            if not blank_rows and reasons.null_count() == len(reasons):
                return data, empty_dead_letters()
        records = _Records.split(buf, csv=csv)
        expected = records.count if csv else records.nonblank_count(0, records.count)
        goods: list[tuple[int, int, pl.DataFrame]]
        bads: list[tuple[int, str]]
        if whole is not None and whole.height == expected:
            goods, bads = (
                [(0, records.count, whole.filter(pl.Series(~records.blank)) if csv else whole)],
                [],
            )
        else:
            parse = self._parse_csv_chunk if csv else self._parse_json_chunk
            goods, bads = bisect_bad(records.count, lambda lo, hi: parse(records, lo, hi))
        good_rows = (
            np.concatenate([records.nonblank_between(lo, hi) for lo, hi, _ in goods])
            if goods
            else np.empty(0, dtype=np.int64)
        )
        wire = [frame for _, _, frame in goods if frame.width]
        frame = pl.concat(wire, how="diagonal") if wire else pl.DataFrame()
        if frame.height:
            mismatch = self._text_mismatch(buf, frame, where)
            if mismatch is not None:
                return schema.to_frame(), mismatch
        data, reasons = conform(frame, schema)
        what = "JSON line" if self.format == "json" else "CSV record"
        bad_records = [i for i, _ in bads]
        bad_reasons = [f"invalid {what}: {reason}" for _, reason in bads]
        bad = reasons.is_not_null()
        if bad.any():
            bad_records.extend(good_rows[bad.to_numpy()].tolist())
            bad_reasons.extend(reasons.filter(bad).to_list())
            data = data.filter(~bad)
        order = sorted(range(len(bad_records)), key=bad_records.__getitem__)
        letters = self._line_letters(
            records, where, [bad_records[k] for k in order], [bad_reasons[k] for k in order]
        )
        return data, letters

    def _parse_whole(self, buf: bytes) -> pl.DataFrame:
        if self.format == "json":
            wire = dict.fromkeys(self._text_schema, pl.String)
            return pl.read_ndjson(io.BytesIO(buf), schema=wire)
        return pl.read_csv(io.BytesIO(buf), infer_schema=False, has_header=True)

    def _parse_json_chunk(self, records: _Records, lo: int, hi: int) -> pl.DataFrame:
        expected = records.nonblank_count(lo, hi)
        if expected == 0:
            return pl.DataFrame()
        wire = dict.fromkeys(self._text_schema, pl.String)
        frame = pl.read_ndjson(io.BytesIO(records.chunk(lo, hi)), schema=wire)
        if frame.height != expected:
            raise ValueError(f"expected {expected} JSON objects, found {frame.height}")
        return frame

    def _parse_csv_chunk(self, records: _Records, lo: int, hi: int) -> pl.DataFrame:
        expected = records.nonblank_count(lo, hi)
        if expected == 0:
            return pl.DataFrame()
        data = records.header + b"\n" + records.chunk(lo, hi) + b"\n"
        frame = pl.read_csv(io.BytesIO(data), infer_schema=False, has_header=True)
        if frame.height != hi - lo:
            raise ValueError(f"expected {hi - lo} CSV records, found {frame.height}")
        # a blank line is a row of nulls to the CSV reader, not a record
        return frame.filter(pl.Series(~records.blank[lo:hi]))

    # -- schema mismatch --------------------------------------------------------

    def _text_mismatch(self, buf: bytes, frame: pl.DataFrame, where: Path) -> pl.DataFrame | None:
        """The dead letter for a JSON or CSV file that lacks a schema column, if it does.

        ``frame`` is the file's decoded records as text. CSV: the header names
        the columns. JSON lines have no header: a key is missing from the file
        when it is null in every record and its quoted name is nowhere in the
        bytes (a key absent from some records only is a null value: writers
        often leave out null fields).
        """
        schema = self._text_schema
        if self.format == "csv":
            missing = [name for name in schema if name not in frame.columns]
            return self._mismatch_letter(where, missing, pl.Schema(), found=frame.columns)
        missing = [
            name
            for name in schema
            if frame.get_column(name).null_count() == frame.height and not _mentions_key(buf, name)
        ]
        return self._mismatch_letter(where, missing, pl.Schema(), found=None)

    def _mismatch_letter(
        self,
        where: Path,
        missing: Sequence[str],
        typed: pl.Schema,
        *,
        found: Sequence[str] | None,
    ) -> pl.DataFrame | None:
        """One dead letter for a file that does not fit the schema, or ``None``.

        ``missing``: the schema's columns the file lacks (a mismatch unless
        ``on_missing_columns="null"``); ``typed``: the file's column types
        (Parquet), each checked with :func:`castable`; ``found``: the file's
        columns, named in the reason to show a renamed column.
        """
        schema = self._text_schema
        problems: list[str] = []
        strict = bool(missing) and self.on_missing_columns == "dead_letter"
        if strict:
            names = ", ".join(f"{name!r} ({schema[name]})" for name in missing)
            has = f" (the file has {_bounded(found)})" if found is not None else ""
            problems.append(f"missing column{'s' if len(missing) > 1 else ''} {names}{has}")
        for name, dtype in typed.items():
            target = schema.get(name)
            if target is not None and not castable(dtype, target):
                problems.append(
                    f"column {name!r} is {dtype} in the file, {target} in the schema, "
                    "and does not convert"
                )
        if not problems:
            return None
        fix = (
            '; or read_files(..., on_missing_columns="null") reads missing columns as null'
            if strict
            else ""
        )
        return self._file_letter(
            where, f"{SCHEMA_MISMATCH}{'; '.join(problems)}; {_LEFT_IN_PLACE}{fix}"
        )

    # -- dead letters -----------------------------------------------------------

    def _file_letter(self, where: Path, reason: str) -> pl.DataFrame:
        return pl.DataFrame(
            {
                "source": [f"files:{self.path}"],
                "location": [str(where)],
                "reason": [reason],
                "raw": [b""],
            },
            schema=DEAD_LETTER_SCHEMA,
        )

    def _line_letters(
        self,
        records: _Records,
        where: Path,
        rows: Sequence[int],
        reasons: Sequence[str],
    ) -> pl.DataFrame:
        """Dead letters for records ``rows`` (a Python loop over bad records only)."""
        return pl.DataFrame(
            {
                "source": [f"files:{self.path}"] * len(rows),
                "location": [f"{where}:{records.lines[r]}" for r in rows],
                "reason": reasons,
                "raw": [records.raw(r) for r in rows],
            },
            schema=DEAD_LETTER_SCHEMA,
        )

    # -- helpers ----------------------------------------------------------------

    def _concat(self, frames: list[pl.DataFrame]) -> pl.DataFrame:
        if self._schema is not None:
            return pl.concat(frames) if frames else self._schema.to_frame()
        if not frames:
            return pl.DataFrame()
        try:
            return pl.concat(frames, how="diagonal_relaxed")
        except pl.exceptions.PolarsError as exc:
            raise SourceError(
                f"files source {self.path}: the Parquet files of one batch have incompatible "
                f"schemas ({short_reason(exc)}); pass schema=... to read_files to cast them"
            ) from exc

    @property
    def _text_schema(self) -> pl.Schema:
        if self._schema is None:  # pragma: no cover - refused in __init__
            raise PlanError(f"read_files: format {self.format!r} needs a schema")
        return self._schema

    def _check_offset(self, offset: Any) -> int:
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise SourceError(
                f"files source {self.path}: offset {offset!r} is not a file count; "
                "was the checkpoint written by another kind of source?"
            )
        return offset

    def _lost_ledger_error(self, offset: int) -> SourceError:
        return SourceError(
            f"files source {self.path}: the checkpoint refers to file {offset} but the file "
            f"ledger holds only {len(self.ledger)} files; the ledger "
            f"({self.ledger.directory or 'in memory'}) was deleted or belongs to another "
            "checkpoint. Restore it, or start the query on a new checkpoint."
        )


@dataclass(frozen=True)
class FileSplit(ReadSplit):
    """A contiguous run of a batch's files, read where it is sent.

    Carries the files as the ledger admitted them (path, size) and the
    source's options (:meth:`FileSource.reader`), so a worker reads exactly
    the bytes the ledger recorded, and decodes them as the driver would."""

    reader: FileSource
    files: tuple[LedgerFile, ...]
    start: int
    end: int

    def read(self) -> SourceBatch:
        return self.reader.read_entries(self.files, self.start, self.end)

    @property
    def size_hint(self) -> int:
        return sum(f.size for f in self.files)


# --------------------------------------------------------------------------- decoding


_LEFT_IN_PLACE = (
    "the file is left in place and not read: fix it, or the schema, and drop it in again "
    "under a new name"
)


def _mentions_key(buf: bytes, name: str) -> bool:
    """Whether the quoted ``name`` occurs in ``buf`` (as written by JSON writers:
    escaped non-ASCII or plain UTF-8)."""
    return any(
        json.dumps(name, ensure_ascii=ascii).encode() in buf for ascii in (True, False)
    )


def _bounded(names: Sequence[str], limit: int = 20) -> str:
    """``['a', 'b']``, or the first ``limit`` names and how many more."""
    shown = ", ".join(repr(n) for n in names[:limit])
    more = f", ... {len(names) - limit} more" if len(names) > limit else ""
    return f"[{shown}{more}]"


def _is_hidden_or_temp(rel: str) -> bool:
    parts = rel.split("/")
    return any(p.startswith((".", "_")) for p in parts) or rel.endswith(TEMP_SUFFIXES)


@dataclass(frozen=True)
class _Records:
    """The records of a text file as byte ranges, found with numpy.

    JSON: one record per line. CSV: the first record is the header; a record
    ends at a line end where the count of ``"`` so far is even (quoted fields
    may hold newlines). ``lines`` is the 1-based line number of each record.
    """

    buf: bytes
    starts: np.ndarray
    ends: np.ndarray
    lines: np.ndarray
    blank: np.ndarray
    header: bytes = b""

    @classmethod
    def split(cls, buf: bytes, *, csv: bool) -> _Records:
        arr = np.frombuffer(buf, dtype=np.uint8)
        newlines = np.flatnonzero(arr == 10)
        starts = np.concatenate(([0], newlines + 1)).astype(np.int64)
        ends = np.concatenate((newlines, [len(buf)])).astype(np.int64)
        if starts[-1] == len(buf):  # the text after the final newline is not a line
            starts, ends = starts[:-1], ends[:-1]
        last = np.maximum(ends - 1, 0)
        ends = ends - ((ends > starts) & (arr[last] == 13))  # CRLF
        first_line = np.arange(len(starts), dtype=np.int64)
        last_line = first_line
        if csv and len(starts):
            quotes = np.flatnonzero(arr == 34)
            per_line = np.searchsorted(quotes, ends) - np.searchsorted(quotes, starts)
            balanced = np.cumsum(per_line) % 2 == 0
            balanced[-1] = True  # an unterminated quote swallows the rest as one record
            last_line = np.flatnonzero(balanced)
            first_line = np.concatenate(([0], last_line[:-1] + 1))
        rec_starts, rec_ends = starts[first_line], ends[last_line]
        blank = rec_ends == rec_starts
        # whitespace-only lines are blank too; only lines starting with
        # whitespace need a look, and those are rare
        lead = np.flatnonzero(~blank & np.isin(arr[np.minimum(rec_starts, len(buf) - 1)], (9, 32)))
        for i in lead:
            blank[i] = not buf[rec_starts[i] : rec_ends[i]].strip()
        header = b""
        lines = first_line + 1
        if csv and len(rec_starts):
            header = buf[rec_starts[0] : rec_ends[0]]
            rec_starts, rec_ends, lines, blank = rec_starts[1:], rec_ends[1:], lines[1:], blank[1:]
        return cls(buf, rec_starts, rec_ends, lines, blank, header)

    @property
    def count(self) -> int:
        return len(self.starts)

    def chunk(self, lo: int, hi: int) -> bytes:
        """The bytes of records ``[lo, hi)`` as they are in the file."""
        return self.buf[self.starts[lo] : self.ends[hi - 1]]

    def raw(self, i: int) -> bytes:
        """The bytes of record ``i``."""
        return self.buf[self.starts[i] : self.ends[i]]

    def nonblank_count(self, lo: int, hi: int) -> int:
        return int(hi - lo - np.count_nonzero(self.blank[lo:hi]))

    def nonblank_between(self, lo: int, hi: int) -> np.ndarray:
        """Indices of the non-blank records in ``[lo, hi)`` (one row each)."""
        return lo + np.flatnonzero(~self.blank[lo:hi])
