"""The lateness profile of a log: what each watermark delay and allowed lateness costs.

The watermark's delay and a window's allowed lateness trade completeness for
latency and state: that trade is a product decision, and it depends on how late
the data really arrives. Given a log -- a directory of Parquet files (arrival =
file mtime), a Delta table (arrival = the version's commit time) or a Kafka topic
(arrival = the message timestamp) -- :func:`profile` replays it as a live query
with a ``trigger`` would batch it, and reports for every (delay, allowed
lateness) of a grid:

- ``late_rows``: the share of rows that would be late (dropped to the late
  output), by the engine's rule: a row is late when its window's end plus the
  allowed lateness is at or before the watermark in force for its batch (the
  newest event time of the earlier batches minus the delay);
- ``windows_differ``: the share of (window, keys) whose result would differ
  from a batch recompute of the whole log (they lost a late row);
- ``alerts_missed``: with ``min_count``, the share of the recompute's alerts
  (windows with at least that many rows) that the stream would never raise;
- ``state_peak`` / ``state_mean``: windows held in state, across the batches
  (a window lives from its first counted row until the watermark passes its
  end plus the allowed lateness);
- ``first_result_s`` / ``final_result_s``: the median time from a window's end
  to the batch that emits it (the watermark passes its end) and to the batch
  that makes it final (its end plus the allowed lateness). Early firing
  (``fire_once``) alerts before either; these are what final results cost.

Everything is vectorized over the rows; the grid is a loop over its cells.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from microbatch.exceptions import MicrobatchError
from microbatch.plan.event_time import event_time_ms

__all__ = ["Log", "load_delta", "load_kafka", "load_parquet_dir", "plot", "profile"]

T, ARRIVAL = "__t", "__arrival"


@dataclass(frozen=True)
class Log:
    """A log's rows in arrival order: event time and arrival time in epoch ms, keys."""

    rows: pl.DataFrame
    """Columns ``__t`` (event time, ms), ``__arrival`` (ms) and the key columns."""
    keys: tuple[str, ...]
    source: str


def _check_columns(columns: list[str], time_column: str, keys: Sequence[str],
                   source: str) -> None:
    missing = [c for c in [time_column, *keys] if c not in columns]
    if missing:
        raise MicrobatchError(
            f"lateness: {source} has no column(s) {missing}; its columns are {columns}. "
            "Name the event-time column with --time and the keys with --key."
        )


def _prepare(frame: pl.DataFrame, time_column: str, keys: Sequence[str],
             arrival: pl.Expr, source: str) -> Log:
    _check_columns(frame.columns, time_column, keys, source)
    rows = frame.select(
        event_time_ms(time_column, frame.schema).alias(T), arrival.alias(ARRIVAL), *keys
    ).drop_nulls(T)
    return Log(rows.with_row_index("__order").sort(ARRIVAL, "__order", maintain_order=True)
               .drop("__order"), tuple(keys), source)


def load_parquet_dir(path: str | Path, *, time_column: str, keys: Sequence[str]) -> Log:
    """A directory of Parquet files: arrival order and time = each file's mtime."""
    root = Path(path)
    files = sorted((f.stat().st_mtime_ns, f.name, f) for f in root.glob("*.parquet"))
    if not files:
        raise MicrobatchError(f"lateness: no *.parquet files in {root}")
    _check_columns(list(pl.read_parquet_schema(files[0][2])), time_column, keys, str(root))
    frames = [
        pl.read_parquet(f, columns=[time_column, *keys]).with_columns(
            pl.lit(ns // 1_000_000, pl.Int64).alias(ARRIVAL))
        for ns, _, f in files
    ]
    return _prepare(pl.concat(frames, how="vertical_relaxed"), time_column, keys,
                    pl.col(ARRIVAL), str(root))


def load_delta(path: str, *, time_column: str, keys: Sequence[str],
               storage_options: dict[str, str] | None = None) -> Log:
    """A Delta table: every version's added rows, arriving at the version's commit time."""
    from microbatch.sources.delta import DeltaSource

    source = DeltaSource(path, storage_options=storage_options or {}, ignore_changes=True)
    latest = source.latest_version()
    if latest is None:
        raise MicrobatchError(f"lateness: there is no Delta table at {path}")
    frames = []
    for version in range(latest + 1):
        commit = source.log_commit(version)
        if not commit.files:
            continue
        rows = source.read({"version": version, "index": 0}, {"version": version + 1, "index": 0})
        _check_columns(rows.data.columns, time_column, keys, path)
        frames.append(rows.data.select(time_column, *keys).with_columns(
            pl.lit(commit.timestamp_ms, pl.Int64).alias(ARRIVAL)))
    if not frames:
        raise MicrobatchError(f"lateness: the Delta table {path} has no rows")
    return _prepare(pl.concat(frames, how="vertical_relaxed"), time_column, keys,
                    pl.col(ARRIVAL), path)


def load_kafka(bootstrap: str, topic: str, *, time_column: str, keys: Sequence[str]) -> Log:
    """A Kafka topic of JSON values: arrival = the message timestamp, from the earliest
    offset to the end now."""
    import tempfile

    from microbatch.sources.base import SourceContext
    from microbatch.sources.kafka import KafkaSource

    source = KafkaSource(topic, bootstrap=bootstrap, format="raw",
                         metadata_columns=("timestamp",))
    with tempfile.TemporaryDirectory(prefix="microbatch-lateness-") as tmp:
        source.open(SourceContext("0", Path(tmp)))
        try:
            start = source.initial_offset()
            batch = source.read(start, source.latest_offset(start, capped=False))
        finally:
            source.close()
    values = batch.data
    if values.height == 0:
        raise MicrobatchError(f"lateness: the topic {topic!r} is empty")
    decoded = pl.read_ndjson(b"\n".join(values["value"].to_list()))
    frame = decoded.with_columns(values["timestamp"].alias(ARRIVAL))
    if frame.schema[time_column] == pl.String:
        frame = frame.with_columns(
            pl.col(time_column).str.to_datetime(time_unit="ms", time_zone="UTC"))
    return _prepare(frame, time_column, keys,
                    event_time_ms(ARRIVAL, frame.schema), f"kafka topic {topic}")


def profile(log: Log, *, window_ms: int, delays_ms: Sequence[int],
            lateness_ms: Sequence[int], trigger_ms: int, min_count: int | None = None,
            ) -> pl.DataFrame:
    """One row per (delay, allowed lateness); see the module docstring for the columns."""
    # NOTE: a row arriving in trigger interval b is in batch b, which runs at the end of
    # the interval; a batch sees the watermark of the batches before it
    first = int(log.rows[ARRIVAL].to_numpy().min())
    rows = log.rows.with_columns(
        ((pl.col(ARRIVAL) - first) // trigger_ms).alias("__batch"),
        (pl.col(T) // window_ms * window_ms + window_ms).alias("__we"),
    )
    per_batch = rows.group_by("__batch").agg(pl.col(T).max().alias("__max"))
    n_batches = int(per_batch["__batch"].to_numpy().max()) + 1
    batch_max = np.full(n_batches, np.iinfo(np.int64).min, dtype=np.int64)
    batch_max[per_batch["__batch"].to_numpy()] = per_batch["__max"].to_numpy()
    batch_at = first + (np.arange(n_batches, dtype=np.int64) + 1) * trigger_ms
    newest_before = np.concatenate([[np.iinfo(np.int64).min],
                                    np.maximum.accumulate(batch_max)[:-1]])
    window_keys = ["__we", *log.keys]
    totals = rows.group_by(window_keys).agg(pl.len().alias("__n"))
    out = []
    for delay in delays_ms:
        no_mark = newest_before == np.iinfo(np.int64).min
        wm = np.where(no_mark, np.iinfo(np.int64).min, newest_before - delay)
        with_wm = rows.with_columns(pl.Series("__wm", wm[rows["__batch"].to_numpy()]))
        for lateness in lateness_ms:
            out.append(_cell(with_wm, totals, wm, batch_at, window_keys, delay=delay,
                             lateness=lateness, min_count=min_count))
    return pl.DataFrame(out)


def _cell(rows: pl.DataFrame, totals: pl.DataFrame, wm: np.ndarray, batch_at: np.ndarray,
          window_keys: list[str], *, delay: int, lateness: int,
          min_count: int | None) -> dict[str, Any]:
    late = pl.col("__we") + lateness <= pl.col("__wm")
    marked = rows.with_columns(late.alias("__late"))
    kept = (marked.filter(~pl.col("__late")).group_by(window_keys)
            .agg(pl.len().alias("__kept"), pl.col("__batch").min().alias("__first")))
    windows = totals.join(kept, on=window_keys, how="left").with_columns(
        pl.col("__kept").fill_null(0))
    differ = windows.filter(pl.col("__kept") < pl.col("__n")).height
    cell: dict[str, Any] = {
        "delay_s": delay / 1000,
        "allowed_lateness_s": lateness / 1000,
        "late_rows": marked["__late"].mean(),
        "windows_differ": differ / windows.height,
    }
    if min_count is not None:
        alerts = windows.filter(pl.col("__n") >= min_count)
        missed = alerts.filter(pl.col("__kept") < min_count).height
        cell["alerts"] = alerts.height
        cell["alerts_missed"] = missed / alerts.height if alerts.height else 0.0
    # state: a window lives from its first counted row's batch until the batch whose
    # watermark reaches its end + lateness (wm never decreases: a binary search)
    live = windows.filter(pl.col("__kept") > 0)
    ends = live["__we"].to_numpy()
    start = live["__first"].to_numpy()
    evict = np.searchsorted(wm, ends + lateness, side="left")
    evict = np.maximum(evict, start + 1)
    counts = np.zeros(len(wm) + 1, dtype=np.int64)
    np.add.at(counts, start, 1)
    np.add.at(counts, evict, -1)
    alive = np.cumsum(counts)[: len(wm)]
    cell["state_peak"] = int(alive.max()) if len(alive) else 0
    cell["state_mean"] = round(float(alive.mean()), 1) if len(alive) else 0.0
    for name, bound in (("first_result_s", ends), ("final_result_s", ends + lateness)):
        # a window that appears after the watermark passed its end is emitted at once
        emit = np.maximum(np.searchsorted(wm, bound, side="left"), start)
        done = emit < len(wm)
        waits = (batch_at[emit[done]] - ends[done]) / 1000
        cell[name] = round(float(np.median(waits)), 2) if len(waits) else None
    return cell


def plot(table: pl.DataFrame, path: Path, *, title: str) -> Path:
    """Four panels over the delay, a line per allowed lateness: late rows, alerts
    missed (or windows that differ), state, and the time to a final result."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("late_rows", "rows late (share)"),
              ("alerts_missed" if "alerts_missed" in table.columns else "windows_differ",
               "alerts missed (share)" if "alerts_missed" in table.columns
               else "windows that differ (share)"),
              ("state_peak", "windows in state (peak)"),
              ("final_result_s", "final result after window end (s, median)")]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, (column, label) in zip(axes.flat, panels, strict=True):
        for lateness, part in table.group_by("allowed_lateness_s", maintain_order=True):
            ax.plot(part["delay_s"], part[column], marker="o",
                    label=f"allowed lateness {lateness[0]:g} s")
        ax.set_xscale("log")
        ax.set_xlabel("watermark delay (s)")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
