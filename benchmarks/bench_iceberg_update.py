"""Iceberg sink ``update`` mode on a partitioned table, merge key outside the spec.

Partitioned by ``["day(ts)", "bucket(16, card_id)"]`` (``--unpartitioned``:
no spec), merge key ``id`` (its ranges prune few files): each batch upserts
about 1,000 ids, 500 new and 500 earlier ones drawn at random. Reported: the
median ``IcebergSink.add_batch`` of batches 5 to ``--batches - 1`` and the
table's data files at the end (docs/iceberg.md, Measured)::

    python -m benchmarks.bench_iceberg_update [--unpartitioned] [--batches 25]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np
import polars as pl

from sinks.base import SinkContext
from sinks.iceberg import IcebergSink
from sinks.iceberg_catalog import load_iceberg_table, resolve_catalog


def frame(i: int, rng: np.random.Generator) -> pl.DataFrame:
    """Batch ``i``: ids ``500 i .. 500 i + 499`` and 500 earlier ids."""
    new = np.arange(i * 500, i * 500 + 500)
    old = rng.choice(i * 500, 500, replace=False) if i else np.arange(500, 1000)
    ids = np.unique(np.concatenate([new, old]))
    n = len(ids)
    start_ms = 1_767_225_600_000
    return pl.DataFrame({
        "id": ids, "card_id": rng.integers(0, 10_000, n), "amount": rng.random(n),
        "ts": pl.Series(start_ms + rng.integers(0, 2 * 86_400_000, n))
        .cast(pl.Datetime("ms", "UTC")),
    })


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unpartitioned", action="store_true")
    parser.add_argument("--batches", type=int, default=25)
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    spec = None if args.unpartitioned else ["day(ts)", "bucket(16, card_id)"]
    with tempfile.TemporaryDirectory(prefix="bench-iceberg-update-") as tmp:
        catalog = f"sqlite:///{tmp}/iceberg.db"
        sink = IcebergSink("bench.t", catalog=catalog,
                           partition_by=spec, merge_keys="id")
        sink.open(SinkContext(query_id="bench", output_mode="update", key_columns=()))
        times = []
        for i in range(args.batches):
            batch = frame(i, rng)
            started = time.perf_counter()
            sink.add_batch(i, batch)
            times.append(time.perf_counter() - started)
        table = load_iceberg_table(resolve_catalog(catalog), "bench.t")
        assert table is not None
        files = len(list(table.scan().plan_files()))
    print(f"partition_by={spec}: median {statistics.median(times[5:]) * 1000:.1f} ms per "
          f"batch (batches 5-{args.batches - 1}), {files} data files")


if __name__ == "__main__":
    main()
