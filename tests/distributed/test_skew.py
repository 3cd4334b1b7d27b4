"""Rows per shard, their skew and the hot-key alarm of a query on Ray workers.

A batch whose rows pile into one shard (one card holding most payments) logs a
WARNING naming that card, records it in the progress record's ``executor``
and raises the ``shard_skew`` alarm of ``microbatch status``; uniform keys do
not; with the map-side combiner the hot card costs one partial row per worker,
so the shards' operators see no skew (the rows routed still show it).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import microbatch as mb
from microbatch.observability.status import status_document
from microbatch.observability.status_view import render_status

pytestmark = pytest.mark.slow

ROWS, BATCH = 6_000, 2_000


def _payments(hot_share: float) -> pl.DataFrame:
    rng = np.random.default_rng(5)
    cards = rng.integers(0, 1_000, ROWS)
    cards[rng.random(ROWS) < hot_share] = 7
    return pl.DataFrame({"card_id": cards, "cents": rng.integers(1, 10_000, ROWS)})


def _run(rows: pl.DataFrame, chk: Path, ray_cluster: str, *, combine: bool) -> list[dict]:
    src = mb.read_memory(rows, max_records_per_batch=BATCH)
    query = (
        src.group_by("card_id").agg(pl.len().alias("n"), pl.col("cents").sum().alias("cents"))
        .write_memory(f"skew-{chk.name}", output_mode="update")
        .start(chk, trigger="available-now", executor=mb.RayExecutor(
            workers=2, address=ray_cluster, shards=4, combine=combine, skew_min_rows=500))
    )
    assert query.await_termination(300)
    assert query.exception is None
    return [r["executor"] for r in query.recent_progress if r["input_rows"]]


def test_a_hot_key_raises_the_alarm_naming_it(
    ray_cluster: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="microbatch.distributed"):
        profiles = _run(_payments(0.8), tmp_path / "hot", ray_cluster, combine=False)
    assert len(profiles) == ROWS // BATCH
    for p in profiles:
        assert sum(p["shard_rows"]) == BATCH
        assert p["skew"] > 3  # 80% of the rows in one of 4 shards: ~3.3x the mean
        assert p["hot_key"] == {"card_id": 7}
        assert "card_id=7" in p["skew_alarm"]
    warned = [r.getMessage() for r in caplog.records if "mean rows per shard" in r.getMessage()]
    assert len(warned) == len(profiles)
    assert all("card_id=7" in m for m in warned)
    doc = status_document(tmp_path / "hot")
    assert [a["code"] for a in doc["alarms"]] == ["shard_skew"]
    assert doc["shard_skew"]["hot_key"] == {"card_id": 7}
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(render_status(doc))
    assert "hot key card_id=7" in console.export_text()


def test_uniform_keys_raise_no_alarm(
    ray_cluster: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="microbatch.distributed"):
        profiles = _run(_payments(0.0), tmp_path / "flat", ray_cluster, combine=False)
    assert all(p["skew"] < 1.5 and p["skew_alarm"] is None for p in profiles)
    assert not [r for r in caplog.records if "mean rows per shard" in r.getMessage()]
    assert status_document(tmp_path / "flat")["alarms"] == []


def test_the_combiner_takes_the_hot_key_off_its_shard(ray_cluster: str, tmp_path: Path) -> None:
    profiles = _run(_payments(0.8), tmp_path / "combined", ray_cluster, combine=True)
    for p in profiles:
        assert p["combined"]
        routed = p["routed_rows"]
        assert max(routed) / (sum(routed) / len(routed)) > 3  # the input is as skewed
        # ...but the hot card reaches its shard as one partial row per worker
        assert p["skew"] < 1.5, p["shard_rows"]
        assert p["skew_alarm"] is None
