"""Connecting a query's driver to Ray, with safe defaults.

Without an address (and without ``RAY_ADDRESS``), the first scaled-out query
of a process starts a local Ray cluster on 127.0.0.1 and the last one to
close shuts it down. With an address, it joins that cluster as a driver.

Defaults (docs/scale-out.md): usage statistics off
(``RAY_USAGE_STATS_ENABLED=0`` unless set), no dashboard, the local cluster
bound to 127.0.0.1; Ray's token authentication is left as Ray configures it
(a cluster started with a token needs ``RAY_AUTH_TOKEN`` or its token file in
the driver's environment).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

from microbatch.exceptions import ExecutorError


class _Shared:
    """The process-wide connection's users (Ray has one connection per process)."""

    lock = threading.Lock()
    users = 0
    started_here = False


FORWARDED_ENV = ("MICROBATCH_FAULT", "MICROBATCH_FAULT_ACTION", "MICROBATCH_FAULT_ONCE")
"""Environment variables the driver passes to its workers (crash tests)."""


def import_ray() -> Any:
    """The ``ray`` module, or a clear error naming the extra to install."""
    try:
        import ray
    except ImportError as exc:
        raise ExecutorError(
            "the Ray executor needs Ray, which is not installed in this environment: "
            "pip install 'microbatch[ray]'"
        ) from exc
    return ray


@dataclass
class RayConnection:
    """One query's use of the process-wide Ray connection (reference counted)."""

    address: str | None = None
    num_cpus: int | None = None
    connected: bool = field(default=False, init=False)

    def connect(self) -> None:
        """Join the cluster at ``address``, or start (or reuse) a local one."""
        ray = import_ray()
        with _Shared.lock:
            if self.connected:
                return
            if not ray.is_initialized():
                os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
                env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
                options: dict[str, Any] = {
                    "include_dashboard": False,
                    "log_to_driver": False,
                    "configure_logging": False,
                    "namespace": "microbatch",
                    "runtime_env": {"env_vars": env} if env else None,
                }
                address = self.address or os.environ.get("RAY_ADDRESS")
                if not address:
                    options.update(num_cpus=self.num_cpus or os.cpu_count() or 1,
                                   _node_ip_address="127.0.0.1")
                try:
                    ray.init(address=address, **options)
                except (ConnectionError, RuntimeError, ValueError) as exc:
                    where = f"the Ray cluster at {address}" if address else "a local Ray cluster"
                    raise ExecutorError(
                        f"could not connect to {where}: {exc}. Check the address (ray status "
                        "on the head node prints it), that this machine can reach it, and that "
                        "RAY_AUTH_TOKEN is set if the cluster uses token authentication."
                    ) from exc
                _Shared.started_here = not address
            _Shared.users += 1
            self.connected = True

    def lost_local_raylet(self) -> str | None:
        """What became of the raylet of the local cluster this process started
        (``None``: alive, or not a cluster started here).

        Ray notices a dead raylet on its own only after its health checks
        fail (about 17 s with the defaults) and meanwhile leaves a driver
        waiting on actors that cannot start; the process handle tells at once."""
        if not _Shared.started_here:
            return None
        import ray

        node = getattr(ray._private.worker, "_global_node", None)  # NOTE: no public handle
        handles = getattr(node, "all_processes", {}).get("raylet", []) if node else []
        for handle in handles:
            process = getattr(handle, "process", None)
            if process is None:
                continue
            code = process.poll()
            if code is not None:
                how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
                return f"the raylet (pid {process.pid}) of the local Ray cluster has exited ({how})"
        return None

    def release(self) -> None:
        """Stop using Ray; the last query of a process that started a local
        cluster shuts it down."""
        with _Shared.lock:
            if not self.connected:
                return
            self.connected = False
            _Shared.users -= 1
            if _Shared.users == 0 and _Shared.started_here:
                import ray

                ray.shutdown()
                _Shared.started_here = False
