"""Nexmark events on disk: one Parquet directory per stream (``person/``, ``auction/``,
``bid/``), cached under ``benchmarks/.data``.

File ``i`` of every stream holds the events numbered ``[i * k, (i + 1) * k)`` (``k``
= ``events_per_file``), so reading one file per batch from each directory gives
batches that cover the same stretch of event time on every stream. The reference
generates one stream with an ``event_type`` tag and three views filter it
(nexmark/nexmark's ``ddl_gen.sql``, ``ddl_views.sql``); splitting it on disk is
the same three views, computed once: this engine's joins take two sources, and a
bid-only query reads only the bids (the table says so beside its rates, which
count every event of the run, as Nexmark's do).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import polars as pl

from benchmarks.nexmark.generator import STREAMS, NexmarkConfig, NexmarkGenerator

ROOT = Path(__file__).resolve().parent.parent / ".data"
_MARKER = "_nexmark.json"


@dataclass(frozen=True)
class NexmarkDataset:
    """``events`` generated events in files of ``events_per_file`` events per stream."""

    events: int
    events_per_file: int
    config: NexmarkConfig = field(default_factory=NexmarkConfig)
    root: Path = ROOT

    @property
    def files(self) -> int:
        return -(-self.events // self.events_per_file)

    @property
    def path(self) -> Path:
        c = self.config
        return self.root / (f"nexmark-{self.events}e-{self.events_per_file}f-r{c.rate}"
                            f"-s{c.seed}{'-quirk' if c.bidder_id_quirk else ''}")

    def stream_dir(self, stream: str) -> Path:
        return self.path / stream

    def ensure(self) -> NexmarkDataset:
        """Write the files unless a complete copy is there already; returns self."""
        marker = self.path / _MARKER
        spec = self.spec()
        if marker.exists() and json.loads(marker.read_text()) == spec:
            return self
        shutil.rmtree(self.path, ignore_errors=True)
        gen = NexmarkGenerator(self.config)
        for stream in STREAMS:
            self.stream_dir(stream).mkdir(parents=True)
        mtime = time.time() - self.files - 10
        for i in range(self.files):
            lo = i * self.events_per_file
            frames = gen.events(lo, min(lo + self.events_per_file, self.events))
            for stream in STREAMS:
                out = self.stream_dir(stream) / f"part-{i:05d}.parquet"
                frames[stream].write_parquet(out)
                # strictly increasing mtimes: the file source admits files in that order
                os.utime(out, (mtime + i, mtime + i))
        marker.write_text(json.dumps(spec))
        return self

    def spec(self) -> dict[str, object]:
        """What the marker file records (and the Spark worker reads: it imports
        neither the engine nor the generator)."""
        return {"events": self.events, "events_per_file": self.events_per_file,
                "config": asdict(self.config),
                "person_reach_ms": list(self.config.person_reach_ms())}

    @classmethod
    def load(cls, path: Path) -> NexmarkDataset:
        """The dataset written at ``path`` (by :meth:`ensure`)."""
        spec = json.loads((path / _MARKER).read_text())
        ds = cls(int(spec["events"]), int(spec["events_per_file"]),
                 NexmarkConfig(**spec["config"]), root=path.parent)
        if ds.path != path:
            raise ValueError(f"{path} does not hold the dataset its marker describes")
        return ds

    def scan(self, stream: str) -> pl.LazyFrame:
        """Every event of ``stream``, in event order."""
        return pl.scan_parquet(sorted(self.stream_dir(stream).glob("part-*.parquet")))

    def schema(self, stream: str) -> pl.Schema:
        return self.scan(stream).collect_schema()
