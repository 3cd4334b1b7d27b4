"""Times as people read them: lags in h/d, watermarks with their date, a replay of
history named as old data, report axes in event-time dates, and ``status`` wording
(files vs records, pending recovery only for a batch that really awaits it)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import microbatch as mb
from microbatch.checkpoint import Checkpoint
from microbatch.cli.display import lag_and_watermark
from microbatch.observability.report import _watermark_lag, replaying_history
from microbatch.observability.status import status_document
from microbatch.observability.status_view import render_status
from microbatch.observability.timefmt import fmt_duration_ms, fmt_instant, watermark_lag_text

OLD = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("ms", "text"), [
    (9_800, "9.8 s"),
    (250_000, "4.2 min"),
    (8 * 3_600_000 + 3 * 60_000 + 59_000, "8 h 3 min"),
    (336 * 86_400_000 + 2 * 3_600_000 + 1, "336 d 2 h"),
    (None, "-"),
])
def test_durations_above_an_hour_read_in_hours_and_days(ms: int | None, text: str) -> None:
    assert fmt_duration_ms(ms) == text


def test_a_lag_of_old_data_is_named_as_such_and_a_live_lag_is_not() -> None:
    assert watermark_lag_text(9_800) == "lag 9.8 s"
    old = watermark_lag_text(336 * 86_400_000 + 2 * 3_600_000)
    assert old == "event time 336 d 2 h behind the clock: old data"


def replayed(tmp_path: Path, table: str) -> mb.StreamingQuery:
    """A files source replaying events of 2025-01-01 (old data), run to the end."""
    src = tmp_path / "in"
    src.mkdir()
    for i in range(3):
        pl.DataFrame({"ts": [OLD + timedelta(minutes=i, seconds=s) for s in (0, 30)],
                      "k": [1, 2]}).write_parquet(src / f"f{i}.parquet")
    schema = {"ts": pl.Datetime("ms", "UTC"), "k": pl.Int64}
    query = (mb.read_files(src, format="parquet", schema=schema, max_files_per_batch=1)
             .with_watermark("ts", "10s").group_by(mb.window("ts", "1m"), "k")
             .agg(pl.len().alias("n")).write_memory(table)
             .start(tmp_path / "chk", "available-now"))
    query.await_termination()
    return query


def test_replayed_history_run_lines_show_the_date_and_old_data(tmp_path: Path) -> None:
    query = replayed(tmp_path, "time_people_lines")
    record = query.recent_progress[0]

    line = lag_and_watermark(record)

    assert "lag 2 files" in line
    watermark = record["next_watermark_ms"]
    assert watermark is not None
    assert f"watermark {fmt_instant(watermark)} (event time " in line
    assert fmt_instant(watermark) == "2025-01-01T00:00:20Z"
    assert "behind the clock: old data)" in line
    assert " s)" not in line.split("watermark")[1]  # no lag of millions of seconds


def test_status_of_a_files_replay_says_files_days_and_no_pending_recovery(
    tmp_path: Path,
) -> None:
    replayed(tmp_path, "time_people_status")

    doc = status_document(tmp_path / "chk")
    text = " ".join(_plain(render_status(doc)).split())

    assert doc["source_lag_unit"] == "files"
    assert "source lag 0 files (caught up)" in text
    assert "records" not in text.split("source lag")[1].split("state size")[0]
    assert "watermark lag event time" in text
    assert " d " in text.split("watermark lag")[1].split("source lag")[0]
    assert "pending recovery no" in text
    assert doc["pending_recovery"] is False


def test_pending_recovery_only_when_no_running_query_owns_the_uncommitted_batch(
    tmp_path: Path,
) -> None:
    replayed(tmp_path, "time_people_pending")
    chk = Checkpoint(tmp_path / "chk")
    last = chk.commits.latest()
    assert last is not None
    chk.commits.path(last.batch_id).unlink()  # as a crash between write-ahead and commit

    stopped = status_document(chk.root)
    assert stopped["pending_recovery"] is True
    assert "pending recovery yes: batch" in " ".join(_plain(render_status(stopped)).split())

    chk.lock()  # a running query holds the lock while its batch is in flight
    try:
        running = status_document(chk.root)
    finally:
        chk.unlock()
    assert running["running"] is True
    assert running["pending_recovery"] is False
    assert running["batch_in_flight"] is True
    text = " ".join(_plain(render_status(running)).split())
    assert f"pending recovery no (batch {last.batch_id} is running now)" in text


def test_report_draws_event_time_dates_when_replaying_history(tmp_path: Path) -> None:
    from matplotlib.figure import Figure

    query = replayed(tmp_path, "time_people_report")
    records = query.recent_progress
    assert replaying_history(records)

    ax = Figure().subplots()
    assert _watermark_lag(ax, records)

    assert ax.get_ylabel() == "event time (UTC)"
    low, high = ax.get_ylim()  # matplotlib date numbers: days since 1970
    assert 20_088 < low < high < 20_090  # 2025-01-01 is day 20,089


def _plain(renderable: Any) -> str:
    from rich.console import Console

    console = Console(width=200, record=True, color_system=None)
    with console.capture() as cap:
        console.print(renderable)
    return cap.get()
