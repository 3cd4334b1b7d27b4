"""Delta against Iceberg, sink and source, with each format's one-shot write and read.

1. **Sink: cost per batch.** :class:`sinks.delta.DeltaSink` and
   :class:`sinks.iceberg.IcebergSink` (SQL catalog on SQLite, local disk)
   driven directly, one commit per batch, append and update (a batch whose
   keys the table already holds: Delta MERGEs, Iceberg deletes and re-appends
   copy-on-write), 1k-row and 100k-row batches. Reported: median and p95 of
   ``add_batch`` and rows/s. The **limit** is the same rows written in one
   shot by the format's own library (``write_deltalake`` / PyIceberg
   ``append``, one commit), measured in the same run; ``of limit`` is the
   sink's rows/s over the limit's.
2. **Source: a streaming read of the table's history.** ``mb.read_delta`` and
   ``mb.read_iceberg`` over a table of ``--snapshots`` appends, available-now,
   ``max_files_per_batch=8``, into a count per card; against the one-shot
   Polars limit: ``pl.read_delta`` / PyIceberg's ``scan().to_polars()`` and
   the same group-by. Cold is the first run in the process; warm is the
   median of ``--reps`` repeats after it.

Run: ``.venv/bin/python -m benchmarks.bench_lakehouse [--quick]``
(``make bench-lakehouse``).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import polars as pl

import microbatch as mb
from benchmarks.bench_delta import batch
from benchmarks.harness import dict_table, median, rate, timed
from sinks.base import Sink, SinkContext
from sinks.delta import DeltaSink
from sinks.iceberg import IcebergSink


def catalog_of(root: Path) -> str:
    return f"sqlite:///{root}/iceberg.db"


def sink_of(fmt: str, root: Path, name: str) -> Sink:
    if fmt == "delta":
        return DeltaSink(root / name)
    return IcebergSink(f"bench.{name}", catalog=catalog_of(root))


def frames(rows: int, batches: int, mode: str) -> list[pl.DataFrame]:
    """The batches; in update mode each one holds the same keys (every row replaced)."""
    out = [batch(i, rows, keys=rows if mode == "update" else None) for i in range(batches + 1)]
    return [f.unique("card_id", keep="last") for f in out] if mode == "update" else out


def one_shot_write(fmt: str, root: Path, name: str, data: pl.DataFrame) -> float:
    """Seconds to write ``data`` as one commit with the format's own library."""
    if fmt == "delta":
        from deltalake import write_deltalake

        arrow = data.to_arrow()
        return timed(lambda: write_deltalake(str(root / name), arrow))
    from sinks.iceberg_catalog import resolve_catalog
    from sinks.iceberg_types import iceberg_arrow

    catalog = resolve_catalog(catalog_of(root))
    catalog.create_namespace_if_not_exists("bench")
    arrow = iceberg_arrow(data)
    table = catalog.create_table(("bench", name), schema=arrow.schema)
    return timed(lambda: table.append(arrow))


def sink_row(fmt: str, root: Path, rows: int, batches: int, mode: str) -> dict[str, object]:
    name = f"{mode}_{rows}"
    keys = ("card_id",) if mode == "update" else ()
    sink = sink_of(fmt, root, name)
    sink.open(SinkContext(query_id="bench", output_mode=mode,  # type: ignore[arg-type]
                          key_columns=keys))
    data = frames(rows, batches, mode)
    sink.add_batch(0, data[0])  # creates the table; not timed
    times = sorted(timed(partial(sink.add_batch, i, data[i])) * 1000
                   for i in range(1, batches + 1))
    limit_s = one_shot_write(fmt, root, f"limit_{name}", pl.concat(data[1:]))
    sink_rate = rate(rows, median(times) / 1000)
    limit_rate = rate(rows * batches, limit_s)
    return {
        "format": fmt,
        "mode": mode,
        "rows/batch": f"{rows:,}",
        "median ms": round(median(times), 1),
        "p95 ms": round(times[min(len(times) - 1, int(len(times) * 0.95))], 1),
        "rows/s": f"{sink_rate:,.0f}",
        "limit rows/s": f"{limit_rate:,.0f}",
        "of limit": round(sink_rate / limit_rate, 2),
    }


def history(fmt: str, root: Path, snapshots: int, rows: int) -> Callable[[], mb.Stream]:
    """A table of ``snapshots`` appends of ``rows`` rows; a function building its stream."""
    if fmt == "delta":
        from deltalake import write_deltalake

        path = str(root / "history")
        for i in range(snapshots):
            write_deltalake(path, batch(i, rows).to_arrow(), mode="append")
        return lambda: mb.read_delta(path, max_files_per_batch=8)
    from sinks.iceberg_catalog import resolve_catalog
    from sinks.iceberg_types import iceberg_arrow

    catalog = resolve_catalog(catalog_of(root))
    catalog.create_namespace_if_not_exists("bench")
    table = None
    for i in range(snapshots):
        arrow = iceberg_arrow(batch(i, rows))
        if table is None:
            table = catalog.create_table(("bench", "history"), schema=arrow.schema)
        table.append(arrow)
    return lambda: mb.read_iceberg("bench.history", catalog=catalog_of(root),
                                   max_files_per_batch=8)


def one_shot_read(fmt: str, root: Path) -> pl.DataFrame:
    if fmt == "delta":
        data = pl.read_delta(str(root / "history"))
    else:
        from sinks.iceberg_catalog import resolve_catalog

        data = resolve_catalog(catalog_of(root)).load_table("bench.history").scan().to_polars()
    return data.group_by("card_id").agg(pl.len())


def source_row(fmt: str, root: Path, snapshots: int, rows: int, reps: int) -> dict[str, object]:
    stream = history(fmt, root, snapshots, rows)
    runs: list[float] = []
    for rep in range(reps + 1):
        t0 = time.perf_counter()
        query = (stream().group_by("card_id").agg(pl.len())
                 .write_memory(f"bench_{fmt}_{rep}", output_mode="complete")
                 .start(root / f"chk-{fmt}-{rep}", trigger="available-now"))
        query.await_termination()
        runs.append(time.perf_counter() - t0)
        assert mb.table(f"bench_{fmt}_{rep}")["len"].sum() == snapshots * rows
    limits = [timed(partial(one_shot_read, fmt, root)) for _ in range(reps + 1)]
    total = snapshots * rows
    warm, limit = median(runs[1:]), median(limits[1:])
    return {
        "format": fmt,
        "snapshots": snapshots,
        "rows": f"{total:,}",
        "cold s": round(runs[0], 2),
        "warm s": round(warm, 2),
        "warm rows/s": f"{rate(total, warm):,.0f}",
        "limit rows/s": f"{rate(total, limit):,.0f}",
        "of limit": round(limit / warm, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches and snapshots")
    parser.add_argument("--snapshots", type=int, default=40)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    n_small, n_big = (10, 3) if args.quick else (50, 10)
    snapshots = 10 if args.quick else args.snapshots
    rows_sink: list[dict[str, object]] = []
    rows_source: list[dict[str, object]] = []
    for fmt in ("delta", "iceberg"):
        with tempfile.TemporaryDirectory(prefix=f"bench-{fmt}-") as tmp:
            root = Path(tmp)
            for mode in ("append", "update"):
                rows_sink.append(sink_row(fmt, root, 1_000, n_small, mode))
                rows_sink.append(sink_row(fmt, root, 100_000, n_big, mode))
        with tempfile.TemporaryDirectory(prefix=f"bench-{fmt}-src-") as tmp:
            rows_source.append(source_row(fmt, Path(tmp), snapshots, 25_000, args.reps))
    print("sink: one commit per batch (add_batch), limit = one commit of all the rows")
    print("\n".join(dict_table(rows_sink)))
    print()
    print("source: available-now over the table's history into a count per card "
          "(max_files_per_batch=8), limit = one-shot read + group_by")
    print("\n".join(dict_table(rows_source)))


if __name__ == "__main__":
    main()
