"""Jars from Maven Central into the repository's cache, and Java, for the local JVM services.

The one fetch path of the Kafka broker (:mod:`scripts.kafka_broker`) and the
Iceberg REST catalog (:mod:`scripts.iceberg_rest`): a tiny pom-packaged
``pom.xml`` in ``scripts/`` lists a service's dependencies, and Maven copies
their runtime closure into one flat folder of the cache,
``${MICROBATCH_CACHE:-~/.cache/microbatch}/<name>-<version>/lib``, outside the
repository. Maven's own repository is ``<cache>/m2``, shared by all services.

A folder is filled under a temporary name and renamed into place with a
``.complete`` marker, under one lock for the whole cache: an interrupted or
concurrent fetch (two xdist workers) never leaves or uses a half-filled ``lib``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
"""Pinned: Maven 3.8's default dependency plugin is too old for copy-dependencies
of a pom-packaged project."""
MARKER = ".complete"


class FetchError(RuntimeError):
    """Maven could not resolve a service's jars; the message carries its output."""


def cache_root() -> Path:
    """``$MICROBATCH_CACHE`` or ``~/.cache/microbatch``."""
    return Path(os.environ.get("MICROBATCH_CACHE") or Path.home() / ".cache" / "microbatch")


def lib_dir(name: str, version: str) -> Path:
    """Where the jars of service ``name`` at ``version`` live once fetched."""
    return cache_root() / f"{name}-{version}" / "lib"


def is_fetched(name: str, version: str) -> bool:
    """Whether a complete ``lib`` of ``name`` at ``version`` is in the cache."""
    return (lib_dir(name, version) / MARKER).exists()


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created) for the ``with`` block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def fetch_jars(
    pom: Path,
    name: str,
    version: str,
    *,
    properties: Mapping[str, str],
    expect: str,
    quiet: bool = False,
) -> Path:
    """The cached ``lib`` of ``name`` at ``version``, resolved from ``pom`` if missing.

    ``properties`` are passed to Maven as ``-Dkey=value`` (the version the pom
    reads); ``expect`` is a glob that must match a copied jar, or the fetch
    counts as failed. Raises :class:`FetchError` with the end of Maven's output.
    """
    lib = lib_dir(name, version)
    if (lib / MARKER).exists():
        return lib
    if shutil.which("mvn") is None:
        raise FetchError(f"fetching the {name} jars needs Maven (mvn) on PATH")
    with locked(cache_root() / ".fetch.lock"):
        if (lib / MARKER).exists():  # another process fetched it while we waited
            return lib
        tmp = lib.with_name(f"lib.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [
            "mvn", "-B", "-q", "-f", str(pom),
            *(f"-D{key}={value}" for key, value in properties.items()),
            f"-Dmaven.repo.local={cache_root() / 'm2'}",
            f"{DEPENDENCY_PLUGIN}:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={tmp}",
        ]
        t0 = time.monotonic()
        if not quiet:
            print(f"fetching {name} {version} jars with Maven ...", file=sys.stderr)
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not any(tmp.glob(expect)):
            shutil.rmtree(tmp, ignore_errors=True)
            raise FetchError(
                f"{name} {version}: {(done.stdout + done.stderr).strip()[-1500:] or 'no ' + expect}"
            )
        (tmp / MARKER).write_text(f"{version}\n")
        shutil.rmtree(lib, ignore_errors=True)
        tmp.rename(lib)
        if not quiet:
            print(f"fetched {name} {version} into {lib} in {time.monotonic() - t0:.1f}s",
                  file=sys.stderr)
        return lib


def java_executable(service: str, error: type[Exception] = FetchError) -> str:
    """``$JAVA_HOME/bin/java`` or ``java`` on PATH; raises ``error`` naming ``service``."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise error(f"{service} needs Java 17+ (java on PATH or JAVA_HOME)")
    return java


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
