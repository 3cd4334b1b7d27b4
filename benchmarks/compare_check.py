"""Do the engines' outputs agree? Each peer against this engine, and why not.

Windows are matched on ``(ws, card_id)``. Every difference is put in a
bucket that explains it, using the one-shot result over *all* rows (no row
dropped as late: ``n_all``) and this engine's final watermark:

- ``open at our end``: the peer emitted a window that this engine's final
  watermark had not closed (Bytewax flushes every window at end of input,
  Flink-style; ours and Spark leave them open, see docs/design.md);
- ``peer kept late rows``: same window, the peer's count is higher than ours:
  it accepted rows that our (Spark's) rule dropped as late;
- ``peer dropped more``: the peer's count is lower: its lateness rule cut
  rows that ours accepted;
- ``only ours`` / ``only peer`` for the remaining windows (for sessions, a
  late row accepted by one engine and not the other also moves session
  boundaries, so whole sessions differ).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

KEYS = ["ws", "card_id"]

LATENESS_RULES = {
    "microbatch": "a row is dropped when its window's end ≤ the watermark in force for the "
                  "batch (max event time of earlier batches - 10 s); final no-data batch "
                  "emits what the final watermark closes",
    "spark": "per window like ours, but rows are dropped with the watermark of the "
             "previous batch (eventTimeWatermarkForLateEvents, Spark >= 3.4) while windows "
             "are emitted with the current one: a row whose window ends between the two "
             "watermarks is still counted by Spark and dropped by us (one batch more "
             "lenient); available-now runs the final no-data batch, as ours does",
    "bytewax": "watermark per key (max event time seen for that card - 10 s), advanced per "
               "item; an item is late when its timestamp < that watermark; at end of input "
               "every open window is emitted",
    "quix": "watermark per partition (max timestamp seen - grace 10 s), advanced per message; "
            "a message is late for a window whose end ≤ that watermark (sessions: late "
            "when ts < watermark - gap - grace)",
}


def _amount_differs() -> pl.Expr:
    tolerance = 1e-6 * pl.col("amount").abs().clip(lower_bound=1.0)
    return (pl.col("amount") - pl.col("amount_p")).abs() > tolerance


def compare_windows(ours: pl.DataFrame, peer: pl.DataFrame, all_rows: pl.DataFrame,
                    final_wm: int | None) -> tuple[str, list[str], dict[str, int]]:
    """A one-cell verdict, detail lines (Markdown) and the bucket counts."""
    all_n = all_rows.select(*KEYS, pl.col("n").alias("n_all"))
    joined = (ours.join(peer, on=KEYS, how="full", coalesce=True, suffix="_p")
              .join(all_n, on=KEYS, how="left"))
    both = joined.filter(pl.col("n").is_not_null() & pl.col("n_p").is_not_null())
    differ = both.filter((pl.col("n") != pl.col("n_p")) | (pl.col("we") != pl.col("we_p"))
                         | _amount_differs())
    kept_late = differ.filter(pl.col("n_p") > pl.col("n"))
    dropped_more = differ.filter(pl.col("n_p") < pl.col("n"))
    other_diff = differ.filter(pl.col("n_p") == pl.col("n"))
    only_peer = joined.filter(pl.col("n").is_null())
    open_at_end = (only_peer.filter(pl.col("we_p") > final_wm) if final_wm is not None
                   else only_peer.clear())
    only_peer_closed = (only_peer.filter(pl.col("we_p") <= final_wm) if final_wm is not None
                        else only_peer)
    only_ours = joined.filter(pl.col("n_p").is_null())
    dup_peer = peer.height - peer.unique(KEYS).height
    same = both.height - differ.height
    counts = {
        "ours": ours.height, "peer": peer.height, "same": same,
        "peer_kept_late": kept_late.height, "peer_dropped_more": dropped_more.height,
        "other_value_diff": other_diff.height, "open_at_our_end": open_at_end.height,
        "only_peer": only_peer_closed.height, "only_ours": only_ours.height,
        "duplicates": dup_peer,
    }
    closed_peer = peer.height - open_at_end.height
    if closed_peer == ours.height == same and dup_peer == 0:
        verdict = f"agrees: {same:,} windows identical"
    else:
        parts = [f"{same:,} of our {ours.height:,} windows identical"]
        for label, key in (("peer kept rows we dropped as late", "peer_kept_late"),
                           ("peer dropped rows we kept", "peer_dropped_more"),
                           ("other value diffs", "other_value_diff"),
                           ("only ours", "only_ours"), ("only peer", "only_peer"),
                           ("duplicates", "duplicates")):
            if counts[key]:
                parts.append(f"{label} {counts[key]:,}")
        verdict = "; ".join(parts)
    if open_at_end.height:
        verdict += f"; +{open_at_end.height:,} windows still open at our end (emitted by peer)"
    detail: list[str] = []
    show = [("peer kept late rows", kept_late), ("peer dropped more", dropped_more),
            ("other value diffs", other_diff), ("only ours", only_ours),
            ("only peer (closed by our final watermark)", only_peer_closed)]
    if any(frame.height for _, frame in show):
        detail += ["```"]
        for title, frame in show:
            if frame.height:
                sample = frame.select(
                    "ws", "card_id", pl.col("we"), pl.col("we_p").alias("we_peer"),
                    pl.col("n").alias("n_ours"), pl.col("n_p").alias("n_peer"), "n_all",
                    pl.col("amount").alias("amount_ours"), pl.col("amount_p").alias("amount_peer"),
                ).sort(KEYS).head(4)
                detail += [f"{title}: {frame.height:,}", str(sample)]
        detail += ["```"]
    return verdict, detail, counts


def check_against_all(ours: pl.DataFrame, all_rows: pl.DataFrame, final_wm: int,
                      late_rows: int) -> tuple[str, list[str]]:
    """Q5 (Kafka batches are not file batches, so there is no simulated reference): every
    window our final watermark closed equals the one-shot window over all rows, except
    that rows we counted as late are missing; those missing rows add up to our late count
    and no window of ours has more rows than the one-shot's."""
    closed = all_rows.filter(pl.col("we") <= final_wm)
    joined = closed.join(ours, on=KEYS, how="full", coalesce=True, suffix="_o")
    both = joined.filter(pl.col("n").is_not_null() & pl.col("n_o").is_not_null())
    same = both.filter((pl.col("n") == pl.col("n_o")) & (pl.col("we") == pl.col("we_o")))
    value_diff = same.filter(
        (pl.col("amount") - pl.col("amount_o")).abs()
        > 1e-6 * pl.col("amount").abs().clip(lower_bound=1.0))
    short = both.filter(pl.col("n_o") < pl.col("n"))
    over = both.filter(pl.col("n_o") > pl.col("n"))
    missing = joined.filter(pl.col("n_o").is_null())
    extra = joined.filter(pl.col("n").is_null())
    deficit = int(joined.filter(pl.col("n").is_not_null())
                  .select((pl.col("n") - pl.col("n_o").fill_null(0)).sum()).item() or 0)
    ok = not (value_diff.height or over.height or extra.height) and deficit == late_rows
    verdict = (f"{same.height - value_diff.height:,} windows equal the one-shot's; "
               f"{short.height + missing.height:,} short by {deficit:,} rows, "
               f"{'= ' if deficit == late_rows else '≠ '}{late_rows:,} counted late")
    if ok:
        return verdict, []
    verdict = (f"DIFF: {verdict}; value diffs {value_diff.height:,}, more rows than "
               f"one-shot {over.height:,}, windows not in one-shot {extra.height:,}")
    sample = pl.concat([value_diff, over, extra], how="diagonal_relaxed").sort(KEYS).head(8)
    return verdict, ["```", str(sample), "```"]


def compare_rows(ours: pl.DataFrame, peer: pl.DataFrame) -> tuple[str, dict[str, int]]:
    """Q4 (filter): the same ``event_id`` set and amounts."""
    joined = ours.join(peer, on="event_id", how="full", coalesce=True, suffix="_p")
    only_ours = joined.filter(pl.col("amount_p").is_null()).height
    only_peer = joined.filter(pl.col("amount").is_null()).height
    differ = joined.filter(pl.col("amount").is_not_null() & pl.col("amount_p").is_not_null()
                           & (pl.col("amount") != pl.col("amount_p"))).height
    dups = peer.height - peer.unique("event_id").height
    counts = {"ours": ours.height, "peer": peer.height, "only_ours": only_ours,
              "only_peer": only_peer, "values": differ, "duplicates": dups}
    if only_ours == only_peer == differ == dups == 0:
        return f"agrees: {peer.height:,} rows identical", counts
    return (f"DIFF: only ours {only_ours:,}, only peer {only_peer:,}, values {differ:,}, "
            f"duplicates {dups:,}"), counts


def load(path: Path) -> pl.DataFrame | None:
    """An engine's normalized output, or None when it wrote none (noop sinks)."""
    return pl.read_parquet(path) if path.exists() else None


def final_watermark(run: dict[str, Any]) -> int | None:
    """This engine's final watermark (epoch ms) from its progress records."""
    marks = [p.get("next_watermark_ms") or p.get("watermark_ms") for p in run.get("progress", [])]
    marks = [m for m in marks if m is not None]
    return max(marks) if marks else None


def spark_rule_reference(case: Any, ds: Any, files_per_batch: int, final_wm: int,
                         lag: int = 2) -> pl.DataFrame:
    """What Spark's late-row rule gives: ``windowed``'s reference with the watermark of
    ``lag`` batches back (Spark >= 3.4 drops late rows with the watermark of the previous
    batch, ``eventTimeWatermarkForLateEvents``, and emits with the current one), over the
    windows the final watermark closed."""
    from benchmarks.data import batch_frames

    delay_ms = 10_000
    lf = batch_frames(ds, files_per_batch).with_columns(
        pl.col("event_time").dt.epoch("ms").alias("t"))
    marks = (
        lf.group_by("batch").agg(pl.col("t").max().alias("bmax")).sort("batch")
        .with_columns((pl.col("bmax").cum_max() - delay_ms).shift(lag).alias("wm"))
        .select("batch", "wm")
    )
    expected, _late = case.reference(lf.join(marks, on="batch"))
    closed: pl.DataFrame = expected.filter(pl.col("we") <= final_wm).select(
        "ws", "we", "card_id", "n", "amount").collect()
    return closed
