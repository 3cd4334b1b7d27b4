"""How a query shows itself to a person, from its :class:`QuerySnapshot`.

``query.explain()`` prints the plan annotated with what runs: each stateful
operator's id, state size and eviction, each watermark node's value and the
partitions that hold it, each source's position and lag. In a notebook, a
query's ``_repr_html_`` shows its status, the newest batch and a table of
recent batches. Both read only the progress records (snapshots taken by the
query thread), never the live state, so they are safe while the query runs.
"""

from __future__ import annotations

import html
import json
import time

from microbatch.observability.progress_schema import ProgressRecord, SourceProgress
from microbatch.observability.snapshot import QuerySnapshot
from microbatch.observability.status import alarms, fmt_time
from microbatch.observability.status_view import fmt_bytes, fmt_int, fmt_seconds, lag_text
from microbatch.plan.nodes import PlanNode, SourceNode, WatermarkNode

RECENT_ROWS = 10
"""Batches shown in a query's notebook table."""


def explain_text(query: QuerySnapshot) -> str:
    """The plan, root first, each node followed by its live figures."""
    last = query.last
    ids = query.node_ids
    sources = {s["id"]: s for s in last["sources"]} if last else {}
    lines = [
        f"StreamingQuery {query.name or query.id} [{query.message}]",
        f"checkpoint: {query.checkpoint}",
        f"trigger: {query.trigger}",
        "",
        "== Plan (root first), with state and watermarks ==",
    ]

    def visit(node: PlanNode, depth: int) -> None:
        pad = "  " * depth
        lines.append(pad + node.label())
        if isinstance(node, WatermarkNode):
            head, *parts = _watermark_lines(ids.get(id(node)), last)
            lines.append(pad + "  └ " + head)
            lines.extend(pad + "      " + t for t in parts)
        elif isinstance(node, SourceNode):
            sid = ids.get(id(node), "?")
            lines.append(pad + "  └ " + _source_line(sid, sources.get(sid)))
        elif id(node) in ids:
            lines.append(pad + "  └ " + _state_line(ids[id(node)], last))
        for child in node.children:
            visit(child, depth + 1)

    visit(query.plan, 0)
    lines += ["", "== Newest batch ==", _batch_line(last) if last else "no batch yet"]
    return "\n".join(lines)


def _state_line(op_id: str, last: ProgressRecord | None) -> str:
    m = last["state"].get(op_id) if last else None
    if not m:
        return f"state {op_id}: no batch yet"
    return (f"state {op_id}: {fmt_int(m.get('rows'))} rows, {fmt_bytes(m.get('bytes'))}, "
            f"version {m.get('version', '-')}, eviction {m.get('eviction', '-')}, "
            f"late rows {fmt_int(m.get('late_rows'))} in the newest batch")


def _watermark_lines(node_id: str | None, last: ProgressRecord | None) -> list[str]:
    current = last["next_watermark_ms"] if last else None
    head = (f"watermark {node_id or '?'}: query watermark {fmt_time(current) or 'none yet'}"
            + ("" if current is None
               else f" (lag {fmt_seconds(time.time() * 1000 - current)})"))
    out = [head]
    for p in last["watermark_partitions"] if last else []:
        if p["node"] != node_id:
            continue
        flags = ", idle" if p["idle"] else ""
        flags += ", holds the watermark" if p["holding"] else ""
        out.append(f"partition {p['partition']}: newest {p['column']} "
                   f"{fmt_time(p['max_event_time_ms'])}, no rows for "
                   f"{fmt_seconds(p['idle_ms'])}{flags}")
    return out


def _source_line(sid: str, entry: SourceProgress | None) -> str:
    if not entry:
        return f"source {sid}: no batch yet"
    lag = entry["lag"]
    return (f"source {sid}: read up to {json.dumps(entry['end_offset'])}; lag "
            + (lag_text(lag["records"], lag["seconds"], lag["unit"]) if lag else "unknown"))


def _batch_line(r: ProgressRecord) -> str:
    latency = r["latency_ms"]
    return (f"batch {r['batch_id']} at {fmt_time(r['timestamp_ms'])}: "
            f"{fmt_int(r['input_rows'])} rows in, {fmt_int(r['output_rows'])} out, "
            f"{fmt_int(r['late_rows'])} late, {fmt_int(r['dead_letter_rows'])} dead "
            f"letters, {r['duration_ms'].get('total', 0):.1f} ms"
            + (f", sink latency max {fmt_seconds(latency['max_ms'])}" if latency else ""))


def query_html(query: QuerySnapshot) -> str:
    """A notebook cell's view of ``query``."""
    e = html.escape
    recent = list(query.recent)
    last = query.last
    colour = "#070" if query.is_active else "#b00" if query.failed else "#666"
    facts: list[tuple[str, str]] = [
        ("id", str(query.id)),
        ("status", f"{query.message} ({'active' if query.is_active else 'terminated'})"),
        ("checkpoint", query.checkpoint),
    ]
    if query.metrics_url:
        facts.append(("metrics", query.metrics_url))
    if last:
        lag = last["source_lag_records"]
        facts += [
            ("newest batch", _batch_line(last)),
            ("watermark", f"{fmt_time(last['next_watermark_ms']) or 'none'}"),
            ("source lag", "unknown" if lag is None
             else lag_text(lag, last["source_lag_seconds"])),
            ("state", f"{fmt_int(last['state_rows'])} rows, "
                      f"{fmt_bytes(last['state_bytes'])}"),
        ]
    for alarm in alarms(recent):
        facts.append((f"alarm: {alarm['code']}", alarm["message"]))
    rows = "".join(
        f'<tr><th style="text-align:left">{e(k)}</th><td style="text-align:left">{e(v)}</td></tr>'
        for k, v in facts
    )
    head = ("batch", "rows in", "rows out", "rows/s", "ms", "late", "lag", "watermark lag")
    batch_rows = "".join(
        "<tr>" + "".join(f"<td>{e(c)}</td>" for c in (
            str(r["batch_id"]), fmt_int(r["input_rows"]), fmt_int(r["output_rows"]),
            fmt_int(r["processed_rows_per_second"]),
            f"{r['duration_ms'].get('total', 0):.1f}", fmt_int(r["late_rows"]),
            fmt_int(r["source_lag_records"]), fmt_seconds(r["watermark_lag_ms"]),
        )) + "</tr>"
        for r in recent[-RECENT_ROWS:]
    )
    table = (f"<table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{batch_rows}</table>"
             if recent else "<p>no batch yet</p>")
    name = e(query.name or "StreamingQuery")
    return (f'<div class="microbatch-query"><b>{name}</b> '
            f'<span style="color:{colour}">● {e(query.message)}</span>'
            f"<table>{rows}</table><b>recent batches</b>{table}</div>")
