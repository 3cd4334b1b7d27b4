"""A real Iceberg REST catalog on loopback for development and CI, no Docker.

Apache Iceberg's own REST catalog test server (``org.apache.iceberg.rest.
RESTCatalogServer``, the server of the ``apache/iceberg-rest-fixture`` image)
over a JDBC catalog on a SQLite file, with a local warehouse directory. The
tests (``tests/iceberg``) and a developer use the same helper::

    with running_catalog() as rest:       # fetch (cached), start in a temp dir
        use(rest.uri)                     # "http://127.0.0.1:PORT"
    # stopped, temp dir removed

From a shell, ``scripts/iceberg-rest run DIR`` serves the catalog of ``DIR``
(``catalog.db`` and ``warehouse/``, kept across runs) until Ctrl-C or SIGTERM
and prints its URI; ``scripts/iceberg-rest fetch`` only fills the cache.

``fetch`` resolves the server's jars (``scripts/iceberg-rest-pom.xml``,
Iceberg :data:`VERSION`) with Maven into
``${MICROBATCH_CACHE:-~/.cache/microbatch}/iceberg-rest-<version>/lib``, outside
the repository, through :mod:`scripts.maven_jars` (the Kafka broker's path).

NOTE: the upstream server binds its port on every interface (it takes a port,
not an address); the port is a fresh random one and clients use 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

try:
    from scripts import maven_jars
except ImportError:  # run as a file (scripts/iceberg-rest): scripts/ itself is on sys.path
    import maven_jars  # type: ignore[no-redef]

POM = Path(__file__).resolve().parent / "iceberg-rest-pom.xml"
VERSION = "1.11.0"
"""The Iceberg release whose REST test server runs. The pom pins the server's
dependencies of this release (Jetty 12.1 ee10; 1.9-1.10 ran on Jetty 11), so a
new release means checking its ``gradle/libs.versions.toml`` first."""
MAIN_CLASS = "org.apache.iceberg.rest.RESTCatalogServer"
READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
JVM_OPTS = ("-Xms64m", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true")
"""A small, fast-starting JVM: the server only reads and writes metadata files."""


class RestCatalogError(RuntimeError):
    """The REST catalog server could not be fetched or started; the message says why."""


def fetch(*, quiet: bool = False) -> Path:
    """The cached directory of the server's jars, fetched with Maven if missing."""
    try:
        return maven_jars.fetch_jars(
            POM, "iceberg-rest", VERSION, properties={"iceberg.version": VERSION},
            expect=f"iceberg-open-api-{VERSION}-test-fixtures.jar", quiet=quiet,
        )
    except maven_jars.FetchError as exc:
        raise RestCatalogError(f"cannot fetch the Iceberg REST catalog server: {exc}") from exc


@dataclass(frozen=True)
class RestCatalog:
    """A running REST catalog: its ``uri`` (``http://127.0.0.1:PORT``), the
    ``warehouse`` directory its tables live under, its ``directory`` (SQLite
    catalog, warehouse, ``server.log``), and how long its start took."""

    uri: str
    warehouse: Path
    directory: Path
    start_seconds: float


def server_env(directory: Path, port: int) -> dict[str, str]:
    """The server's environment: ``CATALOG_*`` variables become catalog properties
    (``CATALOG_JDBC_STRICT__MODE`` -> ``jdbc.strict-mode``), as in the upstream
    image; inherited ``CATALOG_*`` variables are dropped so only these count."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CATALOG_")}
    env.update({
        "CATALOG_CATALOG__IMPL": "org.apache.iceberg.jdbc.JdbcCatalog",
        "CATALOG_URI": f"jdbc:sqlite:{directory / 'catalog.db'}",
        "CATALOG_JDBC_STRICT__MODE": "true",
        "CATALOG_WAREHOUSE": (directory / "warehouse").as_uri(),
        "CATALOG_REST_PORT": str(port),
    })
    return env


def _answers(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/v1/config", timeout=2.0) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _log_tail(log: Path, lines: int = 30) -> str:
    """The last ``lines`` of the server's log, after the innermost Java cause
    (``Caused by: java.net.BindException: Address already in use``)."""
    try:
        text = log.read_text(errors="replace").splitlines()
    except OSError:
        return "(no server.log)"
    causes = [line for line in text if line.startswith("Caused by: ")]
    return "\n".join(causes[-1:] + text[-lines:])


def _stop(proc: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; the process is reaped either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait()


@contextlib.contextmanager
def running_catalog(
    directory: Path | None = None, *, port: int | None = None,
    timeout_s: float = READY_TIMEOUT_S,
) -> Iterator[RestCatalog]:
    """A REST catalog for the ``with`` block, stopped when the block ends.

    Guarantees inside the block: the server answers ``GET /v1/config`` at
    ``uri``; it runs in its own session (a signal to the caller's process
    group does not reach it). ``directory`` keeps the catalog and warehouse
    for a later run; without one a temporary directory is used and removed
    afterwards. ``port`` defaults to a free one. Raises
    :class:`RestCatalogError` (with the end of ``server.log``) when Java or
    the jars are missing or the server exits or does not answer in time.
    """
    own = directory is None
    where = Path(directory or tempfile.mkdtemp(prefix="mb-iceberg-rest-")).resolve()
    where.mkdir(parents=True, exist_ok=True)
    (where / "warehouse").mkdir(exist_ok=True)
    proc: subprocess.Popen[bytes] | None = None
    try:
        t0 = time.monotonic()
        lib = fetch()
        java = maven_jars.java_executable("the Iceberg REST catalog", RestCatalogError)
        port = port or maven_jars.free_port()
        uri = f"http://127.0.0.1:{port}"
        log = where / "server.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [java, *JVM_OPTS, "-cp", f"{lib}/*", MAIN_CLASS],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=server_env(where, port), cwd=where, start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while not _answers(uri):
            if proc.poll() is not None:
                raise RestCatalogError(
                    f"the Iceberg REST catalog exited with code {proc.returncode} while "
                    f"starting on port {port}; end of {log}:\n{_log_tail(log)}"
                )
            if time.monotonic() > deadline:
                raise RestCatalogError(
                    f"the Iceberg REST catalog did not answer at {uri} within "
                    f"{timeout_s:.0f}s; end of {log}:\n{_log_tail(log)}"
                )
            time.sleep(0.05)
        yield RestCatalog(uri, where / "warehouse", where, time.monotonic() - t0)
    finally:
        if proc is not None:
            _stop(proc)
        if own:
            shutil.rmtree(where, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """``fetch | run DIR [--port N]``; errors are one message, exit 1."""
    parser = argparse.ArgumentParser(prog="scripts/iceberg-rest",
                                     description=(__doc__ or "").split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="download the server's jars into the cache")
    run = sub.add_parser("run", help="serve the catalog kept in DIR until Ctrl-C")
    run.add_argument("dir", type=Path)
    run.add_argument("--port", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            print(fetch())
            return 0
        # Ctrl-C and SIGTERM both end the block, which stops the server; a shell
        # starts a background job with SIGINT ignored, so it is set again here
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        with running_catalog(args.dir, port=args.port) as rest:
            print(f"Iceberg REST catalog {VERSION} ready in {rest.start_seconds:.1f}s; "
                  f"warehouse {rest.warehouse}; Ctrl-C stops it", file=sys.stderr)
            print(rest.uri, flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    except RestCatalogError as exc:
        parser.exit(1, f"scripts/iceberg-rest {args.command}: {exc}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
