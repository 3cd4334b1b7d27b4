"""Read-ahead on a live source: the next batch adopts the range read in the
background (a live source's latest offsets move between the guess and the
plan, so a batch planned afresh never matched and every read was done twice)."""

from __future__ import annotations

import threading
import time

import polars as pl
import pytest

import microbatch as mb
from microbatch.engine.read_ahead import ReadAhead


def test_a_query_falling_behind_uses_every_read_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    started = []
    real_start = ReadAhead.start

    def counted(self: ReadAhead, ranges: dict) -> None:
        started.append(ranges)
        real_start(self, ranges)

    monkeypatch.setattr(ReadAhead, "start", counted)
    src = mb.read_memory(pl.DataFrame({"x": [0]}), max_records_per_batch=None)
    stop = threading.Event()
    fed = [1]
    lock = threading.Lock()

    def feed_once() -> None:
        with lock:
            if stop.is_set():
                return
            src.add(pl.DataFrame({"x": list(range(fed[0], fed[0] + 100))}))
            fed[0] += 100

    def feed() -> None:
        while not stop.is_set():
            feed_once()
            time.sleep(0.01)

    def arriving_during_execute(df: pl.DataFrame) -> pl.DataFrame:
        # NOTE: the topic moves on while a batch executes. Left to the feeder thread
        # alone, rows arrived mostly while the query thread slept in the sink (the
        # only long GIL release), so a busy suite could see no new rows at read-ahead
        # time in any of ten batches: the read-ahead was then rightly never started
        feed_once()
        return df

    seen: list[pl.DataFrame] = []

    def slow_sink(df: pl.DataFrame, batch_id: int) -> None:
        seen.append(df)
        time.sleep(0.3)  # three trigger intervals: the query falls behind

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    query = src.map_batches(arriving_during_execute).foreach_batch(slow_sink).start(
        trigger="100ms")
    while len(seen) < 10:
        time.sleep(0.05)
    with lock:
        stop.set()
        total = fed[0]
    feeder.join()
    query.process_all_available()
    query.stop()
    hits = query._exec.read_ahead.hits
    assert len(started) >= 2, "the query hardly read ahead: it did not fall behind"
    # every read-ahead but possibly the last one (abandoned at stop) was the next batch
    assert hits >= len(started) - 1, (hits, len(started))
    got = pl.concat(seen)["x"].sort()
    assert got.to_list() == list(range(total)), "rows lost or read twice"
