"""jobs/orders_enriched.py: runs without services and equals the one-shot join_asof."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import microbatch as mb
from microbatch.cli.jobfile import build_writer

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "orders_enriched.py"


def oracle(job, rows: int, products: int, watermark_ms: int) -> pl.DataFrame:
    orders = job.sample_orders(rows, products)
    prices = job.sample_prices(rows, products)
    ready = orders.filter(pl.col("order_time").dt.epoch("ms") <= watermark_ms)
    return (
        ready.sort("order_time")
        .join_asof(
            prices.sort("valid_from"),
            left_on="order_time",
            right_on="valid_from",
            by="product_id",
            check_sortedness=False,
        )
        .with_columns(amount=pl.col("quantity") * pl.col("price"))
    )


def test_orders_enriched_job_equals_join_asof(tmp_path: Path) -> None:
    params = {
        "output": str(tmp_path / "out"),
        "rows": "3000",
        "products": "20",
        "max_records_per_batch": "500",
    }
    writer = build_writer(JOB, params)
    query = writer.start(checkpoint=tmp_path / "chk", trigger="available-now")
    query.await_termination()
    got = mb.parquet_table(tmp_path / "out")
    watermark = query.last_progress["watermark_ms"]
    late = sum(p["late_rows"] for p in query.recent_progress)
    assert late == 0  # disorder (20 s) stays within the orders' delay (30 s)
    job = _load(JOB)
    want = oracle(job, 3000, 20, watermark)
    assert got.height == want.height > 2_500
    cols = want.columns
    assert got.select(cols).sort("order_id").equals(want.sort("order_id"))


def _load(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("orders_enriched_test", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a job's dataclass Params needs its module registered
    spec.loader.exec_module(module)
    return module


@pytest.mark.delta
def test_orders_enriched_job_on_delta_tables_via_cli(tmp_path: Path) -> None:
    orders, prices, out = tmp_path / "orders", tmp_path / "prices", tmp_path / "out"
    subprocess.run(
        [
            sys.executable,
            str(JOB),
            "produce",
            "--orders",
            str(orders),
            "--prices",
            str(prices),
            "--rows",
            "2000",
            "--products",
            "10",
            "--versions",
            "4",
        ],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    cli = Path(sys.executable).with_name("microbatch")
    subprocess.run(
        [
            str(cli),
            "run",
            str(JOB),
            "--checkpoint",
            str(tmp_path / "chk"),
            "--trigger",
            "available-now",
            "--param",
            f"output={out}",
            "--param",
            f"orders={orders}",
            "--param",
            f"prices={prices}",
            "--param",
            "max_records_per_batch=1",
        ],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    got = mb.parquet_table(out)
    assert got.height > 1_500
    assert got["price"].null_count() == 0
    assert got["order_id"].is_unique().all()
