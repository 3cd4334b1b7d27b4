"""Orders enriched with the product price valid at order time (a temporal join).

Two streams: orders (``order_id``, ``product_id``, ``quantity``,
``order_time``) and a changelog of price changes (``product_id``,
``valid_from``, ``price``), e.g. CDC upserts landing in a Delta table. Each
order gets the price of its product in force at ``order_time`` — the latest
change with ``valid_from <= order_time`` — and ``amount = quantity * price``.

An order is emitted once the watermark (the minimum of the orders' and the
prices' watermarks) reaches its time: from then on no price change valid
before the order can still arrive, so the answer is final. Orders within the
watermark delay of the newest data wait for later data. Orders or price
changes at or before the watermark on arrival go to the late output.

Inputs: by default deterministic generated data held in memory (no services
needed; a restart regenerates the same rows). With ``--param orders=PATH
--param prices=PATH``, two Delta tables, e.g. those written by::

    python jobs/orders_enriched.py produce --orders lake/orders --prices lake/prices
    microbatch run jobs/orders_enriched.py --checkpoint chk/orders --trigger available-now \\
        --param output=out/orders_enriched --param orders=lake/orders --param prices=lake/prices

Params: ``output`` (required, a Parquet directory); ``late_output``
(``<output>-late``); ``orders``/``prices`` (Delta paths; default generated);
``rows`` (generated orders, ``20000``); ``products`` (``100``);
``max_records_per_batch`` (``5000``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

import numpy as np
import polars as pl

import microbatch as mb
from sinks.parquet import ParquetSink

START = datetime(2026, 1, 1, tzinfo=UTC)
"""Fixed event-time origin: the output does not depend on when the job runs."""
ORDER_EVERY_MS = 1_000
"""Generated orders arrive one per second of event time (with up to 20 s disorder)."""


def sample_orders(rows: int, products: int, seed: int = 7) -> pl.DataFrame:
    """``rows`` orders, one per second of event time, disordered by up to 20 s."""
    rng = np.random.default_rng(seed)
    i = np.arange(rows, dtype=np.int64)
    ms = i * ORDER_EVERY_MS - rng.integers(0, 20_000, rows)
    return pl.DataFrame(
        {
            "order_id": i,
            "product_id": rng.integers(0, products, rows),
            "quantity": rng.integers(1, 5, rows),
            "ms": np.maximum(ms, 0),
        }
    ).select(
        "order_id",
        "product_id",
        "quantity",
        order_time=(pl.lit(START) + pl.duration(milliseconds="ms")).dt.cast_time_unit("ms"),
    )


def sample_prices(rows: int, products: int, seed: int = 8) -> pl.DataFrame:
    """A price for every product at the start, then one change a minute of event
    time for a random product, up to a little after the last order."""
    rng = np.random.default_rng(seed)
    span_ms = rows * ORDER_EVERY_MS + 60_000
    changes = span_ms // 60_000
    first = pl.DataFrame(
        {"product_id": np.arange(products, dtype=np.int64), "ms": np.zeros(products, np.int64)}
    )
    later = pl.DataFrame(
        {
            "product_id": rng.integers(0, products, changes),
            "ms": np.arange(1, changes + 1, dtype=np.int64) * 60_000,
        }
    )
    base = pl.concat([first, later])
    return base.select(
        "product_id",
        valid_from=(pl.lit(START) + pl.duration(milliseconds="ms")).dt.cast_time_unit("ms"),
        price=pl.Series(np.round(rng.uniform(1, 100, base.height), 2)).cast(pl.Decimal(18, 2)),
    )


def enrich(orders: mb.Stream, prices: mb.Stream) -> mb.Stream:
    """The query: orders as of their time against the price changelog."""
    return (
        orders.with_watermark("order_time", "30s")
        .join_asof_table(
            prices.with_watermark("valid_from", "0s"),
            on="product_id",
            time="order_time",
            dim_time="valid_from",
        )
        .with_columns(amount=pl.col("quantity") * pl.col("price"))
    )


@dataclass(frozen=True)
class Params:
    """The job's parameters (``--param NAME=VALUE``)."""

    output: Annotated[str, "Parquet output directory"]
    late_output: Annotated[str | None, "Parquet directory of late rows (<output>-late)"] = None
    orders: Annotated[str | None, "orders Delta table (none: generated)"] = None
    prices: Annotated[str | None, "prices Delta table (none: generated)"] = None
    rows: Annotated[int, "generated orders"] = 20_000
    products: Annotated[int, "generated products"] = 100
    max_records_per_batch: Annotated[int, "records (Delta: files) per batch"] = 5_000


def build(params: Params) -> mb.DataStreamWriter:
    """Orders x price changelog -> enriched orders in a Parquet directory."""
    cap = params.max_records_per_batch
    if params.orders and params.prices:
        orders = mb.read_delta(params.orders, max_files_per_batch=cap)
        prices = mb.read_delta(params.prices, max_files_per_batch=cap)
    else:
        orders = mb.read_memory(sample_orders(params.rows, params.products),
                                max_records_per_batch=cap)
        prices = mb.read_memory(
            sample_prices(params.rows, params.products), max_records_per_batch=max(1, cap // 20)
        )
    late = ParquetSink(params.late_output or f"{params.output}-late")
    return enrich(orders, prices).on_late(late).write_parquet(params.output)


def produce(argv: list[str]) -> None:
    """Write the sample inputs as Delta tables, in several versions each."""
    from deltalake import write_deltalake

    parser = argparse.ArgumentParser(prog="orders_enriched.py produce")
    parser.add_argument("--orders", required=True)
    parser.add_argument("--prices", required=True)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--products", type=int, default=100)
    parser.add_argument("--versions", type=int, default=10)
    args = parser.parse_args(argv)
    orders = sample_orders(args.rows, args.products)
    prices = sample_prices(args.rows, args.products)
    for part in range(args.versions):  # one Delta version per slice of event time
        for frame, path in ((orders, args.orders), (prices, args.prices)):
            size = -(-frame.height // args.versions)
            write_deltalake(path, frame.slice(part * size, size).to_arrow(), mode="append")
    print(f"wrote {orders.height} orders to {args.orders}, {prices.height} prices to {args.prices}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["produce"]:
        produce(sys.argv[2:])
    else:
        print(__doc__)
