"""A local webhook receiver that honours ``Idempotency-Key``: for the demo, the
latency benchmark and the webhook sink's tests.

It accepts POSTs on any path, keeps the first body of every key, answers a
repeat of the same key and body with 200 (a duplicate, counted), and a repeat
with a *different* body with 409 (a conflict: the sender broke its promise;
counted and logged). Every received request is one JSON line in ``--log``:
``{"key", "sha256", "received_ns", "status", "duplicate", "body"}``.
``GET /stats`` answers the counts.

For tests it misbehaves on request, reproducibly (``--seed``): answer 503
(``--fail-rate``), 429 with ``Retry-After`` (``--throttle-rate``), answer slowly
(``--slow-rate``, ``--slow-s``), and refuse for good with 422 the keys that end
with ``--reject-suffix``. A misbehaving answer never records the key.

Run::

    python -m microbatch.tools.receiver --port 0 --log received.jsonl

It prints ``listening on http://127.0.0.1:PORT`` once it accepts connections.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import random
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

__all__ = ["Receiver", "main", "running", "serve"]


class Receiver:
    """The receiver's state: keys seen, counts, the log, the misbehaviour."""

    def __init__(
        self,
        *,
        log: Path | None,
        seed: int = 0,
        fail_rate: float = 0.0,
        throttle_rate: float = 0.0,
        slow_rate: float = 0.0,
        slow_s: float = 1.0,
        reject_suffix: str | None = None,
    ) -> None:
        self.log = log.open("a", buffering=1) if log is not None else None
        self.random = random.Random(seed)
        self.fail_rate, self.throttle_rate = fail_rate, throttle_rate
        self.slow_rate, self.slow_s = slow_rate, slow_s
        self.reject_suffix = reject_suffix
        self.bodies: dict[str, str] = {}
        self.counts = {"accepted": 0, "duplicates": 0, "conflicts": 0, "failed": 0,
                       "throttled": 0, "rejected": 0, "slow": 0}
        self.lock = threading.Lock()

    def handle(self, key: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        """The answer to one POST: status, headers, body."""
        with self.lock:
            roll = self.random.random()
            slow = self.random.random() < self.slow_rate
        if slow:
            self._count("slow")
            time.sleep(self.slow_s)
        if not key:
            return 400, {}, b'{"error": "no Idempotency-Key"}'
        if self.reject_suffix and key.endswith(self.reject_suffix):
            self._count("rejected")
            return 422, {}, b'{"error": "rejected by the receiver\'s rules"}'
        if roll < self.fail_rate:
            self._count("failed")
            return 503, {}, b'{"error": "try again"}'
        if roll < self.fail_rate + self.throttle_rate:
            self._count("throttled")
            return 429, {"Retry-After": "1"}, b'{"error": "slow down"}'
        digest = hashlib.sha256(body).hexdigest()
        with self.lock:
            seen = self.bodies.get(key)
            if seen is None:
                self.bodies[key] = digest
                status, outcome = 200, "accepted"
            elif seen == digest:
                status, outcome = 200, "duplicates"
            else:
                status, outcome = 409, "conflicts"
            self.counts[outcome] += 1
            if self.log is not None:
                self.log.write(json.dumps({
                    "key": key, "sha256": digest, "received_ns": time.time_ns(),
                    "status": status, "duplicate": outcome == "duplicates",
                    "body": body.decode("utf-8", "replace"),
                }) + "\n")
        return status, {}, json.dumps({"outcome": outcome}).encode()

    def _count(self, name: str) -> None:
        with self.lock:
            self.counts[name] += 1

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {**self.counts, "keys": len(self.bodies)}

    def close(self) -> None:
        """Close the log file."""
        with self.lock:
            if self.log is not None:
                self.log.close()
                self.log = None


class _Handler(BaseHTTPRequestHandler):
    receiver: ClassVar[Receiver]
    protocol_version = "HTTP/1.1"  # keep-alive, as a real endpoint

    def setup(self) -> None:
        super().setup()
        # NOTE: headers and body leave in two writes; without TCP_NODELAY, Nagle's
        # algorithm holds the body until the client's delayed ACK (~40 ms a request)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if len(body) < length:
            # NOTE: the client went away mid-body (killed): an HTTP server never sees such a
            # request as received, so it must not be logged or judged (as a conflict)
            self.close_connection = True
            return
        status, headers, answer = self.receiver.handle(
            self.headers.get("Idempotency-Key", ""), body)
        self._answer(status, headers, answer)

    def do_GET(self) -> None:
        self._answer(200, {}, json.dumps(self.receiver.stats()).encode())

    def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        for name, value in {**headers, "Content-Type": "application/json",
                            "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the sender went away (killed)
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the log file has every request."""


def serve(receiver: Receiver, *, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """A started server (on a background thread) answering with ``receiver``."""
    handler = type("Handler", (_Handler,), {"receiver": receiver})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True, name="receiver").start()
    return server


@contextlib.contextmanager
def running(receiver: Receiver, *, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``receiver`` while the block runs; yields its base URL."""
    server = serve(receiver, host=host, port=port)
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        receiver.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m microbatch.tools.receiver``: serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fail-rate", type=float, default=0.0)
    parser.add_argument("--throttle-rate", type=float, default=0.0)
    parser.add_argument("--slow-rate", type=float, default=0.0)
    parser.add_argument("--slow-s", type=float, default=1.0)
    parser.add_argument("--reject-suffix", default=None)
    args = parser.parse_args(argv)
    receiver = Receiver(log=args.log, seed=args.seed, fail_rate=args.fail_rate,
                        throttle_rate=args.throttle_rate, slow_rate=args.slow_rate,
                        slow_s=args.slow_s, reject_suffix=args.reject_suffix)
    server = serve(receiver, port=args.port)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        receiver.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
