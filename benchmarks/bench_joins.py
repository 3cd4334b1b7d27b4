"""Join benchmark: streaming joins against the one-shot Polars join, same run.

- **interval**: N clicks x N payments on ``user``, a payment matching the
  clicks of its user in the 10 minutes before it
  (``clicks.join_interval(payments, lower="0s", upper="10m")``), both inputs
  disordered by up to 30 s, watermark delay 1 min, fed in batches of
  ``--batch`` rows per input. Reported: input events/s (both inputs), the
  one-shot Polars ``join`` + interval ``filter`` over all rows (the limit),
  the output rows (asserted equal), and the state rows per side at steady
  state (median and max over the second half of the run).
- **temporal**: N order events enriched with the product price valid at the
  order's time (``join_asof_table``) from a changelog of price updates;
  against the one-shot ``join_asof``.

Run: ``.venv/bin/python benchmarks/bench_joins.py [--n 1000000] [--batch 100000]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from datetime import UTC, datetime
from typing import Any

import numpy as np
import polars as pl

import microbatch as mb
from benchmarks.harness import markdown_table, ratio, timed_value
from sinks.base import BatchContext, Sink

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TS = pl.Datetime("ms", "UTC")


class CountSink(Sink):
    """Counts rows (the cheapest possible sink: the benchmark measures the join)."""

    def __init__(self) -> None:
        self.rows = 0
        self.batches: set[int] = set()

    def is_written(self, batch: BatchContext) -> bool:
        return batch.batch_id in self.batches

    def write(self, batch: BatchContext, df: pl.DataFrame) -> None:
        self.batches.add(batch.batch_id)
        self.rows += df.height


def events(n: int, *, users: int, span_ms: int, seed: int, disorder_ms: int) -> pl.DataFrame:
    """``n`` rows over ``span_ms`` of event time, uniform users, bounded disorder."""
    rng = np.random.default_rng(seed)
    i = np.arange(n, dtype=np.int64)
    ms = i * span_ms // n - rng.integers(0, max(disorder_ms, 1), n)
    return pl.DataFrame({"id": i, "user": rng.integers(0, users, n), "ms": ms}).select(
        "id",
        "user",
        ts=(pl.lit(T0) + pl.duration(milliseconds=pl.col("ms"))).dt.cast_time_unit("ms"),
    )


def run_query(stream: mb.Stream, sink: CountSink) -> tuple[float, list[dict[str, Any]]]:
    def run() -> mb.StreamingQuery:
        query = stream.write_to(sink).start(
            checkpoint=tempfile.mkdtemp(prefix="bench-joins-"), trigger="available-now"
        )
        query.await_termination()
        return query

    elapsed, query = timed_value(run)
    return elapsed, list(query.recent_progress)


def one_shot_bucketed(clicks: pl.DataFrame, pays: pl.DataFrame) -> int:
    """The smarter one-shot: equi-join on (user, 10-minute bucket) for the bucket
    and the next one, then the interval filter (no per-user cross product)."""
    bucket = pl.col("ts").dt.epoch("ms") // 600_000
    c = clicks.with_columns(bucket.alias("b"))
    p = pays.with_columns(bucket.alias("b"))
    rows = 0
    for shift in (0, 1):
        rows += (
            c.join(p.with_columns(pl.col("b") - shift), on=["user", "b"], suffix="_pay")
            .filter(
                (pl.col("ts_pay") >= pl.col("ts"))
                & (pl.col("ts_pay") <= pl.col("ts") + pl.duration(minutes=10))
            )
            .height
        )
    return rows


def bench_interval(n: int, batch: int, users: int) -> dict[str, Any]:
    span_ms = 4 * 3_600_000  # 4 hours of event time
    clicks = events(n, users=users, span_ms=span_ms, seed=1, disorder_ms=30_000)
    pays = events(n, users=users, span_ms=span_ms, seed=2, disorder_ms=30_000)
    polars_s, oracle = timed_value(lambda: (
        clicks.join(pays, on="user", suffix="_pay")
        .filter(
            (pl.col("ts_pay") >= pl.col("ts"))
            & (pl.col("ts_pay") <= pl.col("ts") + pl.duration(minutes=10))
        )
        .height
    ))
    bucketed_s, bucketed = timed_value(lambda: one_shot_bucketed(clicks, pays))
    assert bucketed == oracle, (bucketed, oracle)
    left = mb.read_memory(clicks, max_records_per_batch=batch).with_watermark("ts", "1m")
    right = mb.read_memory(pays, max_records_per_batch=batch).with_watermark("ts", "1m")
    joined = left.join_interval(
        right, on="user", left_time="ts", right_time="ts", lower="0s", upper="10m"
    )
    sink = CountSink()
    elapsed, progress = run_query(joined, sink)
    assert sink.rows == oracle, (sink.rows, oracle)
    states = [p["state"]["join-0"] for p in progress if p["state"].get("join-0")]
    steady = states[len(states) // 2 :]
    return {
        "n": n,
        "stream_s": elapsed,
        "events_per_s": 2 * n / elapsed,
        "polars_s": polars_s,
        "polars_events_per_s": 2 * n / polars_s,
        "bucketed_s": bucketed_s,
        "bucketed_events_per_s": 2 * n / bucketed_s,
        "output_rows": sink.rows,
        "batches": len(progress),
        "left_rows_median": statistics.median(s["left_rows"] for s in steady),
        "left_rows_max": max(s["left_rows"] for s in steady),
        "right_rows_median": statistics.median(s["right_rows"] for s in steady),
        "right_rows_max": max(s["right_rows"] for s in steady),
        "bytes_max": max(s["bytes"] for s in steady),
        # rows per ms x (interval + delay + disorder + the event time one batch spans)
        "rate_x_retention": n / span_ms * (10 * 60_000 + 60_000 + 30_000) + batch,
    }


def bench_temporal(n: int, batch: int, products: int, updates: int) -> dict[str, Any]:
    span_ms = 4 * 3_600_000
    orders = events(n, users=products, span_ms=span_ms, seed=3, disorder_ms=10_000).rename(
        {"user": "product"}
    )
    u = pl.int_range(0, updates, eager=True, dtype=pl.Int64)
    prices = pl.DataFrame({"u": u}).select(
        product=pl.col("u") % products,
        valid_from=(
            pl.lit(T0)
            + pl.duration(
                milliseconds=(pl.col("u") // products) * span_ms * products // updates - 60_000
            )
        ).dt.cast_time_unit("ms"),
        price=(pl.col("u") * 37 % 10_000) / 100,
    )
    polars_s, oracle = timed_value(lambda: orders.sort("ts").join_asof(
        prices.sort("valid_from"),
        left_on="ts",
        right_on="valid_from",
        by="product",
        check_sortedness=False,
    ))
    per_batch = max(1, updates * batch // n)
    left = mb.read_memory(orders, max_records_per_batch=batch).with_watermark("ts", "30s")
    right = mb.read_memory(prices, max_records_per_batch=per_batch).with_watermark(
        "valid_from", "0s"
    )
    enriched = left.join_asof_table(right, on="product", time="ts", dim_time="valid_from")
    sink = CountSink()
    elapsed, progress = run_query(enriched, sink)
    final_wm = progress[-1]["watermark_ms"]
    final = oracle.filter(pl.col("ts").dt.epoch("ms") <= final_wm).height
    assert sink.rows == final, (sink.rows, final)  # every order the watermark reached
    states = [p["state"]["join-0"] for p in progress if p["state"].get("join-0")]
    steady = states[len(states) // 2 :]
    return {
        "n": n,
        "updates": updates,
        "stream_s": elapsed,
        "events_per_s": n / elapsed,
        "polars_s": polars_s,
        "polars_events_per_s": n / polars_s,
        "emitted": sink.rows,
        "oracle_rows": oracle.height,
        "batches": len(progress),
        "waiting_max": max(s["events_waiting"] for s in steady),
        "versions_max": max(s["dimension_versions"] for s in steady),
    }


def _table(r: dict[str, Any], runs: list[tuple[str, float, float, str]]) -> list[str]:
    """Seconds, events/s and the ratio to the (first) one-shot Polars rate, per run."""
    return markdown_table(
        ("run", "s", "events/s", "vs one-shot", "note"),
        [(name, f"{secs:.2f}", f"{eps:,.0f}",
          f"{ratio(eps, r['polars_events_per_s']):.2f}", note)
         for name, secs, eps, note in runs],
        align="lrrrl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="rows per input")
    parser.add_argument("--batch", type=int, default=100_000, help="rows per input per batch")
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--products", type=int, default=10_000)
    parser.add_argument("--updates", type=int, default=100_000, help="price versions")
    parser.add_argument("--only", choices=["interval", "temporal"], default=None)
    args = parser.parse_args()
    if args.only in (None, "interval"):
        r = bench_interval(args.n, args.batch, args.users)
        print(
            f"interval join, {r['n']:,} clicks x {r['n']:,} payments, "
            f"batches of {args.batch:,} per input ({r['batches']} batches)"
        )
        print("\n".join(_table(r, [
            ("streaming", r["stream_s"], r["events_per_s"], ""),
            ("one-shot Polars", r["polars_s"], r["polars_events_per_s"], "join on user + filter"),
            ("one-shot Polars", r["bucketed_s"], r["bucketed_events_per_s"],
             "join on user and 10-minute bucket + filter"),
        ])))
        print(f"  output rows {r['output_rows']:,} (equal to one-shot)")
        print(
            f"  state rows at steady state: left median {r['left_rows_median']:,.0f} "
            f"max {r['left_rows_max']:,}; right median {r['right_rows_median']:,.0f} "
            f"max {r['right_rows_max']:,}; rate x (interval + delay + disorder + batch span) = "
            f"{r['rate_x_retention']:,.0f}; max bytes {r['bytes_max']:,}"
        )
    if args.only in (None, "temporal"):
        r = bench_temporal(args.n, args.batch, args.products, args.updates)
        print(
            f"temporal join, {r['n']:,} orders against {r['updates']:,} price versions "
            f"({r['batches']} batches)"
        )
        print("\n".join(_table(r, [
            ("streaming", r["stream_s"], r["events_per_s"],
             f"{r['emitted']:,} emitted: the one-shot rows the final watermark reached"),
            ("one-shot Polars", r["polars_s"], r["polars_events_per_s"], "join_asof"),
        ])))
        print(
            f"  state at steady state: waiting events max {r['waiting_max']:,}, "
            f"versions max {r['versions_max']:,}"
        )


if __name__ == "__main__":
    main()
