"""Benchmark input data: generated once with the engine's generator, cached on disk.

A dataset is ``files`` Parquet files of ``rows // files`` rows each, written
in arrival order (``part-00000.parquet`` first) with strictly increasing
modification times, so ``mb.read_files`` admits them in that order. File
``i`` holds ``event_id`` ``[i * rows_per_file, (i + 1) * rows_per_file)``.

:func:`from_directory` describes someone else's directory of Parquet files
with the generator's columns the same way (:class:`DirectoryDataset`), read
in file-name order; :func:`batch_frames` numbers any dataset's rows by the
batch they fall in.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import polars as pl

ROOT = Path(__file__).resolve().parent / ".data"
"""Cache of generated datasets and scratch space of the runs (git-ignored)."""

START = "2026-01-01T00:00:00+00:00"
_MARKER = "_dataset.json"


@dataclass(frozen=True)
class Dataset:
    """A deterministic set of Parquet files of generator events."""

    rows: int
    files: int
    seed: int = 7
    cards: int = 100_000
    zipf: float = 1.1
    max_delay: str = "5s"
    late_fraction: float = 0.005

    @property
    def rows_per_file(self) -> int:
        return self.rows // self.files

    @property
    def path(self) -> Path:
        return ROOT / f"events-{self.rows}r-{self.files}f-s{self.seed}"

    def file_paths(self) -> list[Path]:
        """The files in arrival order."""
        return [self.path / f"part-{i:05d}.parquet" for i in range(self.files)]


class EventFiles(Protocol):
    """What the benchmarks need of a dataset: its files in arrival order and counts."""

    @property
    def rows(self) -> int: ...

    @property
    def files(self) -> int: ...

    @property
    def rows_per_file(self) -> int: ...

    @property
    def path(self) -> Path: ...

    def file_paths(self) -> list[Path]: ...


@dataclass(frozen=True)
class DirectoryDataset:
    """Parquet files of generator events in a directory of someone else's, in name order.

    ``rows_per_file`` is the mean (``rows // files``): batches are cut by files, so
    files of uneven size make batches of uneven size, as with any file source.
    """

    path: Path
    names: tuple[str, ...]
    rows: int

    @property
    def files(self) -> int:
        return len(self.names)

    @property
    def rows_per_file(self) -> int:
        return self.rows // self.files

    def file_paths(self) -> list[Path]:
        """The files in arrival order (their names' order)."""
        return [self.path / name for name in self.names]


EVENTS = Dataset(rows=10_000_000, files=100)
EVENTS_QUICK = Dataset(rows=1_000_000, files=20)
TINY = Dataset(rows=300_000, files=300)
TINY_QUICK = Dataset(rows=100_000, files=100)


def events(quick: bool) -> Dataset:
    """The 10M-event set (1M with ``quick``)."""
    return EVENTS_QUICK if quick else EVENTS


def tiny(quick: bool) -> Dataset:
    """Files of 1,000 rows: 300 (100 with ``quick``)."""
    return TINY_QUICK if quick else TINY


def ensure(ds: EventFiles) -> Path:
    """Generate ``ds`` unless a complete copy is cached; returns its directory (a
    :class:`DirectoryDataset` is there already)."""
    if not isinstance(ds, Dataset):
        return ds.path
    marker = ds.path / _MARKER
    if marker.exists() and json.loads(marker.read_text()) == asdict(ds):
        return ds.path
    from microbatch.sources.generator import GeneratorSource

    t0 = time.perf_counter()
    print(f"generating {ds.rows:,} rows into {ds.files} files at {ds.path} ...", flush=True)
    tmp = ds.path.with_name(ds.path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    src = GeneratorSource(
        rows_per_second=None, total_rows=ds.rows, cards=ds.cards, zipf=ds.zipf,
        max_delay=ds.max_delay, late_fraction=ds.late_fraction, seed=ds.seed, start=START,
    )
    origin = src.initial_offset()
    first_mtime = time.time() - ds.files - 60.0
    for i, final in enumerate(ds.file_paths()):
        lo, hi = i * ds.rows_per_file, (i + 1) * ds.rows_per_file
        frame = src.read({**origin, "rows": lo}, {**origin, "rows": hi}).data
        target = tmp / final.name
        frame.write_parquet(target)
        os.utime(target, (first_mtime + i, first_mtime + i))
    (tmp / _MARKER).write_text(json.dumps(asdict(ds)))
    shutil.rmtree(ds.path, ignore_errors=True)
    tmp.rename(ds.path)
    print(f"  done in {time.perf_counter() - t0:.1f} s", flush=True)
    return ds.path


# --------------------------------------------------------------------------- external data

REQUIRED_COLUMNS = {"event_id": pl.Int64(), "card_id": pl.Int64(), "merchant": pl.String(),
                    "amount": pl.Float64()}
"""The generator's columns (besides ``event_time``) a directory of events must have."""
EVENT_TIME_UNITS = ("ms", "us")
"""Units of ``event_time`` every engine reads (Spark cannot read nanosecond timestamps)."""
STAGED = ROOT / "staged"
"""Copies of external directories whose modification times were not in name order."""


def _data_files(path: Path) -> list[Path]:
    """The Parquet files a file source admits from ``path``, in name order."""
    return sorted((p for p in path.glob("*.parquet")
                   if p.is_file() and not p.name.startswith((".", "_"))), key=lambda p: p.name)


def _schema_problems(file: Path) -> list[str]:
    """Why ``file`` lacks the generator's columns (empty when it has them)."""
    schema = pl.read_parquet_schema(file)
    problems = [f"{name}: {schema.get(name, 'missing')} (want {dtype})"
                for name, dtype in REQUIRED_COLUMNS.items() if schema.get(name) != dtype]
    time_type = schema.get("event_time")
    if not (isinstance(time_type, pl.Datetime) and time_type.time_unit in EVENT_TIME_UNITS
            and time_type.time_zone == "UTC"):
        problems.append(f"event_time: {time_type or 'missing'} "
                        "(want Datetime in ms or us, time zone UTC)")
    return problems


@functools.cache
def from_directory(path: Path) -> DirectoryDataset:
    """Describe ``path``'s Parquet files (name order; row counts from their metadata).

    Raises ValueError when there are none or one lacks the generator's columns
    (``event_id``, ``card_id`` int64, ``merchant`` string, ``amount`` float64,
    ``event_time`` datetime in UTC).
    """
    path = path.resolve()
    files = _data_files(path)
    if not files:
        raise ValueError(f"no Parquet files (*.parquet) in {path}")
    for file in files:
        problems = _schema_problems(file)
        if problems:
            raise ValueError(f"{file} lacks the generator's columns: {'; '.join(problems)}")
    rows = sum(pl.scan_parquet(file).select(pl.len()).collect().item() for file in files)
    return DirectoryDataset(path, tuple(f.name for f in files), rows)


def in_name_order(ds: EventFiles) -> bool:
    """Whether the files' modification times increase strictly in name order: the file
    sources of this engine and of Spark admit files in modification-time order."""
    mtimes = [p.stat().st_mtime_ns for p in ds.file_paths()]
    return all(a < b for a, b in itertools.pairwise(mtimes))


def staged_in_name_order(ds: DirectoryDataset) -> DirectoryDataset:
    """``ds`` itself when its files' modification times follow their names, else a
    copy under :data:`STAGED` whose do (made once per version of the files)."""
    if in_name_order(ds):
        return ds
    key = hashlib.sha256(str(ds.path).encode())
    for p in ds.file_paths():
        st = p.stat()
        key.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    target = STAGED / f"{ds.path.name}-{key.hexdigest()[:12]}"
    if not (target / _MARKER).exists():
        print(f"copying {ds.files} files of {ds.path} to {target}, with modification times "
              "in name order ...", flush=True)
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        first_mtime = time.time() - ds.files - 60.0
        for i, source in enumerate(ds.file_paths()):
            shutil.copyfile(source, tmp / source.name)
            os.utime(tmp / source.name, (first_mtime + i, first_mtime + i))
        (tmp / _MARKER).write_text(json.dumps({"source": str(ds.path)}))
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return from_directory(target)


def batch_frames(ds: EventFiles, files_per_batch: int) -> pl.LazyFrame:
    """All of ``ds``'s rows with ``batch``: the index of the batch of ``files_per_batch``
    files (in arrival order) that a file source reads each row in."""
    return pl.concat([pl.scan_parquet(p).with_columns(pl.lit(i // files_per_batch,
                                                             pl.Int64).alias("batch"))
                      for i, p in enumerate(ds.file_paths())])
