"""The webhook receiver (a test and demo tool) judges only whole requests."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

from microbatch.tools.receiver import Receiver, running


def test_a_request_cut_off_mid_body_is_not_received(tmp_path: Path) -> None:
    """A client killed while sending its body (the webhook sink under SIGKILL) left
    a request with headers and no body: logging it made the same key's real body a
    409 conflict later."""
    rec = Receiver(log=tmp_path / "received.jsonl")
    with running(rec) as url:
        parts = urlsplit(url)
        with socket.create_connection((parts.hostname, parts.port)) as sock:
            sock.sendall(b"POST /hook HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k-1\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 40\r\n\r\n{\"a\":")
        time.sleep(0.2)  # the server thread sees the connection close mid-body
        assert rec.stats()["keys"] == 0
    assert (tmp_path / "received.jsonl").read_text() == ""
