"""An HTTP proxy in front of a local S3 server that injects faults on request.

Run as its own process (so that a test can SIGKILL it mid-request)::

    python tests/s3_fault_proxy.py --upstream http://127.0.0.1:PORT --port 0 \\
        --control faults.json --log requests.jsonl

It prints ``listening on http://127.0.0.1:PORT`` once it accepts connections.
Every request is forwarded to ``--upstream`` unless the control file (read on
each request; missing means no faults) says otherwise::

    {"match": "PUT .*/_delta_log/.*\\\\.json", "answer": "503", "count": 3}

``match`` is a regular expression searched in ``"METHOD PATH"``; ``answer`` is
``500`` (InternalError), ``503`` (ServiceUnavailable), ``slowdown`` (503
SlowDown, S3's throttling answer), ``hang_before`` (hold the request without
forwarding it) or ``hang_after`` (forward it, then hold the answer: the store
has the object, the client never hears so); ``count`` is how many matching
requests get it (``-1``: all). Each request is one JSON line in ``--log``:
``{"method", "path", "answer"}`` (``answer`` is the injected fault or the
upstream's status), written before a held request starts waiting.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ERRORS = {
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "ServiceUnavailable", "Service is unable to handle request."),
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
}


class Faults:
    """The control file's rule and how many requests it has hit."""

    def __init__(self, control: Path, log: Path) -> None:
        self.control, self.log = control, log
        self.lock = threading.Lock()
        self.used: dict[str, int] = {}

    def answer_for(self, method: str, path: str) -> str | None:
        try:
            rule = json.loads(self.control.read_text())
        except (OSError, ValueError):
            return None
        if not re.search(rule.get("match", ""), f"{method} {path}"):
            return None
        key = json.dumps(rule, sort_keys=True)
        with self.lock:
            used = self.used.get(key, 0)
            if 0 <= int(rule.get("count", -1)) <= used:
                return None
            self.used[key] = used + 1
        return str(rule["answer"])

    def record(self, method: str, path: str, answer: str) -> None:
        with self.lock, self.log.open("a") as out:
            out.write(json.dumps({"method": method, "path": path, "answer": answer}) + "\n")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream: tuple[str, int]
    faults: Faults

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                chunk = self.rfile.read(size)
                self.rfile.readline()
                if size == 0:
                    return b"".join(chunks)
                chunks.append(chunk)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _proxy(self) -> None:
        body = self._body()
        method, path = self.command, self.path
        answer = self.faults.answer_for(method, path)
        if answer in ERRORS:
            status, code, message = ERRORS[answer]
            self.faults.record(method, path, answer)
            xml = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                   f"<Message>{message}</Message><RequestId>fault</RequestId></Error>").encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(xml)))
            self.end_headers()
            self.wfile.write(xml)
            return
        if answer == "hang_before":
            self.faults.record(method, path, answer)
            while True:
                time.sleep(3600)
        headers = {k: v for k, v in self.headers.items()
                   if k.lower() not in ("transfer-encoding", "connection")}
        headers["Content-Length"] = str(len(body))
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            conn.request(method, path, body=body if body or method in ("PUT", "POST") else None,
                         headers=headers)
            reply = conn.getresponse()
            data = reply.read()
        finally:
            conn.close()
        if answer == "hang_after":
            self.faults.record(method, path, answer)
            while True:
                time.sleep(3600)
        self.faults.record(method, path, str(reply.status))
        self.send_response(reply.status)
        for k, v in reply.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length", "server",
                                 "date"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _proxy

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--control", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True)
    args = parser.parse_args(argv)
    up = urlsplit(args.upstream)
    Handler.upstream = (up.hostname or "127.0.0.1", up.port or 80)
    Handler.faults = Faults(args.control, args.log)
    ThreadingHTTPServer.allow_reuse_address = True
    ThreadingHTTPServer.daemon_threads = True
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
