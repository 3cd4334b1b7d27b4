"""moto's S3 server with atomic conditional PUTs, for the tests' local S3.

moto answers ``PUT`` with ``If-None-Match: *`` by checking whether the key
exists and then writing it, without a lock, in a threaded server: two
concurrent conditional PUTs of one key can both succeed, which S3 never
allows. delta-rs commits a table version with such a PUT, so a race of two
writers (``tests/delta/test_delta_s3.py``) could see both commits "succeed"
on moto -- the second log entry replacing the first -- and neither writer
find a conflict (seen once under heavy load). Serializing ``put_object``
makes the check and the write one step, as on S3; nothing else changes.

Run as moto's own server: ``python tests/atomic_moto_server.py -H 127.0.0.1 -p 0``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from moto.s3.responses import S3Response
from moto.server import main

_PUTS = threading.Lock()


def _one_at_a_time(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def put(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _PUTS:
            return method(self, *args, **kwargs)

    return put


S3Response.put_object = _one_at_a_time(S3Response.put_object)  # type: ignore[method-assign]

if __name__ == "__main__":
    main()
