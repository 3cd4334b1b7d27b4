"""The bad-input corpus of the file source, and how each case must come out.

Each :class:`Case` is a handful of files (JSON lines, CSV or Parquet) that
land in a directory in order, mixing good records with one kind of bad input.
:func:`run_case` reads them one file per batch through two queries:

- **pass-through** ``read_files -> write_parquet``: the output must hold
  exactly the good records (by ``event_id``, values equal);
- **windowed** ``read_files -> with_watermark("event_time", "10s"[,
  max_future_skew]) -> group_by(window("event_time", "1m"), "card_id")
  .agg(n, total) -> write_parquet`` with a late side output: the output must
  equal :func:`expected_windows`, a batch-by-batch reference of the watermark
  rule over the good records, and every good record must be in an emitted
  window, in a window still open, or in the late output.

The dead letters must be exactly the bad records, with the reason. A case
whose documented outcome is ``stop`` must fail with a clear message, and
after its documented fix (``fixed_schema``) resume on the same checkpoint
with every good record out.
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import polars as pl

import microbatch as mb
from microbatch.durations import parse_duration_ms
from sinks.parquet import ParquetSink

Format = Literal["json", "csv", "parquet"]
Outcome = Literal["dead letter", "accepted", "late output", "stop, then resume"]

SCHEMA: dict[str, pl.DataType] = {
    "event_id": pl.Int64(),
    "card_id": pl.Int64(),
    "amount": pl.Float64(),
    "event_time": pl.Datetime("ms", "UTC"),
    "note": pl.String(),
}
"""The schema the queries declare (``Case.schema`` may drop it for Parquet)."""
T0 = datetime(2026, 1, 1, tzinfo=UTC)
DELAY_MS = 10_000
WINDOW_MS = 60_000
HUGE = 5 * 1024 * 1024
"""Bytes of the huge string field."""


# ------------------------------------------------------------------ good records


def good(start: int, n: int, *, step_s: float = 2.0) -> pl.DataFrame:
    """``n`` good records from ``event_id`` ``start``, ``step_s`` apart in event time."""
    ids = list(range(start, start + n))
    return pl.DataFrame(
        {
            "event_id": ids,
            "card_id": [i % 5 for i in ids],
            "amount": [(i % 100) + 0.25 for i in ids],  # exact in binary: sums are exact
            "event_time": [T0 + timedelta(seconds=i * step_s) for i in ids],
            "note": [f"n{i}" for i in ids],
        },
        schema=SCHEMA,
    )


def flush(event_id: int = 99_999) -> pl.DataFrame:
    """One good record an hour later: its watermark closes every earlier window."""
    return good(0, 1).with_columns(
        pl.lit(event_id, pl.Int64).alias("event_id"),
        pl.lit(T0 + timedelta(hours=1)).dt.cast_time_unit("ms").alias("event_time"),
        pl.lit(99, pl.Int64).alias("card_id"),
    )


def json_lines(frame: pl.DataFrame) -> bytes:
    """Records as JSON lines with ISO-8601 times."""
    rows = frame.with_columns(pl.col("event_time").dt.to_string("%Y-%m-%dT%H:%M:%S%.3fZ"))
    return "".join(json.dumps(r) + "\n" for r in rows.to_dicts()).encode()


def csv_text(frame: pl.DataFrame, *, header: bool = True) -> bytes:
    """Records as CSV with a header line."""
    buf = io.BytesIO()
    frame.write_csv(buf, include_header=header, datetime_format="%Y-%m-%dT%H:%M:%S%.3fZ")
    return buf.getvalue()


def parquet(frame: pl.DataFrame) -> bytes:
    """Records as a Parquet file."""
    buf = io.BytesIO()
    frame.write_parquet(buf)
    return buf.getvalue()


def encode(fmt: Format, frame: pl.DataFrame) -> bytes:
    """``frame`` in ``fmt``."""
    return {"json": json_lines, "csv": csv_text, "parquet": parquet}[fmt](frame)


# ------------------------------------------------------------------ cases


@dataclass(frozen=True)
class File:
    """One input file: its bytes, and the good records in it (in order)."""

    name: str
    data: bytes
    good: pl.DataFrame


@dataclass(frozen=True)
class Case:
    """One kind of bad input and its documented outcome."""

    kind: str
    fmt: Format
    what: str
    """The bad input, in a few words (for the behaviour table)."""
    outcome: Outcome
    files: tuple[File, ...]
    dead: int = 0
    """How many dead letters (bad records or files)."""
    reason: str = ""
    """A fragment of every dead-letter reason, or of the stop message."""
    schema: dict[str, pl.DataType] | None = field(default_factory=lambda: dict(SCHEMA))
    skew: str | None = None
    dedupe: bool = False
    """Run the windowed query with ``drop_duplicates("event_id", within="10m")``."""
    fixed_schema: dict[str, pl.DataType] | None = None
    """``stop`` cases: the schema that the restart declares."""
    stops: tuple[str, ...] = ("pass", "win")
    """``stop`` cases: the queries that stop (``pass``-through, ``win``-dowed)."""
    check: Callable[[pl.DataFrame], None] | None = None
    """Extra assertions on the dead letters."""
    tag: str = ""
    """Tells apart cases of one kind and format (part of :attr:`id`)."""
    on_missing_columns: Literal["dead_letter", "null"] = "dead_letter"
    """The ``read_files`` schema drift policy the queries declare."""

    @property
    def id(self) -> str:
        """A pytest id: ``malformed_record-json``."""
        return "-".join(filter(None, (self.kind, self.fmt, self.tag))).replace(" ", "_")

    def good_rows(self) -> pl.DataFrame:
        """Every good record, in arrival order."""
        return pl.concat([f.good for f in self.files])


def _file(name: str, data: bytes, good_rows: pl.DataFrame | None = None) -> File:
    return File(name, data, good_rows if good_rows is not None else good(0, 0))


def _ext(fmt: Format) -> str:
    return {"json": "json", "csv": "csv", "parquet": "parquet"}[fmt]


def _standard(fmt: Format, middle: list[File]) -> tuple[File, ...]:
    """Good records first, the case's files, good records, then the flush record."""
    ext = _ext(fmt)
    first, last, end = good(0, 60), good(1000, 60), flush()
    return (
        _file(f"a.{ext}", encode(fmt, first), first),
        *middle,
        _file(f"y.{ext}", encode(fmt, last), last),
        _file(f"z.{ext}", encode(fmt, end), end),
    )


def _with_lines(fmt: Format, frame: pl.DataFrame, bad: list[bytes], every: int = 7) -> bytes:
    """``frame`` encoded with the ``bad`` lines inserted between good ones."""
    lines = encode(fmt, frame).splitlines(keepends=True)
    head = lines[:1] if fmt == "csv" else []
    body = lines[1:] if fmt == "csv" else lines
    for k, line in enumerate(bad):
        body.insert(min(len(body), (k + 1) * every + k), line.rstrip(b"\n") + b"\n")
    return b"".join(head + body)


def cases() -> list[Case]:
    """The whole corpus, in the order of the behaviour table."""
    out: list[Case] = []
    mid = good(100, 80)

    # malformed records
    binary = bytes(b for b in range(1, 256) if b not in b"\r\n")
    bad_json = [b'{"event_id": 5, "card_id": ', b"not json at all", b"[1, 2, 3]", binary,
                b'{"event_id": 7, "note": "\xff\xfe"}']
    out.append(Case("malformed record", "json", "cut-off object, text, array, binary, bad UTF-8",
                    "dead letter", _standard("json", [_file("b.json",
                        _with_lines("json", mid, bad_json), mid)]),
                    dead=len(bad_json), reason="invalid JSON line"))
    bad_csv = [b"200,1,2.5,2026-01-01T00:00:01Z,x,surplus", b'201,1,2.5,"2026-01-01T00:00:01Z']
    mid_csv = _with_lines("csv", mid, bad_csv[:1])
    out.append(Case("malformed record", "csv", "too many fields; quote left open on the last line",
                    "dead letter", _standard("csv", [_file("b.csv",
                        mid_csv + bad_csv[1] + b"\n", mid)]),
                    dead=2, reason="invalid CSV record"))
    swallowed = good(300, 20)
    open_quote = csv_text(mid) + b'299,1,2.5,"open quote\n' + csv_text(swallowed, header=False)
    out.append(Case("unbalanced quote", "csv", "a quote opened mid-file and never closed",
                    "dead letter", _standard("csv", [_file("b.csv", open_quote, mid)]),
                    dead=1, reason="invalid CSV record",
                    check=_raw_holds(swallowed)))
    out.append(Case("truncated file", "json", "the last line cut off (no newline, half an object)",
                    "dead letter", _standard("json", [_file("b.json",
                        json_lines(mid) + b'{"event_id": 400, "card_id": 1, "amo', mid)]),
                    dead=1, reason="invalid JSON line"))
    out.append(Case("byte-order mark", "json", "UTF-8 BOM before the first record", "accepted",
                    _standard("json", [_file("b.json", b"\xef\xbb\xbf" + json_lines(mid), mid)])))

    # wrong types
    wrong_json = [
        b'{"event_id": "abc", "card_id": 1, "amount": 1, "event_time": "2026-01-01T00:00:01Z"}',
        b'{"event_id": 501, "card_id": 1.5, "amount": 1, "event_time": "2026-01-01T00:00:01Z"}',
        b'{"event_id": 502, "card_id": 99999999999999999999, "event_time": "2026-01-01T00:00:01Z"}',
        b'{"event_id": 503, "card_id": 1, "amount": "ten", "event_time": "2026-01-01T00:00:01Z"}',
        b'{"event_id": 504, "card_id": 1, "amount": 1, "event_time": "yesterday"}',
        b'{"event_id": 505, "card_id": 1, "amount": 1, "event_time": 1767225600000}',
    ]
    out.append(Case("wrong type", "json", "text for numbers, 1.5 for an integer, overflow, "
                    "bad or epoch-number timestamps", "dead letter",
                    _standard("json", [_file("b.json", _with_lines("json", mid, wrong_json),
                                             mid)]),
                    dead=len(wrong_json), reason="cannot convert"))
    wrong_csv = [b"abc,1,1.0,2026-01-01T00:00:01Z,x", b"601,1,ten,2026-01-01T00:00:01Z,x",
                 b"602,1,1.0,not-a-time,x"]
    out.append(Case("wrong type", "csv", "text for numbers, bad timestamp", "dead letter",
                    _standard("csv", [_file("b.csv", _with_lines("csv", mid, wrong_csv), mid)]),
                    dead=len(wrong_csv), reason="cannot convert"))
    fractional = mid.with_columns(pl.col("card_id").cast(pl.Float64))
    fractional = fractional.with_columns(
        pl.when(pl.col("event_id") % 10 == 0).then(pl.col("card_id") + 0.5)
        .otherwise(pl.col("card_id")).alias("card_id"))
    kept = mid.filter(pl.col("event_id") % 10 != 0)
    out.append(Case("wrong type", "parquet", "float card_id; some values fractional",
                    "dead letter", _standard("parquet", [_file("b.parquet",
                        parquet(fractional), kept)]),
                    dead=mid.height - kept.height, reason="cannot convert"))

    # event time
    for fmt in ("json", "csv", "parquet"):
        nulls = mid.with_columns(
            pl.when(pl.col("event_id") % 9 == 0).then(None).otherwise(pl.col("event_time"))
            .alias("event_time"))
        out.append(Case("null event time", fmt, "event_time null or missing", "late output",
                        _standard(fmt, [_file(f"b.{_ext(fmt)}", encode(fmt, nulls), nulls)])))
    # one record without the key, among records with it (a key that no record of
    # the file has is a missing column: a schema mismatch, below)
    missing = b'{"event_id": 700, "card_id": 1, "amount": 1.25}\n'
    without = pl.DataFrame({"event_id": [700], "card_id": [1], "amount": [1.25],
                            "event_time": [None], "note": [None]}, schema=SCHEMA)
    out.append(Case("missing event time", "json", "a record without the event_time field",
                    "late output", _standard("json", [_file(
                        "b.json", json_lines(mid) + missing, pl.concat([mid, without]))])))
    future = good(800, 1).with_columns(
        pl.lit(T0 + timedelta(days=3650)).dt.cast_time_unit("ms").alias("event_time"))
    for skew in (None, "1h"):
        out.append(Case(
            "far-future time", "json",
            "one record 10 years ahead" + (", max_future_skew='1h'" if skew else ""),
            "accepted" if skew else "late output",
            _standard("json", [_file("b.json", json_lines(future), future)]), skew=skew,
            tag="skew" if skew else ""))

    # huge records
    huge = good(900, 3).with_columns(pl.lit("x" * HUGE).alias("note"))
    huge_bad = b'{"event_id": "' + b"9" * HUGE + b'", "card_id": 1}'
    out.append(Case("huge record", "json", "5 MB string field", "accepted",
                    _standard("json", [_file("b.json", json_lines(huge), huge)])))
    out.append(Case("huge bad value", "json", "5 MB of digits for an integer", "dead letter",
                    _standard("json", [_file("b.json", _with_lines("json", mid, [huge_bad]),
                                             mid)]),
                    dead=1, reason="cannot convert"))
    out.append(Case("huge record", "csv", "5 MB string field", "accepted",
                    _standard("csv", [_file("b.csv", csv_text(huge), huge)])))
    out.append(Case("huge record", "parquet", "5 MB string field", "accepted",
                    _standard("parquet", [_file("b.parquet", parquet(huge), huge)])))

    # empty files
    for fmt, blanks in (("json", [b"", b"\n\n  \n"]), ("csv", [b"", csv_text(mid.clear())]),
                        ("parquet", [b"", parquet(mid.clear())])):
        ext = _ext(fmt)
        out.append(Case("empty file", fmt, "zero bytes; " + ("blank lines" if fmt == "json"
                        else "header only" if fmt == "csv" else "zero rows"), "accepted",
                        _standard(fmt, [_file(f"b0.{ext}", blanks[0]),
                                        _file(f"b1.{ext}", blanks[1])])))

    # broken Parquet
    whole = parquet(mid)
    out.append(Case("truncated Parquet", "parquet", "file cut in half; text named .parquet",
                    "dead letter", _standard("parquet", [
                        _file("b.parquet", whole[: len(whole) // 2]),
                        _file("c.parquet", b"this is not parquet")]),
                    dead=2, reason="cannot read Parquet file"))

    # schema drift
    added = mid.with_columns(pl.lit("new").alias("extra"))
    dropped = mid.drop("note", "amount")
    typed = mid.with_columns(pl.col("amount").cast(pl.String), pl.col("card_id").cast(pl.Int32))
    for fmt in ("json", "csv", "parquet"):
        ext = _ext(fmt)
        out.append(Case("schema drift: new column", fmt, "a column not in the schema",
                        "accepted", _standard(fmt, [_file(f"b.{ext}", encode(fmt, added), mid)])))
        out.append(Case("schema drift: dropped column", fmt, "amount and note missing",
                        "dead letter", _standard(fmt, [_file(f"b.{ext}", encode(fmt, dropped))]),
                        dead=1, reason="schema mismatch: missing columns 'amount' (Float64), "
                        "'note' (String)"))
        out.append(Case("schema drift: dropped column", fmt,
                        'amount and note missing, on_missing_columns="null"', "accepted",
                        _standard(fmt, [_file(f"b.{ext}", encode(fmt, dropped),
                                              _nulls(mid, "note", "amount"))]),
                        on_missing_columns="null", tag="null"))
    out.append(Case("schema drift: type change", "parquet",
                    "amount as text, card_id as Int32 (schema declared)", "accepted",
                    _standard("parquet", [_file("b.parquet", parquet(typed), mid)])))
    nested = mid.with_columns(pl.concat_list("amount").alias("amount"))
    out.append(Case("schema drift: type change", "parquet",
                    "amount as a list (schema declared)", "dead letter",
                    _standard("parquet", [_file("b.parquet", parquet(nested))]),
                    dead=1, reason="schema mismatch: column 'amount' is List(Float64)",
                    tag="nested"))
    out.append(Case("schema drift: type change", "parquet",
                    "amount as text (no schema declared)", "stop, then resume",
                    _standard("parquet", [_file("b.parquet", parquet(typed), mid)]),
                    schema=None, reason="changed type", fixed_schema=dict(SCHEMA),
                    tag="no_schema"))
    out.append(Case("schema drift: new column", "parquet",
                    "a new column (no schema declared)", "stop, then resume",
                    _standard("parquet", [_file("b.parquet", parquet(added), mid)]),
                    schema=None, reason="new column", fixed_schema=dict(SCHEMA),
                    stops=("pass",), tag="no_schema"))

    # duplicates
    dupes = pl.concat([mid, mid.head(10)])
    for dedupe in (False, True):
        out.append(Case("duplicate records", "json",
                        "10 records twice" + (", drop_duplicates('event_id')" if dedupe else ""),
                        "accepted", _standard("json", [_file("b.json", json_lines(dupes), dupes)]),
                        dedupe=dedupe, tag="dedupe" if dedupe else ""))
    return out


def _nulls(frame: pl.DataFrame, *columns: str) -> pl.DataFrame:
    return frame.with_columns(pl.lit(None, frame.schema[c]).alias(c) for c in columns)


def _raw_holds(swallowed: pl.DataFrame) -> Callable[[pl.DataFrame], None]:
    """The dead letter of an unbalanced quote keeps the swallowed records' bytes."""

    def check(dead: pl.DataFrame) -> None:
        raw = b"".join(dead.get_column("raw").to_list())
        for event_id in swallowed.get_column("event_id").to_list():
            assert f"\n{event_id},".encode() in raw, f"record {event_id} is not in the raw bytes"

    return check


# ------------------------------------------------------------------ running


@dataclass
class CaseResult:
    """What one case did in the two queries."""

    case: Case
    outcome: str
    good_in: int
    """Good records in the input."""
    passed_through: int
    """Good records in the pass-through output."""
    windowed: int
    """Records in emitted windows, in windows still open, or in the late output."""
    windowed_expected: int
    """The same, by the reference (duplicates dropped when the query drops them)."""
    dead_letters: int
    late_rows: int
    stop_message: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        """Good records missing from either query's output."""
        return max(0, self.good_in - self.passed_through) + max(
            0, self.windowed_expected - self.windowed
        )


def land(case: Case, directory: Path) -> None:
    """Write the case's files in arrival order (increasing mtimes)."""
    directory.mkdir(parents=True, exist_ok=True)
    for i, file in enumerate(case.files):
        path = directory / file.name
        path.write_bytes(file.data)
        mtime = 1_700_000_000 * 10**9 + i * 10**6
        os.utime(path, ns=(mtime, mtime))


def _start(case: Case, work: Path, query: str, schema: dict[str, Any] | None) -> None:
    """Run one of the two queries with ``available-now``; raise what it raises."""
    stream = mb.read_files(work / "in", format=case.fmt, schema=schema, max_files_per_batch=1,
                           on_missing_columns=case.on_missing_columns)
    if query == "pass":
        writer = stream.write_parquet(work / "pass")
    else:
        marked = stream.with_watermark("event_time", f"{DELAY_MS}ms", max_future_skew=case.skew)
        if case.dedupe:
            marked = marked.drop_duplicates("event_id", within="10m")
        writer = (
            marked.group_by(mb.window("event_time", f"{WINDOW_MS}ms"), "card_id")
            .agg(pl.len().alias("n"), pl.col("amount").sum().alias("total"))
            .on_late(ParquetSink(work / "late"))
            .write_parquet(work / "win")
        )
    writer.start(work / f"chk-{query}", trigger="available-now").await_termination(120)


def run_case(case: Case, work: Path) -> CaseResult:
    """Run both queries over the case's files and check them (see the module docstring)."""
    land(case, work / "in")
    problems: list[str] = []
    stops: list[str] = []
    for query in ("pass", "win"):
        try:
            _start(case, work, query, case.schema)
        except mb.MicrobatchError as exc:
            cause = exc.__cause__ or exc
            stops.append(f"{type(cause).__name__}: {cause}")
            if query not in case.stops or case.outcome != "stop, then resume":
                problems.append(f"{query}: unexpected stop: {stops[-1]}")
                continue
            if case.reason not in str(cause):
                problems.append(f"{query}: stop message lacks {case.reason!r}: {cause}")
            _start(case, work, query, case.fixed_schema)
        else:
            if case.outcome == "stop, then resume" and query in case.stops:
                problems.append(f"{query}: the query did not stop")
    goods = case.good_rows()
    passed = _read(work / "pass")
    if not _same_records(passed, goods):
        missing = goods.join(passed, on="event_id", how="anti").height if passed.width else 0
        problems.append(f"pass-through: output differs from the good records ({passed.height} "
                        f"rows, {goods.height} expected, {missing} missing)")
    late = _read(work / "late")
    want, open_n, late_want = expected_windows(case)
    got = _read(work / "win")
    got = got.select(want.columns).sort("window_start", "card_id") if got.width else want.clear()
    if not got.equals(want):
        problems.append(f"windowed: output differs from the reference ({got.height} rows, "
                        f"{want.height} expected)")
    if late.height != late_want:
        problems.append(f"windowed: {late.height} late rows, {late_want} expected")
    dead = _check_dead_letters(case, work, problems)
    observed = ("stop, then resume" if stops else "dead letter" if dead
                else "late output" if late.height else "accepted")
    if observed != case.outcome:
        problems.append(f"outcome {observed!r}, documented {case.outcome!r}")
    return CaseResult(
        case, observed, goods.height, passed.height,
        windowed=int(got.get_column("n").sum() or 0) + open_n + late.height,
        windowed_expected=int(want.get_column("n").sum() or 0) + open_n + late_want,
        dead_letters=dead, late_rows=late.height,
        stop_message=stops[0] if stops else "", problems=problems,
    )


def _read(directory: Path) -> pl.DataFrame:
    return mb.parquet_table(directory) if directory.is_dir() else pl.DataFrame()


def _same_records(got: pl.DataFrame, want: pl.DataFrame) -> bool:
    """The same multiset of records (duplicated input records are two records)."""
    if got.height != want.height:
        return False
    if not got.height:
        return True
    order = ["event_id", "card_id", "amount", "event_time", "note"]
    return got.select(order).sort(order, nulls_last=True).equals(
        want.select(order).sort(order, nulls_last=True)
    )


def _check_dead_letters(case: Case, work: Path, problems: list[str]) -> int:
    counts = []
    for query in ("pass", "win"):
        dead = _read(work / f"chk-{query}" / "dead_letter")
        counts.append(dead.height)
        if dead.height != case.dead:
            problems.append(f"{query}: {dead.height} dead letters, {case.dead} expected")
        if dead.height and not all(case.reason in r for r in dead.get_column("reason")):
            problems.append(f"{query}: dead-letter reasons lack {case.reason!r}: "
                            f"{dead.get_column('reason').to_list()[:3]}")
        if dead.height and case.check is not None:
            try:
                case.check(dead)
            except AssertionError as exc:
                problems.append(f"{query}: {exc}")
    return max(counts)


def expected_windows(case: Case) -> tuple[pl.DataFrame, int, int]:
    """Reference of the windowed query, batch by batch (one file per batch).

    Returns the emitted windows, the records in windows still open at the
    end, and the number of late records. The watermark in force for a batch
    is the maximum event time seen in earlier batches (ignoring times more
    than ``max_future_skew`` ahead of now) minus the delay; a record is late
    when its time is null or its window has ended at or before it.
    """
    skew = None if case.skew is None else parse_duration_ms(case.skew)
    now = int(time.time() * 1000)
    watermark: int | None = None
    live: list[pl.DataFrame] = []
    late = 0
    seen: set[int] = set()
    for file in case.files:
        batch = file.good
        if case.dedupe:  # the first record per event_id is kept (within="10m" covers all)
            batch = batch.filter(~pl.col("event_id").is_in(list(seen)))
            batch = batch.unique("event_id", keep="first", maintain_order=True)
        seen.update(batch.get_column("event_id").to_list())
        t = batch.get_column("event_time").dt.epoch("ms")
        ends = (t // WINDOW_MS + 1) * WINDOW_MS
        is_late = t.is_null() | ((ends <= watermark) if watermark is not None else False)
        late += int(is_late.sum())
        live.append(batch.filter(~is_late))
        counted = t.drop_nulls()
        if skew is not None:
            counted = counted.filter(counted <= now + skew)
        if counted.len():
            candidate = int(counted.max()) - DELAY_MS  # type: ignore[arg-type]
            watermark = candidate if watermark is None else max(watermark, candidate)
    rows = pl.concat(live)
    ws = (pl.col("event_time").dt.epoch("ms") // WINDOW_MS) * WINDOW_MS
    grouped = (
        rows.group_by(ws.alias("ws"), "card_id")
        .agg(pl.len().cast(pl.Int64).alias("n"), pl.col("amount").sum().alias("total"))
    )
    is_closed = pl.col("ws") + WINDOW_MS <= (watermark if watermark is not None else -(2**62))
    closed = grouped.filter(is_closed)
    open_n = int(grouped.filter(~is_closed).get_column("n").sum() or 0)
    dtype = SCHEMA["event_time"]
    emitted = closed.select(
        pl.from_epoch("ws", time_unit="ms").dt.replace_time_zone("UTC").cast(dtype)
        .alias("window_start"),
        pl.from_epoch(pl.col("ws") + WINDOW_MS, time_unit="ms").dt.replace_time_zone("UTC")
        .cast(dtype).alias("window_end"),
        "card_id", "n", "total",
    ).sort("window_start", "card_id")
    return emitted, open_n, late

