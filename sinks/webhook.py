"""POST each result row to an HTTP endpoint, with an ``Idempotency-Key``.

Delivery is at least once per key, and a key always carries the same body, so
a receiver that keeps the keys it has seen (the ``Idempotency-Key`` convention
of Stripe and the IETF draft) gets every row exactly once:

- the body of a row is its JSON object as ``DataFrame.write_ndjson`` writes it
  (decimals as exact strings, datetimes in ISO-8601); the engine replays a batch
  with the same rows, so a redelivery is byte-for-byte the same request;
- ``Idempotency-Key`` is the row's ``key`` column (an alert id); in batch mode
  (``batch_size=N``: JSON arrays of up to N rows) it is a hash of the chunk's
  keys, equally stable;
- failures that may succeed later are retried with exponential backoff and
  full jitter: connection errors, timeouts, 408, 429 (honouring
  ``Retry-After``) and 5xx, until ``retry_for`` seconds have passed since the
  batch started; then the batch fails (it is re-run on the next start). Other
  4xx answers are final: the row goes to the dead-letter sink with the status
  and an excerpt of the answer, and is not retried;
- at most ``max_in_flight`` requests are open at once, so one slow answer does
  not serialise a batch, and one receiver is not flooded;
- ``add_batch`` returns only when every row was acknowledged (2xx) or
  dead-lettered; then the batch id is recorded in a ledger in the checkpoint,
  so a batch whose commit was cut short by a crash is not posted again (a
  batch without rows posts nothing and records nothing: no write, no fsync).

The bearer token is read from an environment variable when the sink opens; it
is sent in the ``Authorization`` header only and never appears in a
description, log line, progress record or error. HTTPS certificates are
verified unless ``verify=False``.

HTTP client: the standard library's ``http.client``, one persistent (HTTP/1.1
keep-alive) connection per sending thread, so a batch's POSTs reuse at most
``max_in_flight`` connections and no thread waits on another's pool lock. It
replaced httpx (wave 3, issue 31 item 6): on the fraud demo's ~150 POSTs a
batch, httpx's per-request Python work and its shared pool cost 2-3x the
time of the POSTs themselves (``benchmarks/fraud_sinks.py``). The timeout
applies to the connect and to each read and write; HTTPS verifies the
certificate and host name (``ssl.create_default_context``); redirects are
not followed (a 3xx is a refusal); proxies from ``HTTP(S)_PROXY`` are not
used. A kept-alive connection the receiver closed while idle is reopened and
the request sent again at once (the same key and body: harmless).
"""

from __future__ import annotations

import email.utils
import hashlib
import http.client
import logging
import os
import random
import ssl
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import polars as pl

from sinks.base import BatchContext, OutputMode, Sink, SinkContext
from sinks.exceptions import SinkConfigError, SinkError
from statestore.durable import make_dirs, write_atomic

__all__ = ["WebhookSink"]

log = logging.getLogger("sinks.webhook")

RETRY_STATUS = frozenset({408, 429}) | frozenset(range(500, 600))
"""Answers that may succeed on a later attempt."""
BODY_EXCERPT = 500
"""Characters of a refusing answer kept in its dead letter."""
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
"""How a kept-alive connection that the receiver closed while idle fails."""
DEAD_LETTER_SCHEMA = pl.Schema(
    {
        "idempotency_key": pl.String(),
        "status": pl.Int64(),
        "response": pl.String(),
        "request_body": pl.String(),
        "batch_id": pl.Int64(),
    }
)
"""The webhook's dead letters: the answer that refused a row, and the row."""


@dataclass(frozen=True)
class _Request:
    key: str
    body: bytes


@dataclass(frozen=True)
class _Answer:
    status: int
    retry_after: str | None
    text: str


@dataclass
class _Outcome:
    status: int | None = None
    response: str = ""
    attempts: int = 0
    latencies_ms: list[float] = field(default_factory=list)


class WebhookSink(Sink):
    """POSTs every row (or chunk of rows) of a batch to ``url``; see the module doc.

    Parameters
    ----------
    url
        The endpoint (``https://...``; ``http://`` for a receiver on loopback).
    key
        The column whose value is each row's ``Idempotency-Key`` (a
        deterministic id, e.g. an alert id).
    batch_size
        ``None``: one POST per row, a JSON object. ``N``: JSON arrays of up to
        ``N`` rows.
    timeout
        Seconds to connect, and to wait for each read/write.
    headers
        Extra request headers (values may be secret: only their names are shown).
    token_env
        The name of an environment variable holding a bearer token.
    max_in_flight
        Requests open at the same time.
    retry_for
        Seconds a batch keeps retrying failures that may succeed later; then it
        fails with an error naming the last failure.
    backoff
        ``(first, longest)`` retry delay in seconds, doubling, with full jitter.
    verify
        Verify HTTPS certificates (``True``), not (``False``), or a CA bundle path.
    dead_letters
        Where refused rows go; default: Parquet under the checkpoint's
        ``dead_letter_webhook/``, exactly once per batch.
    """

    supported_modes: tuple[OutputMode, ...] = ("append", "update")
    mode_advice = "A webhook receives rows as they come: use append or update."

    def __init__(
        self,
        url: str,
        *,
        key: str,
        batch_size: int | None = None,
        timeout: float = 10.0,
        headers: Mapping[str, str] | None = None,
        token_env: str | None = None,
        max_in_flight: int = 8,
        retry_for: float = 600.0,
        backoff: tuple[float, float] = (0.2, 30.0),
        verify: bool | str = True,
        dead_letters: Sink | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise SinkConfigError(f"write_webhook needs an http(s):// URL, got {url!r}")
        if not isinstance(key, str) or not key:
            raise SinkConfigError("write_webhook needs key='<column>' for the Idempotency-Key")
        if batch_size is not None and (isinstance(batch_size, bool) or batch_size < 1):
            raise SinkConfigError(f"batch_size must be None or >= 1, got {batch_size!r}")
        if max_in_flight < 1:
            raise SinkConfigError(f"max_in_flight must be >= 1, got {max_in_flight!r}")
        if timeout <= 0 or retry_for < 0 or not 0 < backoff[0] <= backoff[1]:
            raise SinkConfigError(
                "write_webhook: timeout must be > 0, retry_for >= 0 and 0 < backoff[0] <= "
                f"backoff[1]; got timeout={timeout}, retry_for={retry_for}, backoff={backoff}"
            )
        self.url = url
        self.key = key
        self.batch_size = batch_size
        self.timeout = float(timeout)
        self.headers = dict(headers or {})
        self.token_env = token_env
        self.max_in_flight = max_in_flight
        self.retry_for = float(retry_for)
        self.backoff = (float(backoff[0]), float(backoff[1]))
        self.verify = verify
        self.dead_letters = dead_letters
        self._headers: dict[str, str] = {}
        self._target = "/"
        self._ssl: ssl.SSLContext | None = None
        self._connections: list[http.client.HTTPConnection] = []
        self._local = threading.local()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._ledger: Path | None = None
        self._last: dict[str, Any] = {}
        self._abandon = threading.Event()
        """Set when a batch failed: requests still retrying give up."""

    # ------------------------------------------------------------------ identity

    @property
    def shown_url(self) -> str:
        """The URL without its query string (which may carry a secret)."""
        base, _, query = self.url.partition("?")
        return base + ("?…" if query else "")

    @property
    def label(self) -> str:
        return f"WebhookSink({self.shown_url!r})"

    def describe(self) -> dict[str, Any]:
        """Kind, URL (no query string), key and options; header names only, no token."""
        return {
            "kind": type(self).__name__,
            "url": self.shown_url,
            "key": self.key,
            "batch_size": self.batch_size,
            "headers": sorted(self.headers),
            "token_env": self.token_env,
            "max_in_flight": self.max_in_flight,
            "retry_for_s": self.retry_for,
        }

    def metrics(self) -> dict[str, Any]:
        """The last batch's posts, retries, dead letters and response times."""
        return dict(self._last)

    # ------------------------------------------------------------------ lifecycle

    def on_open(self, ctx: SinkContext) -> None:
        """Start the thread pool; read the token; find the ledger."""
        self.close()
        headers = {"Content-Type": "application/json", **self.headers}
        if self.token_env:
            token = os.environ.get(self.token_env)
            if not token:
                raise SinkConfigError(
                    f"{self.label}: the environment variable {self.token_env} (the bearer "
                    "token) is not set; export it before starting the query"
                )
            headers["Authorization"] = f"Bearer {token}"
        self._headers = headers
        parts = urlsplit(self.url)
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._ssl = _ssl_context(self.verify) if parts.scheme == "https" else None
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(self.max_in_flight, thread_name_prefix="microbatch-webhook")
        if ctx.checkpoint_dir is not None:
            digest = hashlib.sha256(f"{self.shown_url} {self.key}".encode()).hexdigest()[:12]
            self._ledger = Path(ctx.checkpoint_dir) / "sinks" / f"webhook-{digest}"
            make_dirs(self._ledger)
        if self.dead_letters is None and ctx.checkpoint_dir is not None:
            from sinks.parquet import ParquetSink

            self.dead_letters = ParquetSink(Path(ctx.checkpoint_dir) / "dead_letter_webhook")
        if self.dead_letters is not None:
            self.dead_letters.open(SinkContext(query_id=ctx.query_id, fault_point=ctx.fault_point,
                                               checkpoint_dir=ctx.checkpoint_dir))

    def close(self) -> None:
        """Finish the requests in flight, then close the connections."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()
        if self.dead_letters is not None:
            self.dead_letters.close()

    # ------------------------------------------------------------------ writing

    def is_written(self, batch: BatchContext) -> bool:
        """Every row of the batch was acknowledged or dead-lettered before (the ledger)."""
        return self._ledger is not None and (self._ledger / str(batch.batch_id)).exists()

    def write(self, batch: BatchContext, df: pl.DataFrame) -> None:
        """POST the batch's rows; return once each was acknowledged or dead-lettered."""
        requests = self._requests(df, batch.batch_id)
        started = time.monotonic()
        deadline = started + self.retry_for
        assert self._pool is not None
        self._abandon.clear()
        futures = [self._pool.submit(self._deliver, r, deadline) for r in requests]
        try:
            outcomes = [f.result() for f in futures]
        except BaseException:
            # NOTE: the batch has failed; stop the other requests' retries before
            # re-raising, so the next attempt starts from a quiet pool
            self._abandon.set()
            for f in futures:
                f.exception()
            raise
        refused = [(r, o) for r, o in zip(requests, outcomes, strict=True) if not _ok(o.status)]
        if refused:
            assert self.dead_letters is not None, "opened with a checkpoint or dead_letters"
            self.dead_letters.add_batch(batch.batch_id, _dead_letter_frame(refused, batch.batch_id))
        batch.at("sink.after_data")
        if self._ledger is not None and requests:  # nothing posted: a re-run posts nothing
            write_atomic(self._ledger / str(batch.batch_id), b"{}\n")
        latencies = sorted(ms for o in outcomes for ms in o.latencies_ms)
        self._last = {
            "batch_id": batch.batch_id,
            "posts": sum(o.attempts for o in outcomes),
            "rows": df.height,
            "requests": len(requests),
            "retries": sum(o.attempts - 1 for o in outcomes),
            "dead_letters": len(refused),
            "p50_ms": _quantile(latencies, 0.5),
            "p99_ms": _quantile(latencies, 0.99),
            "seconds": round(time.monotonic() - started, 3),
        }

    def _requests(self, df: pl.DataFrame, batch_id: int) -> list[_Request]:
        if df.height == 0:
            return []
        if self.key not in df.columns:
            raise SinkError(
                f"{self.label}: batch {batch_id} has no key column {self.key!r} for the "
                f"Idempotency-Key; its columns are {df.columns}"
            )
        keys = df.get_column(self.key).cast(pl.String)
        if keys.null_count():
            raise SinkError(
                f"{self.label}: batch {batch_id} has {keys.null_count()} row(s) with a null "
                f"{self.key!r}; every row needs an Idempotency-Key"
            )
        if keys.str.contains("[\r\n]").any():
            raise SinkError(
                f"{self.label}: batch {batch_id} has a {self.key!r} with a line break, which "
                "an HTTP header (the Idempotency-Key) cannot carry; strip it in the query"
            )
        lines = df.write_ndjson().encode().split(b"\n")[: df.height]
        names = keys.to_list()
        if self.batch_size is None:
            return [_Request(k, body) for k, body in zip(names, lines, strict=True)]
        out = []
        for lo in range(0, df.height, self.batch_size):
            chunk = names[lo : lo + self.batch_size]
            key = hashlib.sha256("\n".join(chunk).encode()).hexdigest()[:32]
            out.append(_Request(key, b"[" + b",".join(lines[lo : lo + self.batch_size]) + b"]"))
        return out

    def _deliver(self, request: _Request, deadline: float) -> _Outcome:
        """One request, retried while it may succeed later and time is left."""
        outcome = _Outcome()
        delay = self.backoff[0]
        last = ""
        while not self._abandon.is_set():
            outcome.attempts += 1
            wait: float | None = None
            t0 = time.monotonic()
            try:
                answer = self._post(request)
            except (OSError, http.client.HTTPException) as exc:  # refused, reset, timeout...
                last = f"{type(exc).__name__}: {exc}"
            else:
                outcome.latencies_ms.append((time.monotonic() - t0) * 1000)
                if answer.status not in RETRY_STATUS:
                    outcome.status = answer.status
                    outcome.response = "" if _ok(answer.status) else answer.text[:BODY_EXCERPT]
                    return outcome
                last = f"HTTP {answer.status}"
                wait = _retry_after(answer.retry_after)
            if wait is None:
                wait = random.uniform(0, delay)  # full jitter
                delay = min(delay * 2, self.backoff[1])
            if time.monotonic() + wait > deadline:
                raise SinkError(
                    f"{self.label}: no acknowledgement for key {request.key!r} after "
                    f"{outcome.attempts} attempt(s) in {self.retry_for:.0f} s (last: {last}); "
                    "the receiver is down or refusing: the batch was not committed and is "
                    "posted again on the next start (the same keys and bodies)"
                )
            log.info("%s: key %s: %s; retry in %.2f s", self.label, request.key, last, wait)
            self._abandon.wait(wait)
        raise SinkError(f"{self.label}: key {request.key!r} abandoned: the batch failed")

    def _post(self, request: _Request) -> _Answer:
        """POST ``request`` on this thread's connection; a kept-alive connection
        that the receiver closed while idle is reopened and the request sent again."""
        headers = {**self._headers, "Idempotency-Key": request.key}
        connection = self._connection()
        reused = connection.sock is not None
        while True:
            try:
                connection.request("POST", self._target, body=request.body, headers=headers)
                answer = connection.getresponse()
                text = answer.read()
            except _STALE:
                connection.close()
                if not reused:
                    raise
                reused = False
                continue
            except BaseException:
                connection.close()  # a half-done exchange leaves the connection unusable
                raise
            return _Answer(answer.status, answer.getheader("Retry-After"),
                           "" if _ok(answer.status) else text.decode("utf-8", "replace"))

    def _connection(self) -> http.client.HTTPConnection:
        """This thread's connection to the receiver (opened on first use)."""
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is None:
            parts = urlsplit(self.url)
            host, port = parts.hostname or "", parts.port
            if self._ssl is not None:
                connection = http.client.HTTPSConnection(host, port, timeout=self.timeout,
                                                         context=self._ssl)
            else:
                connection = http.client.HTTPConnection(host, port, timeout=self.timeout)
            self._local.connection = connection
            with self._lock:
                self._connections.append(connection)
        return connection


def _ok(status: int | None) -> bool:
    return status is not None and 200 <= status < 300


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (a number, or an HTTP date), ``None`` when absent."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _dead_letter_frame(refused: list[tuple[_Request, _Outcome]], batch_id: int) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "idempotency_key": [r.key for r, _ in refused],
            "status": [o.status for _, o in refused],
            "response": [o.response for _, o in refused],
            "request_body": [r.body.decode() for r, _ in refused],
            "batch_id": [batch_id] * len(refused),
        },
        schema=DEAD_LETTER_SCHEMA,
    )


def _quantile(sorted_ms: list[float], q: float) -> float | None:
    if not sorted_ms:
        return None
    return round(sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))], 2)


def _ssl_context(verify: bool | str) -> ssl.SSLContext:
    """Verify the certificate and host name (``True``), against a CA bundle (a
    path), or not at all (``False``)."""
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    context = ssl.create_default_context()
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context
