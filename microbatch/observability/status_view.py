"""The terminal view of ``microbatch status``: a rich renderable of the document.

Kept apart from :mod:`microbatch.observability.status` (which has no display code) so that
the document can be used by machines (``--json``) and notebooks alike.
"""

from __future__ import annotations

import json
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from microbatch.observability.status import fmt_time
from microbatch.observability.timefmt import fmt_duration_ms, watermark_lag_text

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow"}
MAX_PARTITION_ROWS = 10


def fmt_int(value: Any) -> str:
    """``1,234`` for numbers, ``-`` otherwise."""
    return f"{int(value):,}" if isinstance(value, int | float) else "-"


def fmt_count(value: Any) -> str:
    """Compact counts for narrow tables: ``950``, ``9,500``, ``95.0k``, ``9.5M``."""
    if not isinstance(value, int | float):
        return "-"
    if abs(value) < 10_000:
        return f"{int(value):,}"
    if abs(value) < 10_000_000:
        return f"{value / 1000:,.1f}k"
    return f"{value / 1_000_000:,.1f}M"


def fmt_bytes(value: Any) -> str:
    """``12.3 MiB`` for a byte count, ``-`` otherwise."""
    if not isinstance(value, int | float):
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{size:,.1f} TiB"  # pragma: no cover - the loop always returns


def fmt_seconds(ms: Any) -> str:
    """Milliseconds as ``3.2 s`` / ``4.1 min`` / ``8 h 3 min`` / ``336 d 2 h``; ``-``
    when unknown (:func:`~microbatch.observability.timefmt.fmt_duration_ms`)."""
    return fmt_duration_ms(ms)


def lag_text(records: Any, seconds: Any, unit: str = "records") -> str:
    """``1,200 records (oldest 3.4 s)``; ``1 file``."""
    if records is None and seconds is None:
        return "unknown"
    text = f"{fmt_int(records)} {unit.removesuffix('s') if records == 1 else unit}"
    if records == 0:
        return text + " (caught up)"
    if seconds is not None:
        text += f" (oldest {fmt_seconds(seconds * 1000)})"
    return text


def _state_line(doc: dict[str, Any]) -> str:
    if doc["running"]:
        owner = doc["lock_owner"] or {}
        return (f"[green]running[/] (pid {owner.get('pid', '?')} on {owner.get('host', '?')}, "
                f"since {owner.get('started_at', '?')})")
    return {"failed": "[bold red]failed[/]", "stopped": "[dim]stopped[/]"}.get(
        doc["state"], "[yellow]unknown[/]"
    )


def render_status(doc: dict[str, Any]) -> RenderableType:
    """The whole status view of a status document."""
    parts: list[RenderableType] = [_summary(doc), _alarms(doc)]
    for table in (_sources(doc), _state(doc), _partitions(doc), _batches(doc)):
        if table is not None:
            parts.append(table)
    return Group(*parts)


def _replay_row(replay_of: Any) -> list[tuple[str, str]]:
    """``replay of``: what a checkpoint made by ``microbatch replay`` replays."""
    if not isinstance(replay_of, dict):
        return []
    first, last = replay_of.get("batches", ["?", "?"])
    return [("replay of", f"{escape(str(replay_of.get('checkpoint')))} batches {first}..{last} "
                          f"(query {replay_of.get('query_id')})")]


def _summary(doc: dict[str, Any]) -> Table:
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    error = doc.get("last_error")
    pending = doc["pending_recovery"]
    in_flight = doc.get("batch_in_flight")
    rows = [
        ("checkpoint", escape(doc["checkpoint"])),
        ("query id", doc["query_id"]),
        ("created at", doc["created_at"]),
        *_replay_row(doc.get("replay_of")),
        ("state", _state_line(doc)),
        ("last error", "none" if not error else
         f"[red]batch {error.get('batch_id')} at {error.get('failed_at')}: "
         f"{escape(str(error.get('type')))}: {escape(str(error.get('message')))}[/]"),
        ("last planned batch", _or_none(doc["last_planned_batch"])),
        ("last committed batch", _or_none(doc["last_committed_batch"])),
        ("pending recovery", f"[yellow]yes: batch {doc['last_planned_batch']} is re-run on the "
                             "next start[/]" if pending else
         f"no (batch {doc['last_planned_batch']} is running now)" if in_flight else "no"),
        ("trigger", doc.get("trigger") or "-"),
        ("watermark", doc["watermark"] or "none"),
        ("watermark lag", watermark_lag_text(doc.get("watermark_lag_ms")).removeprefix("lag ")),
        ("source lag", lag_text(doc.get("source_lag_records"), doc.get("source_lag_seconds"),
                                doc.get("source_lag_unit") or "records")),
        ("state size", f"{fmt_int(doc.get('state_rows'))} rows, "
                       f"{fmt_bytes(doc.get('state_bytes'))}"),
        ("state expired (ttl)",
         f"{fmt_int(doc.get('recent_state_expired_rows'))} rows in the batches below"),
        ("late rows", f"{fmt_int(doc.get('recent_late_rows'))} in the batches below"),
        ("dead letters", f"{fmt_int(doc.get('recent_dead_letter_rows'))} in the batches below"),
        ("sink latency", _latency(doc.get("latency_ms"))),
        *_skew_row(doc.get("shard_skew")),
        ("avg input rows/s", fmt_int(doc["avg_input_rows_per_second"])),
        ("avg processed rows/s", fmt_int(doc["avg_processed_rows_per_second"])),
    ]
    for key, value in rows:
        summary.add_row(key, str(value))
    return summary


def _skew_row(skew: dict[str, Any] | None) -> list[tuple[str, str]]:
    """``shard skew``: a scaled-out query's rows per shard in its newest batch."""
    if not skew or skew.get("skew") is None:
        return []
    rows = skew.get("shard_rows") or []
    key = skew.get("hot_key")
    hot = "" if not key else " (hot key " + ", ".join(
        f"{escape(str(c))}={escape(repr(v))}" for c, v in key.items()) + ")"
    return [("shard skew", f"max/mean {skew['skew']:.1f} over {len(rows)} shards, "
                           f"{max(rows, default=0):,} rows in shard {skew.get('hot_shard')}"
                           f"{hot}{'' if skew.get('combined') else ', rows not pre-aggregated'}")]


def _latency(latency: dict[str, Any] | None) -> str:
    if not latency:
        return "unknown (the newest batch wrote no rows with an event time)"
    return (f"max {fmt_seconds(latency.get('max_ms'))}, median "
            f"{fmt_seconds(latency.get('median_ms'))} (now - {latency.get('column')})")


def _alarms(doc: dict[str, Any]) -> RenderableType:
    found = doc.get("alarms") or []
    if not found:
        return Text("alarms: none", style="green")
    text = Text(f"alarms ({len(found)}):\n", style="bold")
    for alarm in found:
        text.append(f"  ● {alarm['severity']}: ", style=SEVERITY_STYLE.get(alarm["severity"], ""))
        text.append(f"[{alarm['code']}] {alarm['message']}\n")
    return text


def _table(title: str, columns: tuple[str, ...], *, right: bool = False) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1),
                  pad_edge=False, collapse_padding=True)
    for col in columns:
        table.add_column(col, justify="right" if right else "left", overflow="fold")
    return table


def _sources(doc: dict[str, Any]) -> Table | None:
    if not doc["sources"]:
        return None
    table = _table(f"sources of batch {doc['last_planned_batch']}",
                   ("id", "source", "start offset", "end offset", "lag"))
    table.columns[4].min_width = 16
    for s in doc["sources"]:
        desc = s["description"] or {}
        lag = s.get("lag") or {}
        table.add_row(
            s["id"], escape(str(desc.get("kind", desc) if desc else "-")),
            escape(json.dumps(s["start_offset"], separators=(",", ":"))),
            escape(json.dumps(s["end_offset"], separators=(",", ":"))),
            lag_text(lag.get("records"), lag.get("seconds"), lag.get("unit", "records"))
            if lag else "unknown",
        )
    return table


def _state(doc: dict[str, Any]) -> Table | None:
    ops = doc.get("state_operators") or {}
    if not ops:
        return None
    table = _table("state", ("operator", "rows", "bytes", "bytes/row", "eviction",
                             "expired", "late rows", "commit ms"))
    for op_id, m in sorted(ops.items()):
        per_row = m.get("bytes_per_row")
        table.add_row(
            op_id, fmt_int(m.get("rows")), fmt_bytes(m.get("bytes")),
            "-" if per_row is None else f"{per_row:,.0f}", str(m.get("eviction", "-")),
            fmt_int(m.get("expired_rows")), fmt_int(m.get("late_rows")),
            "-" if m.get("commit_ms") is None else f"{m['commit_ms']:.1f}",
        )
    return table


def _partitions(doc: dict[str, Any]) -> Table | None:
    parts = doc.get("watermark_partitions") or []
    if not parts:
        return None
    table = _table("watermark by partition", ("node", "column", "partition",
                                              "newest event", "no rows for", "idle", "holding"))
    for p in parts[:MAX_PARTITION_ROWS]:
        table.add_row(
            p["node"], escape(p["column"]), escape(str(p["partition"])),
            (fmt_time(p["max_event_time_ms"]) or "-")[:19].replace("T", " "),
            fmt_seconds(p["idle_ms"]),
            "yes" if p["idle"] else "no", "[bold]yes[/]" if p["holding"] else "no",
        )
    if len(parts) > MAX_PARTITION_ROWS:
        table.caption = f"{len(parts) - MAX_PARTITION_ROWS} more partitions in --json"
    return table


def _batches(doc: dict[str, Any]) -> Table | None:
    if not doc["recent_batches"]:
        return None
    table = _table("recent batches", ())
    table.caption = ("in/out: rows; /s: rows per second arriving and processed; lag: not yet "
                     "read; wm lag: wall clock - watermark")
    table.caption_justify = "left"
    for col in ("batch", "time UTC", "in", "out", "in/s", "done/s", "ms", "late", "lag",
                "wm lag"):
        table.add_column(col, justify="right", no_wrap=True)
    for b in doc["recent_batches"]:
        ms = "-" if b["duration_ms"] is None else f"{b['duration_ms']:.0f}"
        table.add_row(
            f"{b['batch_id']}{' (recovered)' if b['recovered'] else ''}",
            (b["time"] or "-")[11:19],
            fmt_count(b["input_rows"]), fmt_count(b["output_rows"]),
            fmt_count(b["input_rows_per_second"]), fmt_count(b["processed_rows_per_second"]),
            f"[red]{ms}[/]" if b.get("falling_behind") else ms,
            fmt_count(b.get("late_rows")), fmt_count(b.get("source_lag_records")),
            fmt_seconds(b.get("watermark_lag_ms")),
        )
    return table


def _or_none(value: int | None) -> str:
    return "none" if value is None else str(value)
