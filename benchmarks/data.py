"""Benchmark input data: generated once with the engine's generator, cached on disk.

A dataset is ``files`` Parquet files of ``rows // files`` rows each, written
in arrival order (``part-00000.parquet`` first) with strictly increasing
modification times, so ``mb.read_files`` admits them in that order. File
``i`` holds ``event_id`` ``[i * rows_per_file, (i + 1) * rows_per_file)``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

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


def ensure(ds: Dataset) -> Path:
    """Generate ``ds`` unless a complete copy is cached; returns its directory."""
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
