"""Delta sink benchmark: small files, compaction, and per-batch commit latency.

1. **Small files.** 1,000 small batches (100 rows each) appended through
   :class:`sinks.delta.DeltaSink`, once without compaction and once with
   ``optimize_every=100``. Reported: active data files, files on disk
   (compaction leaves the replaced files until ``vacuum``), the time to read
   the whole table (``pl.read_delta``, median of 5), the total write time,
   and the files left on disk after ``vacuum(retention_hours=0)``.
2. **Commit latency.** One Delta commit per batch, append and update
   (MERGE into a table that already holds the previous batches' keys),
   for 1k-row and 100k-row batches: median and p95 wall time of
   ``add_batch`` (conversion, transaction check, write, commit).

The sink is driven directly (no engine), so the numbers are the sink's
own cost; the engine's per-batch cost is measured by ``fixed_cost.py``.

Run: ``.venv/bin/python benchmarks/bench_delta.py [--batches 1000] [--quick]``.
"""

from __future__ import annotations

import argparse
import tempfile
from functools import partial
from pathlib import Path

import numpy as np
import polars as pl

from benchmarks.harness import dict_table, median, rate, repeat, timed
from sinks.base import SinkContext
from sinks.delta import DeltaSink


def batch(i: int, rows: int, *, keys: int | None = None, seed: int = 0) -> pl.DataFrame:
    """``rows`` card transactions; with ``keys``, card ids cycle over that many keys."""
    rng = np.random.default_rng(seed + i)
    ids = np.arange(i * rows, (i + 1) * rows, dtype=np.int64)
    return pl.DataFrame(
        {
            "event_id": ids,
            "card_id": ids % keys if keys else rng.integers(0, 10_000, rows),
            "amount": rng.random(rows) * 100,
            "merchant": [f"m{k}" for k in rng.integers(0, 50, rows)],
            "event_time": pl.Series(1_767_225_600_000 + ids * 10).cast(pl.Datetime("ms", "UTC")),
        }
    )


def opened(path: Path, mode: str = "append", keys: tuple[str, ...] = (),
           **options: object) -> DeltaSink:
    sink = DeltaSink(path, **options)  # type: ignore[arg-type]
    sink.open(SinkContext(query_id="bench", output_mode=mode, key_columns=keys))  # type: ignore[arg-type]
    return sink


def _data_files(path: Path) -> int:
    return sum(1 for p in path.rglob("*.parquet") if "_delta_log" not in p.parts)


def read_ms(path: Path, reps: int = 5) -> tuple[float, int]:
    height = 0

    def read() -> None:
        nonlocal height
        height = pl.read_delta(str(path)).height

    return median(repeat(read, reps)) * 1000, height


def small_files(root: Path, batches: int, optimize_every: int | None) -> dict[str, object]:
    from deltalake import DeltaTable

    path = root / f"small-{optimize_every}"
    sink = opened(path, optimize_every=optimize_every)
    write_s = timed(lambda: [sink.add_batch(i, batch(i, 100)) for i in range(batches)])
    table = DeltaTable(str(path))
    active = len(table.file_uris())
    on_disk = _data_files(path)
    read, height = read_ms(path)
    table.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)
    after_vacuum = _data_files(path)
    return {
        "optimize_every": optimize_every or "-",
        "rows": height,
        "active files": active,
        "files on disk": on_disk,
        "read ms": round(read, 1),
        "files after vacuum": after_vacuum,
        "write s (total)": round(write_s, 1),
        "ms/batch": round(write_s * 1000 / batches, 1),
    }


def latency(root: Path, rows: int, batches: int, mode: str) -> dict[str, object]:
    path = root / f"latency-{mode}-{rows}"
    keys = ("card_id",) if mode == "update" else ()
    sink = opened(path, mode=mode, keys=keys)
    frames = [batch(i, rows, keys=rows if mode == "update" else None) for i in range(batches + 1)]
    if mode == "update":  # the key space is the same every batch: each MERGE updates every row
        frames = [f.unique("card_id", keep="last") for f in frames]
    sink.add_batch(0, frames[0])  # creates the table; not timed
    times = sorted(timed(partial(sink.add_batch, i, frames[i])) * 1000
                   for i in range(1, batches + 1))
    return {
        "mode": mode,
        "rows/batch": f"{rows:,}",
        "batches": batches,
        "median ms": round(median(times), 1),
        "p95 ms": round(times[min(len(times) - 1, int(len(times) * 0.95))], 1),
        "rows/s": f"{rate(rows, median(times) / 1000):,.0f}",
    }


def table(rows: list[dict[str, object]]) -> str:
    """The rows as a Markdown table (:func:`benchmarks.harness.dict_table`)."""
    return "\n".join(dict_table(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=1000, help="small batches to write")
    parser.add_argument("--quick", action="store_true", help="fewer batches everywhere")
    args = parser.parse_args()
    batches = 100 if args.quick else args.batches
    with tempfile.TemporaryDirectory(prefix="bench-delta-") as tmp:
        root = Path(tmp)
        print(f"small files: {batches} batches of 100 rows")
        print(table([small_files(root, batches, None),
                     small_files(root, batches, max(1, batches // 10))]))
        print()
        print("commit latency per batch (DeltaSink.add_batch)")
        n_small, n_big = (20, 5) if args.quick else (100, 20)
        print(table([
            latency(root, 1_000, n_small, "append"),
            latency(root, 100_000, n_big, "append"),
            latency(root, 1_000, n_small, "update"),
            latency(root, 100_000, n_big, "update"),
        ]))


if __name__ == "__main__":
    main()
