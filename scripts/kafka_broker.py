"""A real single-node Apache Kafka broker (KRaft) for development and CI, no Docker.

The one broker helper of the repository: the tests (``tests/kafka``), the
benchmarks and the crash soak import it (``from scripts.kafka_broker import
running_broker``, with the repository root on ``sys.path``)::

    with running_broker() as broker:      # fetch (cached), start in a temp dir
        use(broker.bootstrap)             # "127.0.0.1:PORT"
    # stopped, temp dir removed

:class:`LocalBroker` stops and restarts the broker of one directory on the
same data and address (the fault tests do). From a shell, run it through the
``scripts/kafka`` wrapper::

    scripts/kafka fetch              # jars from Maven Central into the cache (once)
    scripts/kafka start DIR          # format DIR, start a broker, print "127.0.0.1:PORT"
    scripts/kafka stop DIR           # SIGTERM, then SIGKILL after a grace period
    scripts/kafka status DIR         # the bootstrap address if it runs (exit 1 if not)

``fetch`` resolves ``org.apache.kafka:kafka_2.13`` (``$MICROBATCH_KAFKA_VERSION``,
else the first of :data:`VERSIONS` that resolves) plus ``slf4j-simple`` 1.7.36 with
Maven (``scripts/kafka-pom.xml``, through :mod:`scripts.maven_jars`) into
``${MICROBATCH_CACHE:-~/.cache/microbatch}/kafka-<version>/lib``, outside the repo.
The cache is filled under a temporary name and renamed into place, so an
interrupted fetch never leaves a half-filled ``lib``.

``start DIR`` keeps everything of one broker in ``DIR``: ``server.properties``,
``data/`` (formatted on first start), ``broker.log``, ``broker.pid``,
``ports.json`` and ``bootstrap``. A second ``start`` of a stopped broker
reuses its data and its ports (so clients reconnect to the same address),
and a ``start`` of a running one just prints its address. The broker listens
on 127.0.0.1 only. ``start`` returns when an AdminClient ``list_topics``
answers (or, without confluent-kafka, when the broker logs that it started).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

try:
    from scripts import maven_jars
except ImportError:  # run as a file (scripts/kafka): scripts/ itself is on sys.path
    import maven_jars  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
POM = HERE / "kafka-pom.xml"
VERSIONS = ("4.1.2", "4.1.1", "4.1.0", "3.9.1")
"""Kafka versions tried in order when ``$MICROBATCH_KAFKA_VERSION`` is not set."""
READY_TIMEOUT_S = 120.0
STOP_GRACE_S = 15.0
JVM_OPTS = ("-Xms256m", "-Xmx768m", "-XX:+UseG1GC", "-Djava.awt.headless=true")
_STARTED_LINE = "Kafka Server started"


class BrokerError(RuntimeError):
    """The broker could not be fetched, started or stopped; the message says why."""


_children: dict[Path, subprocess.Popen[bytes]] = {}
"""The brokers this process started, by directory: :func:`stop` waits for its
own child (no zombie, no "still running" ResourceWarning), and :func:`start`
reaps one that was killed from outside before it starts the next."""


# --------------------------------------------------------------------------- fetch


def lib_dir(version: str) -> Path:
    """Where the jars of ``version`` live once fetched."""
    return maven_jars.lib_dir("kafka", version)


def fetched_version() -> str | None:
    """A version already in the cache (the preferred one first), or ``None``."""
    wanted = os.environ.get("MICROBATCH_KAFKA_VERSION")
    for version in (wanted,) if wanted else VERSIONS:
        if maven_jars.is_fetched("kafka", version):
            return version
    return None


def fetch(*, quiet: bool = False) -> Path:
    """Make sure the broker's jars are in the cache; return their directory.

    Tries ``$MICROBATCH_KAFKA_VERSION`` or each of :data:`VERSIONS`; raises
    :class:`BrokerError` with Maven's output when none resolves.
    """
    wanted = os.environ.get("MICROBATCH_KAFKA_VERSION")
    have = fetched_version()
    if have:
        return lib_dir(have)
    errors = []
    for version in (wanted,) if wanted else VERSIONS:
        try:
            return maven_jars.fetch_jars(POM, "kafka", version,
                                         properties={"kafka.version": version},
                                         expect=f"kafka_2.13-{version}.jar", quiet=quiet)
        except maven_jars.FetchError as exc:
            errors.append(str(exc))
    raise BrokerError("no Kafka version could be fetched:\n" + "\n".join(errors))


# --------------------------------------------------------------------------- start


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def server_properties(data: Path, port: int, controller_port: int) -> str:
    """The configuration of a one-node KRaft broker+controller on loopback."""
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true",
        "log.segment.bytes": str(64 * 1024 * 1024),
    }
    return "".join(f"{k}={v}\n" for k, v in settings.items())


def cluster_id() -> str:
    """A new KRaft cluster id: a random UUID in URL-safe base64, as Kafka's own."""
    import base64

    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        # NOTE: an id starting with "-" reads as an option to the format tool
        # ("--cluster-id: expected one argument", 1 start in 64); Kafka's
        # Uuid.randomUuid() draws again in that case, and so do we
        if not cid.startswith("-"):
            return cid


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (our own exited child, not reaped) is not a running broker
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def running_pid(directory: Path) -> int | None:
    """The pid of the broker started in ``directory`` if it still runs."""
    pid_file = directory / "broker.pid"
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    if not _pid_alive(pid):
        return None
    try:  # the pid may have been reused by another program
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        if b"kafka.Kafka" not in cmdline or str(directory).encode() not in cmdline:
            return None
    except OSError:
        pass
    return pid


def _ready(bootstrap: str, timeout_s: float) -> bool:
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError:
        return False
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0,
                         "logger": _quiet_logger()})
    try:
        admin.list_topics(timeout=timeout_s)
    except Exception:
        return False
    return True


def _quiet_logger() -> object:
    import logging

    logger = logging.getLogger("microbatch.kafka_broker.client")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger


def _log_tail(log: Path, lines: int = 40) -> str:
    try:
        text = log.read_text(errors="replace").splitlines()
    except OSError:
        return "(no broker.log)"
    return "\n".join(text[-lines:])


def start(directory: Path, *, timeout_s: float = READY_TIMEOUT_S) -> str:
    """Start (or find running) the broker of ``directory``; return its bootstrap address.

    Guarantees on return: the broker process runs in its own session (a
    signal to the caller's process group does not reach it),
    ``directory/broker.pid`` holds its pid, and a client has listed its
    topics; :func:`stop` in this process also reaps it. On failure the broker process is stopped and
    :class:`BrokerError` carries the end of ``broker.log``.
    """
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    bootstrap_file = directory / "bootstrap"
    if running_pid(directory) is not None and bootstrap_file.exists():
        bootstrap = bootstrap_file.read_text().strip()
        if _ready(bootstrap, 10.0):
            return bootstrap
    version = fetched_version()
    lib = lib_dir(version) if version else fetch(quiet=False)
    java = maven_jars.java_executable("the Kafka broker", BrokerError)
    classpath = f"{lib}/*"
    data = directory / "data"
    # a broker of ours that was killed from outside holds its ports until reaped
    _wait_child(directory)
    ports_file = directory / "ports.json"
    ports = json.loads(ports_file.read_text()) if ports_file.exists() else {}
    port, controller = ports.get("port"), ports.get("controller")
    if not (port and controller and _port_free(port) and _port_free(controller)):
        port, controller = maven_jars.free_port(), maven_jars.free_port()
        while controller == port:
            controller = maven_jars.free_port()
    props = directory / "server.properties"
    props.write_text(server_properties(data, port, controller))
    ports_file.write_text(json.dumps({"port": port, "controller": controller}))
    log = directory / "broker.log"
    if not (data / "meta.properties").exists():
        shutil.rmtree(data, ignore_errors=True)
        cid = cluster_id()
        fmt = subprocess.run(
            [java, "-Xmx256m", "-cp", classpath, "kafka.tools.StorageTool", "format",
             "-t", cid, "-c", str(props)],
            capture_output=True, text=True, check=False,
        )
        if fmt.returncode != 0:
            raise BrokerError(
                f"formatting KRaft storage in {data} failed:\n{fmt.stdout}{fmt.stderr}"
            )
    bootstrap = f"127.0.0.1:{port}"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [java, *JVM_OPTS, "-cp", classpath, "kafka.Kafka", str(props)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=directory,
        )
    _children[directory] = proc
    (directory / "broker.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout_s
    have_client = _has_client()
    offset = log.stat().st_size
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BrokerError(
                f"the Kafka broker exited with code {proc.returncode} while starting; "
                f"end of {log}:\n{_log_tail(log)}"
            )
        if have_client:
            if _port_open(port) and _ready(bootstrap, 5.0):
                break
        elif _STARTED_LINE in _read_from(log, offset):
            break
        time.sleep(0.2)
    else:
        stop(directory)
        raise BrokerError(
            f"the Kafka broker did not answer on {bootstrap} within {timeout_s:.0f}s; "
            f"end of {log}:\n{_log_tail(log)}"
        )
    bootstrap_file.write_text(bootstrap + "\n")
    return bootstrap


def _has_client() -> bool:
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return False
    return True


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _read_from(log: Path, offset: int) -> str:
    try:
        with log.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


# --------------------------------------------------------------------------- stop


def stop(directory: Path, *, grace_s: float = STOP_GRACE_S) -> bool:
    """Stop the broker of ``directory``: SIGTERM, then SIGKILL after ``grace_s``.

    Returns ``True`` when a running broker was stopped. Its data stays in
    ``directory`` for a later :func:`start`.
    """
    directory = directory.resolve()
    pid = running_pid(directory)
    if pid is None:
        _wait_child(directory)  # killed from outside: our child is a zombie
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _pid_alive(pid):
        _reap(pid)
        time.sleep(0.1)
    if _pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            _reap(pid)
            if not _pid_alive(pid):
                break
            time.sleep(0.05)
    (directory / "broker.pid").unlink(missing_ok=True)
    _wait_child(directory)
    return True


def _reap(pid: int) -> None:
    for proc in _children.values():
        if proc.pid == pid:  # our own child: its Popen reaps it
            proc.poll()
            return
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _wait_child(directory: Path) -> None:
    """Reap the broker this process started in ``directory``, which is exiting or gone.

    NOTE: a JVM's main thread shows as a zombie while its other threads still
    exit, and only then can it be reaped: so wait, not poll (SIGKILL after the
    grace period, never leaving a child unreaped)."""
    proc = _children.pop(directory, None)
    if proc is None:
        return
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _outlive(directory: Path) -> None:
    """Let the broker of ``directory`` outlive this process (``scripts/kafka start``):
    its Popen is dropped as finished, so nothing warns that it still runs."""
    proc = _children.pop(directory.resolve(), None)
    if proc is not None:
        proc.returncode = 0  # NOTE: never waited for here: init reaps it once we exit


# --------------------------------------------------------------------------- helper


class LocalBroker:
    """The broker kept in ``directory``: started, stopped and restarted on the same
    data and, when its ports are still free, the same address.

    ``bootstrap`` is the address of the last :meth:`start` (``None`` before), and
    ``start_seconds`` how long that start took.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory).resolve()
        self.bootstrap: str | None = None
        self.start_seconds = 0.0

    def start(self, *, timeout_s: float = READY_TIMEOUT_S) -> str:
        """Start the broker (see :func:`start`), fetching the jars first if needed;
        its address. Raises :class:`BrokerError`."""
        t0 = time.monotonic()
        self.bootstrap = start(self.directory, timeout_s=timeout_s)
        self.start_seconds = time.monotonic() - t0
        return self.bootstrap

    def stop(self, *, grace_s: float = STOP_GRACE_S) -> bool:
        """Stop the broker (see :func:`stop`); ``True`` when one was running."""
        return stop(self.directory, grace_s=grace_s)

    @property
    def pid(self) -> int | None:
        """The broker's JVM process id while it runs."""
        return running_pid(self.directory)


@contextlib.contextmanager
def running_broker(
    directory: Path | None = None, *, timeout_s: float = READY_TIMEOUT_S
) -> Iterator[LocalBroker]:
    """A broker for the ``with`` block, stopped (SIGCONT first, in case it was left
    frozen) when the block ends.

    ``directory`` keeps its data and log; without one, a new temporary directory
    is used and removed afterwards. Raises :class:`BrokerError` when the jars
    cannot be fetched or the broker does not start.
    """
    own = directory is None
    where = Path(tempfile.mkdtemp(prefix="mb-kafka-")) if own else Path(directory)
    broker = LocalBroker(where)
    try:
        broker.start(timeout_s=timeout_s)
        yield broker
    finally:
        pid = broker.pid
        if pid is not None:  # SIGTERM would not reach a SIGSTOPped JVM
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        broker.stop()
        if own:
            shutil.rmtree(where, ignore_errors=True)


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    """``fetch | start DIR | stop DIR | status DIR``; errors are one message, exit 1."""
    parser = argparse.ArgumentParser(prog="scripts/kafka", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="download the broker jars into the cache")
    for name, text in (("start", "start a broker in DIR"), ("stop", "stop the broker of DIR"),
                       ("status", "print the bootstrap address if the broker of DIR runs")):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("dir", type=Path)
    sub.choices["start"].add_argument("--timeout", type=float, default=READY_TIMEOUT_S)
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            print(fetch())
        elif args.command == "start":
            t0 = time.monotonic()
            bootstrap = start(args.dir, timeout_s=args.timeout)
            _outlive(args.dir)
            print(f"broker ready in {time.monotonic() - t0:.1f}s", file=sys.stderr)
            print(bootstrap)
        elif args.command == "stop":
            print("stopped" if stop(args.dir) else "not running", file=sys.stderr)
        else:
            if running_pid(args.dir.resolve()) is None:
                print("not running", file=sys.stderr)
                return 1
            print((args.dir / "bootstrap").read_text().strip())
    except BrokerError as exc:
        print(f"scripts/kafka {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
