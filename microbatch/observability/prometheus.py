"""Prometheus metrics of a running query, served over HTTP.

``writer.start(..., metrics_port=9108)`` or ``microbatch run --metrics-port
9108`` serves ``/metrics`` while the query runs. The figures are the
progress records' (see :mod:`microbatch.observability.record`), read at scrape time
from the query's handle, so serving costs the query nothing between scrapes.
Every series has the label ``query`` (the query's name, else its id):

=================================================  ========  ===========================
name                                               type      labels
=================================================  ========  ===========================
``microbatch_query_active``                        gauge
``microbatch_batches_total``                       counter
``microbatch_input_rows_total``                    counter
``microbatch_source_input_rows_total``             counter   ``source``
``microbatch_output_rows_total``                   counter
``microbatch_late_rows_total``                     counter
``microbatch_dead_letter_rows_total``              counter
``microbatch_last_batch_id``                       gauge
``microbatch_input_rows_per_second``               gauge
``microbatch_processed_rows_per_second``           gauge
``microbatch_batch_duration_seconds``              gauge
``microbatch_batch_step_duration_seconds``         gauge     ``step``
``microbatch_trigger_interval_seconds``            gauge
``microbatch_falling_behind``                      gauge
``microbatch_watermark_seconds``                   gauge
``microbatch_watermark_lag_seconds``               gauge
``microbatch_source_lag_records``                  gauge     ``source``, ``partition``
``microbatch_source_lag_seconds``                  gauge     ``source``, ``partition``
``microbatch_state_rows``                          gauge     ``operator``
``microbatch_state_bytes``                         gauge     ``operator``
``microbatch_state_commit_seconds``                gauge     ``operator``
``microbatch_sink_write_seconds``                  gauge
``microbatch_end_to_end_latency_seconds``          gauge     ``quantile`` (0.5, 1)
=================================================  ========  ===========================

Counters count the batches of this run (they restart at 0 with the
process, as Prometheus expects). Gauges are the newest batch's, except the
watermark lag, which is measured at scrape time against the current
watermark (so it keeps growing while a query is stuck). Sources are labelled
by their id in the query (``0``, ``1``…; ``microbatch status`` lists them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from microbatch.exceptions import MicrobatchError
from microbatch.observability.progress_schema import ProgressRecord, step_durations

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from microbatch.observability.snapshot import QuerySnapshot

PREFIX = "microbatch_"


class QueryCollector:
    """A Prometheus collector reading one query's snapshot at each scrape."""

    def __init__(self, snapshot: Callable[[], QuerySnapshot]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        """Every metric of the module docstring, from the newest progress record."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        q = self.snapshot()
        label = q.label
        totals, last = q.totals, q.last

        def gauge(name: str, doc: str, value: float | None, **labels: str) -> Metric:
            family = GaugeMetricFamily(PREFIX + name, doc, labels=["query", *labels])
            if value is not None:
                family.add_metric([label, *labels.values()], float(value))
            return family

        def counter(name: str, doc: str, value: float) -> Metric:
            family = CounterMetricFamily(PREFIX + name, doc, labels=["query"])
            family.add_metric([label], float(value))
            return family

        yield gauge("query_active", "1 while the query runs.", 1 if q.is_active else 0)
        yield counter("batches", "Batches run by this process.", totals["batches"])
        yield counter("input_rows", "Rows read from all sources.", totals["input_rows"])
        yield counter("output_rows", "Rows handed to the sink.", totals["output_rows"])
        yield counter("late_rows", "Rows dropped as late (to the late output).",
                      totals["late_rows"])
        yield counter("dead_letter_rows", "Malformed input records.", totals["dead_letter_rows"])
        per_source = CounterMetricFamily(PREFIX + "source_input_rows", "Rows read per source.",
                                         labels=["query", "source"])
        for sid, rows in sorted(totals["sources"].items()):
            per_source.add_metric([label, sid], float(rows))
        yield per_source
        if last is None:
            return
        yield from _batch_gauges(last, label, gauge)
        yield from _labelled_gauges(last, label)


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000


def _batch_gauges(last: ProgressRecord, label: str, gauge: Any) -> Iterator[Metric]:
    yield gauge("last_batch_id", "Id of the newest batch.", last["batch_id"])
    yield gauge("input_rows_per_second", "Input rate of the newest batch.",
                last["input_rows_per_second"])
    yield gauge("processed_rows_per_second", "Processing rate of the newest batch.",
                last["processed_rows_per_second"])
    yield gauge("batch_duration_seconds", "Duration of the newest batch.",
                _seconds(last["duration_ms"].get("total")))
    yield gauge("trigger_interval_seconds", "The processing-time trigger's interval.",
                _seconds(last["trigger_interval_ms"]))
    yield gauge("falling_behind", "1 when the newest batch overran the trigger interval.",
                1 if last["falling_behind"] else 0)
    watermark = last["next_watermark_ms"]
    yield gauge("watermark_seconds", "The current event-time watermark (epoch seconds).",
                _seconds(watermark))
    yield gauge("watermark_lag_seconds", "Wall clock minus the current watermark.",
                None if watermark is None else time.time() - watermark / 1000)
    yield gauge("sink_write_seconds", "Time the sink took to take the newest batch.",
                _seconds(last["sink"]["write_ms"] if last["sink"] else None))


def _labelled_gauges(last: ProgressRecord, label: str) -> Iterator[Metric]:
    from prometheus_client.core import GaugeMetricFamily

    steps = GaugeMetricFamily(PREFIX + "batch_step_duration_seconds",
                              "Duration of each lifecycle step of the newest batch.",
                              labels=["query", "step"])
    for step, ms in step_durations(last).items():
        if step != "total":
            steps.add_metric([label, step], ms / 1000)
    yield steps
    lag_records = GaugeMetricFamily(PREFIX + "source_lag_records",
                                    "Records (files, for a files source) not read yet.",
                                    labels=["query", "source", "partition"])
    lag_seconds = GaugeMetricFamily(PREFIX + "source_lag_seconds",
                                    "Age of the oldest record not read yet.",
                                    labels=["query", "source", "partition"])
    for source in last["sources"]:
        lag = source["lag"]
        for pid, part in (lag["partitions"] if lag else {}).items():
            if (records := part.get("records")) is not None:
                lag_records.add_metric([label, source["id"], pid], records)
            if (seconds := part.get("seconds")) is not None:
                lag_seconds.add_metric([label, source["id"], pid], seconds)
    yield lag_records
    yield lag_seconds
    rows = GaugeMetricFamily(PREFIX + "state_rows", "Rows in an operator's state.",
                             labels=["query", "operator"])
    size = GaugeMetricFamily(PREFIX + "state_bytes", "Memory held by an operator's state.",
                             labels=["query", "operator"])
    commit = GaugeMetricFamily(PREFIX + "state_commit_seconds",
                               "Time to commit an operator's state version.",
                               labels=["query", "operator"])
    for op_id, figures in sorted(last["state"].items()):
        if (n := figures.get("rows")) is not None:
            rows.add_metric([label, op_id], n)
        if (b := figures.get("bytes")) is not None:
            size.add_metric([label, op_id], b)
        if (commit_ms := figures.get("commit_ms")) is not None:
            commit.add_metric([label, op_id], commit_ms / 1000)
    yield from (rows, size, commit)
    latency = GaugeMetricFamily(PREFIX + "end_to_end_latency_seconds",
                                "Now minus event time of the rows written by the newest batch.",
                                labels=["query", "quantile"])
    measured = last["latency_ms"]
    if measured is not None:
        latency.add_metric([label, "0.5"], measured["median_ms"] / 1000)
        latency.add_metric([label, "1"], measured["max_ms"] / 1000)
    yield latency


class MetricsServer:
    """``/metrics`` for one query on ``host:port`` (``port=0``: a free port)."""

    def __init__(
        self, snapshot: Callable[[], QuerySnapshot], *, port: int, host: str = "127.0.0.1"
    ) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(QueryCollector(snapshot))
        try:
            server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise MicrobatchError(
                f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}. Choose another "
                "port (metrics_port=... or --metrics-port), or 0 for any free port."
            ) from exc
        self._server: Any = server
        self.host = host
        self.port: int = server.server_port

    @property
    def url(self) -> str:
        """Where the metrics are served."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        """Stop serving and free the port (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            self._thread.join(5)
