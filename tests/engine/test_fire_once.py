"""``agg(...).fire_once(condition)``: early firing, once per window, for every batch split.

The engine's output is compared with an independent simulation of the rules
(docs/semantics.md, "Early firing"): batch by batch, the watermark in force is
the newest event time of the earlier batches minus the delay; a row is late
when its window's end plus the allowed lateness is at or before it; a window
fires in the batch where its count of rows that were not late first reaches
the threshold, with the count and total it has then; with corrections, every
later batch that changes a fired window emits it again with the next revision.
And, whatever the split, the windows that fired are exactly those of the
one-shot result over the rows that were not late.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import microbatch as mb
from microbatch.testing import StreamTest

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)
SCHEMA = {"ts": pl.Datetime("ms", "UTC"), "k": pl.Int64, "v": pl.Int64}
SIZE_MS = 60_000
DELAY_MS = 10_000
FIRE_AT = 3

# arrival order is list order; few keys and minutes, so windows reach the threshold
# in one batch or across several, and rows out of order are often late
events = st.lists(
    st.tuples(st.integers(0, 1), st.integers(0, 240_000), st.integers(1, 50)),
    min_size=1,
    max_size=50,
)


def frame(rows: list[tuple[int, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        {"ts": [T0 + timedelta(milliseconds=t) for _, t, _ in rows],
         "k": [k for k, _, _ in rows], "v": [v for _, _, v in rows]},
        schema=SCHEMA,
    )


def build(lateness_ms: int, corrections: bool):
    window = mb.window("ts", "1m", allowed_lateness=f"{lateness_ms}ms")

    def query(src: mb.Stream) -> mb.Stream:
        return (
            src.with_watermark("ts", f"{DELAY_MS}ms")
            .group_by(window, "k")
            .agg(pl.len().alias("n"), pl.col("v").sum().alias("total"))
            .fire_once(pl.col("n") >= FIRE_AT, corrections=corrections)
        )

    return query


def batches_of(rows: list, cuts: list[int]) -> list[list]:
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(rows)}), len(rows)]
    return [rows[lo:hi] for lo, hi in itertools.pairwise(bounds)]


def simulate(batches: list[list], lateness_ms: int, corrections: bool):
    """(emitted rows as (window_start_ms, k, n, total, revision), late rows)."""
    wm = None
    windows: dict[tuple[int, int], list[int]] = {}
    fired: dict[tuple[int, int], int] = {}
    emitted, late = [], []
    for batch in batches:
        changed = []
        for k, t, v in batch:
            ws = t // SIZE_MS * SIZE_MS
            if wm is not None and ws + SIZE_MS + lateness_ms <= wm:
                late.append((k, t, v))
                continue
            acc = windows.setdefault((ws, k), [0, 0])
            acc[0] += 1
            acc[1] += v
            if (ws, k) not in changed:
                changed.append((ws, k))
        for key in changed:
            n, total = windows[key]
            if key in fired:
                if corrections:
                    fired[key] += 1
                    emitted.append((*key, n, total, fired[key]))
            elif n >= FIRE_AT:
                fired[key] = 0
                emitted.append((*key, n, total, 0))
        newest = max(t for _, t, _ in batch) - DELAY_MS
        wm = newest if wm is None else max(wm, newest)
    return emitted, late


def engine_rows(out: pl.DataFrame, corrections: bool) -> list[tuple]:
    if out.height == 0:
        return []
    rows = out.select(
        pl.col("window_start").dt.epoch("ms") - T0_MS, "k", "n", "total",
        pl.col("revision") if corrections else pl.lit(0, pl.Int64).alias("revision"),
    ).rows()
    return sorted(rows)


@pytest.mark.parametrize("corrections", [False, True], ids=["once", "corrections"])
@pytest.mark.parametrize("lateness_ms", [0, 120_000], ids=["no-lateness", "2m-lateness"])
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=events, cuts=st.lists(st.integers(0, 50), max_size=8))
# a window that fires and then grows; one that reaches the threshold across batches;
# rows minutes late (within 2 minutes of lateness, or beyond)
@example(rows=[(0, 0, 1)] * 4, cuts=[3])
@example(rows=[(0, 0, 1), (0, 1, 2), (1, 2, 3), (0, 3, 4), (0, 4, 5)], cuts=[1, 3])
@example(rows=[(0, 200_000, 1), (0, 1, 1), (0, 2, 1), (0, 3, 1), (1, 230_000, 1), (1, 4, 1)],
         cuts=[1, 2, 4])
def test_fire_once_matches_the_rules_for_every_split(
    tmp_path_factory: pytest.TempPathFactory, lateness_ms: int, corrections: bool,
    rows: list, cuts: list[int],
) -> None:
    batches = batches_of(rows, cuts)
    test = StreamTest(build(lateness_ms, corrections), schema=SCHEMA,
                      checkpoint=tmp_path_factory.mktemp("fire"))
    for batch in batches:
        test.add(frame(batch)).process()
    want, want_late = simulate(batches, lateness_ms, corrections)
    assert engine_rows(test.output, corrections) == sorted(want)
    got_late = test.late_rows.select(
        "k", pl.col("ts").dt.epoch("ms") - T0_MS, "v").rows() if test.late_rows.height else []
    assert sorted(got_late) == sorted(want_late)
    # whatever the split: the windows that fired = the one-shot result over the rows
    # that were not late
    kept = [r for r in rows if r not in want_late or want_late.remove(r)]
    one_shot = (
        frame(kept).group_by((pl.col("ts").dt.epoch("ms") - T0_MS) // SIZE_MS * SIZE_MS, "k")
        .agg(pl.len().alias("n")).filter(pl.col("n") >= FIRE_AT)
        .select("ts", "k").rows()
    ) if kept else []
    fired = [(ws, k) for ws, k, _, _, rev in engine_rows(test.output, corrections) if rev == 0]
    assert len(fired) == len(set(fired))  # once per window
    assert sorted(fired) == sorted(one_shot)
    test.close()


def test_fire_once_survives_a_restart_between_batches(tmp_path: Path) -> None:
    """The fired windows are state: a restarted engine does not fire them again."""
    test = StreamTest(build(120_000, False), schema=SCHEMA, checkpoint=tmp_path)
    rows = [(1, 1_000, 5), (1, 2_000, 5), (1, 3_000, 5)]
    assert test.add(frame(rows)).process()["n"].to_list() == [3]
    test.restart()
    assert test.add(frame([(1, 4_000, 5)])).process().height == 0
    test.restart()
    late_but_allowed = [(1, 5_000, 5), (2, 6_000, 1), (2, 7_000, 1), (2, 8_000, 1)]
    test.add(frame([(0, 170_000, 1)])).process()  # the watermark moves to 160 s
    out = test.add(frame(late_but_allowed)).process()  # window [0, 1m) + 2m: open until 180 s
    assert out.select("k", "n").rows() == [(2, 3)]
    test.add(frame([(0, 200_000, 1)])).process()  # 190 s: the window is closed for good
    test.add(frame([(3, 9_000, 1)] * 3)).process()
    assert test.late_rows.height == 3
    test.close()


def test_fire_once_needs_a_window() -> None:
    src = mb.read_memory(schema=SCHEMA)
    with pytest.raises(mb.PlanError, match="needs a tumbling or hopping window"):
        src.group_by("k").agg(pl.len().alias("n")).fire_once(pl.col("n") >= 3)
    with pytest.raises(mb.PlanError, match="needs a tumbling or hopping window"):
        (src.with_watermark("ts", "1s").group_by(mb.session_window("ts", "10s"), "k")
         .agg(pl.len().alias("n")).fire_once(pl.col("n") >= 3))


def test_a_batch_without_changes_has_the_same_columns(tmp_path: Path) -> None:
    test = StreamTest(build(0, True), schema=SCHEMA, checkpoint=tmp_path)
    fired = test.add(frame([(1, 1_000, 5)] * 3)).process()
    quiet = test.add(frame([(1, 200_000, 5)])).process()  # a new window, below threshold
    assert fired.columns == quiet.columns
    assert "revision" in quiet.columns
    test.close()


def test_cumulating_windows_of_one_start_fire_each(tmp_path: Path) -> None:
    """Cumulating windows share their start: each (start, end) fires on its own,
    so the 40 s and the 60 s window of a minute both fire, in order."""
    times = [5_000, 25_000, 45_000, 130_000]  # the last one closes the first minute
    rows = [(1, t, 1) for t in times]
    test = StreamTest(
        lambda src: (
            src.with_watermark("ts", "0s")
            .group_by(mb.cumulate_window("ts", "1m", "20s"), "k")
            .agg(pl.len().alias("n"))
            .fire_once(pl.col("n") >= 2)
        ),
        schema=SCHEMA,
        checkpoint=tmp_path,
        output_mode="update",
    )
    for t in times:
        test.add(frame([r for r in rows if r[1] == t])).process()
    got = test.output.select(
        (pl.col("window_start", "window_end").dt.epoch("ms") - T0_MS) // 1000, "n"
    )
    # both reach 2 rows in the second batch; the 20 s window never does
    assert sorted(got.rows()) == [(0, 40, 2), (0, 60, 2)], got
    test.close()
