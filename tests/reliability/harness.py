"""Crash-injection harness: run a real job, kill it, restart it, check the output.

The job (``reliability_job.py``) runs as a ``microbatch run`` subprocess on one
checkpoint. Each run is ended as its :class:`Kill` says:

- ``point``: ``MICROBATCH_FAULT=POINT[@BATCH]``, the engine SIGKILLs itself at
  a named lifecycle point (``microbatch.faults.POINTS``; the sinks' own points
  are in :data:`SINK_POINTS`);
- ``state``: ``RELIABILITY_STATE_FAULT``, a SIGKILL before, after or in the
  middle of a state store file write (see the job's docstring);
- ``random``: SIGKILL from outside, ``delay_s`` after the start, or (``settle``)
  ``delay_s`` after the run's first own commit, so that it lands mid-batch;
- ``sigterm``: SIGTERM once the run has committed a batch; it must exit 0
  with no batch pending;
- ``clean``: no fault; the run must finish (exit 0).

:meth:`Soak.finish` lands the rest of the input, runs the job cleanly to the
end and compares the output with a one-shot Polars computation of the same
result (:func:`expected_output`): equal row for row, no key twice, none
missing, no late rows, every dead letter exactly once. Used by
``tests/reliability`` (short runs) and ``scripts/crash_soak.py`` (the soak).

Kafka and webhook variants: the ``kafka`` source reads ``<topic>-in`` (the
harness produces the input there in chunks of ``EVENTS_PER_FILE`` records plus
two bad values, as the ``files`` source's files, more between runs); the
``kafka`` sink writes ``<topic>-out`` in one transaction per batch and the
output is what a ``read_committed`` consumer of that topic sees; the
``webhook`` sink posts every result row to a receiver that :class:`Soak` runs
on a thread of this process (``microbatch.tools.receiver``: it keeps the first
body of each ``Idempotency-Key``, answers a repeat with the same body as a
duplicate and a different body as a 409 conflict, and fails
``webhook_fail_rate`` of the requests with 503 so that retries happen); the
output is the first acknowledged body of every key. ``JobSpec.bootstrap`` names
a running broker (the caller owns it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import polars as pl

import microbatch as mb
from microbatch.durations import parse_duration_ms
from microbatch.engine.faults import POINTS
from microbatch.sources.generator import GeneratorSource

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).resolve().with_name("reliability_job.py")
KEYS = ["window_start", "card_id"]
STATE_FAULTS = ("after:changelog", "before:changelog", "torn:changelog", "after:snapshot")
"""State store write faults the job can inject (``WHEN:KIND``)."""
SINK_POINTS = {"parquet": ("sink.after_data",),
               "delta": ("sink.before_commit", "sink.after_commit"),
               "iceberg": ("sink.before_data", "sink.before_commit", "sink.after_commit"),
               "kafka": ("sink.after_data", "sink.after_commit"),
               "webhook": ("sink.after_data",)}
"""The fault points inside each sink's ``add_batch`` (Kafka: after the rows are
produced in the open transaction, after it committed; webhook: after every row
was acknowledged, before the batch's ledger entry)."""
DEAD_LETTER_POINT = "dead_letter.sink.after_data"
"""Inside the dead-letter sink, which step 5 writes before the sink (every batch
of the ``files`` and ``kafka`` inputs has bad records)."""
TABLE_SINKS = ("parquet", "delta", "iceberg")
UNBATCHED = {p for sink in TABLE_SINKS for p in SINK_POINTS[sink]}
"""Points armed without a batch id (the first time the run passes them) in the
Parquet, Delta and Iceberg sinks: the table sinks skip them for batches without rows.
The Kafka and webhook sinks pass theirs in every batch: they are armed for a
batch, as the engine's points are (the first batch emits no rows: no window is
closed yet)."""
EVENTS_PER_FILE = 500
BAD_LINES_PER_FILE = 2
GEN_START = "2026-01-01T00:00:00+00:00"
FIRE_AT = 3
"""``reliability_job.FIRE_AT``: an ``agg=fire_once`` window fires at this many rows."""
MONEY = pl.Decimal(18, 2)
"""The job's amounts (``reliability_job.MONEY``): exact sums for every batch split."""


@dataclass(frozen=True)
class JobSpec:
    """One variant of the reliability job and the size of its input."""

    source: Literal["generator", "files", "kafka"] = "generator"
    agg: Literal["tumbling", "session", "fire_once"] = "tumbling"
    sink: Literal["parquet", "delta", "iceberg", "kafka", "webhook"] = "parquet"
    rows: int = 120_000
    """Generator log length (event time advances 1000 rows per second)."""
    cap: int = 4_000
    """Records (generator) or files (``files`` source) per batch."""
    window: str = "1m"
    gap: str = "30s"
    delay: str = "10s"
    cards: int = 200
    partitions: int = 2
    seed: int = 1
    files: int = 40
    """Input files of the ``files`` source, or chunks of the ``kafka`` source
    (EVENTS_PER_FILE good rows each, 50 s of event time per file)."""
    snapshot_every: int | None = 4
    state_retention: int | None = 3
    bootstrap: str = ""
    """The Kafka broker (``host:port``) of the ``kafka`` source and sink."""
    topic: str = ""
    """Kafka topic prefix: the job reads ``<topic>-in`` and writes ``<topic>-out``."""
    url: str = ""
    """The webhook receiver (set by :meth:`Soak.prepare`, which runs it)."""
    webhook_fail_rate: float = 0.05
    """Share of POSTs the receiver answers with 503 (retried by the sink)."""
    pipelined: bool = False
    """Run with ``--pipelined`` (sink and commit of N beside batch N+1)."""
    state_backend: str = "memory"
    """``--state-backend``: ``"lmdb"`` keeps the keyed state in the on-disk database."""

    @property
    def landed_input(self) -> bool:
        """The input arrives in chunks between runs (files or Kafka records)."""
        return self.source in ("files", "kafka")

    @property
    def name(self) -> str:
        """A short label, e.g. ``generator/tumbling/parquet``."""
        return f"{self.source}/{self.agg}/{self.sink}"

    def params(self, work: Path) -> list[str]:
        """``--param`` arguments of the job for working directory ``work``."""
        values = {
            "output": work / "out", "input": work / "in", "source": self.source,
            "agg": self.agg, "sink": self.sink, "rows": self.rows, "cap": self.cap,
            "window": self.window, "gap": self.gap, "delay": self.delay,
            "cards": self.cards, "partitions": self.partitions, "seed": self.seed,
        }
        if self.source == "kafka" or self.sink == "kafka":
            values.update(bootstrap=self.bootstrap, topic=self.topic)
        if self.sink == "webhook":
            values["url"] = self.url
        return [arg for key, value in values.items() for arg in ("--param", f"{key}={value}")]

    def env(self) -> dict[str, str]:
        """Environment of every run: no inherited faults; the state store hooks."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("MICROBATCH_FAULT", "RELIABILITY_"))}
        if self.snapshot_every:
            env["RELIABILITY_SNAPSHOT_EVERY"] = str(self.snapshot_every)
        if self.state_retention:
            env["RELIABILITY_STATE_RETENTION"] = str(self.state_retention)
        return env


@dataclass(frozen=True)
class Kill:
    """How one run of the job is ended."""

    how: Literal["point", "state", "random", "sigterm", "clean"]
    point: str = ""
    batch: int | None = None
    delay_s: float = 0.0
    settle: bool = False
    """``random``: count ``delay_s`` from the run's first commit, not its start."""

    def label(self) -> str:
        """``after_sink@3``, ``state after:changelog@5``, ``random 0.80s``..."""
        at = "" if self.batch is None else f"@{self.batch}"
        if self.how == "point":
            return f"{self.point}{at}"
        if self.how == "state":
            return f"state {self.point}{at}"
        if self.how == "random":
            return f"random {'+' if self.settle else ''}{self.delay_s:.2f}s"
        return self.how


@dataclass
class RunOutcome:
    """What one run did."""

    kill: Kill
    returncode: int
    seconds: float
    stderr: str

    @property
    def killed(self) -> bool:
        """The process died of SIGKILL."""
        return self.returncode == -signal.SIGKILL


@dataclass
class Verdict:
    """The final output compared with the one-shot computation."""

    records_in: int
    """Good input records."""
    records_out: int
    """Records counted in the output (sum of ``n``)."""
    records_expected: int
    """Records the one-shot result counts (the rest are in windows still open)."""
    rows_expected: int
    rows_out: int
    duplicates: int
    missing: int
    extra: int
    wrong_values: int
    late_rows: int
    dead_letters: int
    dead_letters_expected: int
    dead_letter_duplicates: int
    equal: bool
    """``read back == one-shot`` as whole frames (same rows, same values)."""
    deliveries: int | None = None
    """Webhook: POSTs the receiver acknowledged (2xx), redeliveries included."""
    redeliveries: int = 0
    """Webhook: acknowledged POSTs of a key it had already accepted, with the same
    body (a batch replayed after a crash; the receiver dedupes them by key)."""
    conflicts: int = 0
    """Webhook: POSTs of an accepted key with a different body (409)."""
    aborted_rows: int | None = None
    """Kafka sink: records in the output topic that ``read_committed`` consumers do
    not see (written in transactions that a crash left open, then aborted)."""

    @property
    def exact(self) -> bool:
        """Nothing lost, nothing twice, nothing changed, nothing late."""
        return (
            self.equal
            and self.duplicates == self.missing == self.extra == self.wrong_values == 0
            and self.late_rows == 0
            and self.dead_letters == self.dead_letters_expected
            and self.dead_letter_duplicates == 0
            and self.conflicts == 0
        )


@dataclass
class Soak:
    """One job variant on one checkpoint: its runs and the final verdict."""

    spec: JobSpec
    work: Path
    outcomes: list[RunOutcome] = field(default_factory=list)
    verdict: Verdict | None = None
    landed: int = 0
    """Input files (or Kafka chunks) written so far (more land between runs)."""
    batches_when_killed: int = 0
    """Batches committed when the last kill was done (the clean run did the rest)."""
    batches_total: int = 0
    """Batches committed at the end (set by :meth:`finish`)."""
    _producer: Any = field(default=None, repr=False)
    _receiver: Any = field(default=None, repr=False)

    @property
    def chk(self) -> Path:
        """The checkpoint directory."""
        return self.work / "chk"

    @property
    def kills(self) -> int:
        """Runs that ended in SIGKILL."""
        return sum(o.killed for o in self.outcomes)

    @property
    def batches(self) -> int:
        """Batches committed on the checkpoint so far."""
        return self.next_batch()[0]

    @property
    def restarts(self) -> int:
        """Runs after the first one (each resumed the checkpoint)."""
        return max(0, len(self.outcomes) - 1)

    def killed_at(self) -> list[str]:
        """Labels of the kills that happened."""
        return [o.kill.label() for o in self.outcomes if o.killed]

    def history(self) -> str:
        """One line per run, for assertion messages."""
        return "; ".join(f"{o.kill.label()} -> {o.returncode}" for o in self.outcomes)

    # -------------------------------------------------------------- running

    def prepare(self) -> None:
        """Create the work directory (the Kafka topics, the webhook receiver); land
        three quarters of the input files."""
        self.work.mkdir(parents=True, exist_ok=True)
        spec = self.spec
        if "kafka" in (spec.source, spec.sink):
            if not (spec.bootstrap and spec.topic):
                raise ValueError(f"{spec.name}: JobSpec.bootstrap and .topic name the broker")
            _create_topics(spec.bootstrap, [f"{spec.topic}-in", f"{spec.topic}-out"],
                           spec.partitions)
        if spec.sink == "webhook" and self._receiver is None:
            from microbatch.tools.receiver import Receiver, serve

            receiver = Receiver(log=self.work / "received.jsonl", seed=spec.seed,
                                fail_rate=spec.webhook_fail_rate)
            server = serve(receiver)
            server.handle_error = _quiet_reset(server.handle_error)  # type: ignore[method-assign]
            self._receiver = (receiver, server)
            self.spec = dataclasses.replace(
                spec, url=f"http://127.0.0.1:{server.server_address[1]}/hook")
        if spec.landed_input:
            (self.work / "in").mkdir(exist_ok=True)
            self.land(spec.files * 3 // 4)
        else:
            self.landed = spec.files  # the generator's log is there from the start

    def close(self) -> None:
        """Stop the webhook receiver and the input producer."""
        if self._receiver is not None:
            receiver, server = self._receiver
            server.shutdown()
            server.server_close()
            receiver.close()
            self._receiver = None
        if self._producer is not None:
            self._producer.flush(30)
            self._producer = None

    def land(self, count: int) -> None:
        """Write the next ``count`` input files (``files`` source), atomically, or
        produce the next ``count`` chunks to the input topic (``kafka``)."""
        if self.spec.source == "kafka":
            self._produce(min(count, self.spec.files - self.landed))
            return
        if self.spec.source != "files":
            return
        for _ in range(min(count, self.spec.files - self.landed)):
            path = self.work / "in" / f"part-{self.landed:05d}.json"
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(input_file(self.spec, self.landed))
            mtime = 1_700_000_000 * 10**9 + self.landed * 10**6
            os.utime(tmp, ns=(mtime, mtime))
            tmp.rename(path)
            self.landed += 1

    def _produce(self, count: int) -> None:
        """Produce chunks ``landed .. landed + count`` (good records on the partition
        ``event_id % partitions``, the two bad values on partitions of their own) and
        wait until every one is acknowledged."""
        if count <= 0:
            return
        from confluent_kafka import Producer

        if self._producer is None:
            self._producer = Producer({"bootstrap.servers": self.spec.bootstrap,
                                       "enable.idempotence": True, "linger.ms": 5})
        producer = self._producer
        errors: list[Any] = []
        topic = f"{self.spec.topic}-in"
        for _ in range(count):
            index = self.landed
            for partition, value in kafka_messages(self.spec, index):
                while True:
                    try:
                        producer.produce(topic, value, partition=partition, on_delivery=lambda e,
                                         _m: errors.append(e) if e else None)
                        break
                    except BufferError:  # the local queue is full: let deliveries drain it
                        producer.poll(0.1)
            producer.poll(0)
            self.landed += 1
        left = producer.flush(120)
        if left or errors:
            raise RuntimeError(f"input to {topic}: {left} unconfirmed, errors {errors[:3]}")

    def run(
        self, kill: Kill, *, timeout: float = 300, env_extra: dict[str, str] | None = None
    ) -> RunOutcome:
        """Run the job once, ended as ``kill`` says (``env_extra``: more environment,
        e.g. the job's ENOSPC hook); record and return the outcome."""
        env = {**self.spec.env(), **(env_extra or {})}
        at = "" if kill.batch is None else f"@{kill.batch}"
        if kill.how == "point":
            env["MICROBATCH_FAULT"] = f"{kill.point}{at}"
        elif kill.how == "state":
            when, kind = kill.point.split(":")
            env["RELIABILITY_STATE_FAULT"] = f"{when}:{kind}:{(kill.batch or 0) + 1}"
        cmd = [sys.executable, "-m", "microbatch.cli", "run", str(JOB), "--checkpoint",
               str(self.chk), "--trigger", "available-now", *self.spec.params(self.work),
               *(["--pipelined"] if self.spec.pipelined else []),
               *(["--state-backend", self.spec.state_backend]
                 if self.spec.state_backend != "memory" else [])]
        log = self.work / "stderr.log"
        started = time.monotonic()
        with log.open("wb") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=ROOT)
            try:
                if kill.how == "random":
                    _kill_later(proc, self.chk, kill)
                elif kill.how == "sigterm":
                    _signal_after_commit(proc, self.chk, signal.SIGTERM, 0.0, timeout)
                proc.wait(timeout=timeout)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        outcome = RunOutcome(kill, proc.returncode, time.monotonic() - started,
                             log.read_text(errors="replace"))
        self.outcomes.append(outcome)
        return outcome

    def finish(self) -> Verdict:
        """Land every remaining input file, run cleanly to the end, verify."""
        self.land(self.spec.files)
        outcome = self.run(Kill("clean"), timeout=1800)  # the rest of the input
        if outcome.returncode != 0:
            raise AssertionError(
                f"{self.spec.name}: the clean run failed ({outcome.returncode}):\n"
                f"{outcome.stderr[-3000:]}\nhistory: {self.history()}"
            )
        self.batches_total = self.batches
        try:
            self.verdict = verify(self.spec, self.work)
        finally:
            self.close()
        return self.verdict

    def next_batch(self) -> tuple[int, bool]:
        """The id of the batch the next run starts with, and whether it is a recovery."""
        offsets = _ids(self.chk / "offsets")
        if not offsets:
            return 0, False
        last = offsets[-1]
        return (last + 1, False) if last in set(_ids(self.chk / "commits")) else (last, True)

    def point_kill(self, point: str, rng: random.Random) -> Kill:
        """A kill at ``point`` in one of the next batches (the recovered one included)."""
        if point in UNBATCHED and self.spec.sink in TABLE_SINKS:
            return Kill("point", point=point)
        batch, recovering = self.next_batch()
        skip_recovered = recovering and point in ("after_plan", "after_write_ahead")
        batch += rng.randint(1 if skip_recovered else 0, 2)
        if point.startswith(("after:", "before:", "torn:")):
            return Kill("state", point=point, batch=batch)
        return Kill("point", point=point, batch=batch)

    def check(self, outcome: RunOutcome) -> None:
        """A run must end the way its kill says, or finish cleanly; raise if not."""
        kill, rc = outcome.kill, outcome.returncode
        tail = outcome.stderr[-3000:]
        if kill.how == "sigterm":
            batch, pending = self.next_batch()
            if rc != 0 or pending:
                raise AssertionError(
                    f"{self.spec.name}: SIGTERM run exited {rc}"
                    f"{f' leaving batch {batch} pending' if pending else ''}:\n{tail}\n"
                    f"history: {self.history()}"
                )
        elif rc not in (0, -signal.SIGKILL):
            raise AssertionError(
                f"{self.spec.name}: run with {kill.label()} exited {rc}:\n{tail}\n"
                f"history: {self.history()}"
            )


def points_for(spec: JobSpec) -> list[str]:
    """Every named kill point the variant passes through, in lifecycle order,
    then the state store write faults."""
    ours = SINK_POINTS[spec.sink]
    points = [p for p in POINTS if not p.startswith("sink.") or p in ours]
    missing = [p for p in ours if p not in points]  # an engine that lists fewer points
    at = points.index("after_sink")
    points = points[:at] + missing + points[at:]
    if spec.landed_input:
        points.insert(points.index("after_execute") + 1, DEAD_LETTER_POINT)
    return points + list(STATE_FAULTS)


def soak(
    spec: JobSpec,
    work: Path,
    *,
    kills: int,
    seed: int,
    named: list[str] | None = None,
    sigterms: int = 1,
    random_range: tuple[float, float] = (0.3, 2.5),
    max_runs: int | None = None,
) -> Soak:
    """Kill ``spec``'s job until ``kills`` runs died of SIGKILL: at the ``named``
    points first (default: all of :func:`points_for`), then at random moments;
    stop it ``sigterms`` times with SIGTERM in between; then run it to the end
    and verify. Stops killing early when a run finished all the input there
    is. Raises AssertionError when a run misbehaves."""
    rng = random.Random(seed)
    run = Soak(spec, work)
    run.prepare()
    todo = list(points_for(spec) if named is None else named)
    stops = sorted(rng.randint(1, max(1, kills)) for _ in range(sigterms))
    limit = max_runs if max_runs is not None else 3 * kills + sigterms + 5
    try:
        while run.kills < kills and len(run.outcomes) < limit:
            if stops and run.kills >= stops[0]:
                stops.pop(0)
                kill = Kill("sigterm")
            elif todo:
                kill = run.point_kill(todo.pop(0), rng)
            elif rng.random() < 0.5:
                kill = Kill("random", delay_s=rng.uniform(0.0, 0.4), settle=True)
            else:
                kill = Kill("random", delay_s=rng.uniform(*random_range))
            outcome = run.run(kill)
            run.check(outcome)
            if outcome.returncode == 0 and kill.how != "sigterm" and run.landed >= spec.files:
                break  # everything there is was processed: nothing left to kill
            run.land(1)
        run.batches_when_killed = run.batches
        run.finish()
    finally:
        run.close()
    return run


def _quiet_reset(handle_error: Any) -> Any:
    """A server's ``handle_error`` that is silent when the client was killed
    mid-request (the connection reset), as it is many times in a soak."""

    def handle(request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            handle_error(request, client_address)

    return handle


def _kill_later(proc: subprocess.Popen[bytes], chk: Path, kill: Kill) -> None:
    if kill.settle:
        _signal_after_commit(proc, chk, signal.SIGKILL, kill.delay_s, 300)
        return
    try:
        proc.wait(timeout=kill.delay_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)


def _signal_after_commit(
    proc: subprocess.Popen[bytes], chk: Path, sig: int, delay_s: float, timeout: float
) -> None:
    """Send ``sig`` to ``proc`` ``delay_s`` after it committed a batch of its own."""
    before = max(_ids(chk / "commits"), default=-1)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if max(_ids(chk / "commits"), default=-1) > before:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=delay_s)
            if proc.poll() is None:
                proc.send_signal(sig)
            return
        time.sleep(0.005)


def _ids(directory: Path) -> list[int]:
    try:
        return sorted(int(n) for n in os.listdir(directory) if n.isdigit())
    except FileNotFoundError:
        return []


# ------------------------------------------------------------------ input and oracle


def file_records(spec: JobSpec, index: int) -> list[dict[str, object]]:
    """The good records of input file ``index`` (deterministic)."""
    rng = random.Random(spec.seed * 1_000_003 + index)
    base = datetime(2026, 1, 1, tzinfo=UTC)
    records = []
    for i in range(EVENTS_PER_FILE):
        event = index * EVENTS_PER_FILE + i
        # disorder below the watermark delay: no record is ever late
        at = base + timedelta(milliseconds=event * 100 - rng.randrange(5_000))
        records.append({
            "event_id": event,
            "card_id": rng.randrange(spec.cards) if i % 3 else i % 7,
            "amount": round(rng.uniform(1, 500), 2),
            "event_time": at.isoformat(),
        })
    return records


def input_file(spec: JobSpec, index: int) -> bytes:
    """File ``index`` of the ``files`` source: the good records and two bad lines."""
    lines = [json.dumps(r) for r in file_records(spec, index)]
    lines.insert(EVENTS_PER_FILE // 3, '{"event_id": "not a number", "card_id": 1}')
    lines.insert(2 * EVENTS_PER_FILE // 3, '{"event_id": 1, "card_id": ')
    return ("\n".join(lines) + "\n").encode()


def kafka_messages(spec: JobSpec, index: int) -> list[tuple[int, bytes]]:
    """Chunk ``index`` of the ``kafka`` source's input: ``(partition, value)`` of each
    line of :func:`input_file` (the good records on ``event_id % partitions``)."""
    out = []
    for line in input_file(spec, index).splitlines():
        try:
            event = json.loads(line)["event_id"]
            partition = event % spec.partitions if isinstance(event, int) else index
        except (ValueError, KeyError):
            partition = index + 1
        out.append((partition % spec.partitions, line))
    return out


def input_rows(spec: JobSpec) -> pl.DataFrame:
    """Every good input record the job reads, with its watermark partition ``__p``
    (the file source has one; a Kafka source one per topic partition)."""
    if spec.landed_input:
        records = [r for index in range(spec.files) for r in file_records(spec, index)]
        partition = (pl.col("event_id") % spec.partitions if spec.source == "kafka"
                     else pl.lit(0))
        return pl.DataFrame(records).select(
            pl.col("event_id").cast(pl.Int64), pl.col("card_id").cast(pl.Int64),
            pl.col("amount").cast(pl.Float64).cast(MONEY),
            pl.col("event_time").str.to_datetime("%+", time_unit="ms", time_zone="UTC"),
            partition.cast(pl.Int64).alias("__p"),
        )
    source = GeneratorSource(rows_per_second=None, total_rows=spec.rows, cards=spec.cards,
                             partitions=spec.partitions, max_delay="5s", seed=spec.seed,
                             start=GEN_START)
    start = source.initial_offset()
    rows = source.read(start, source.latest_offset(start, capped=False)).data
    return rows.select(
        "event_id", "card_id", pl.col("amount").cast(MONEY), "event_time",
        (pl.col("event_id") % spec.partitions).cast(pl.Int64).alias("__p"),
    )


def expected_output(spec: JobSpec, rows: pl.DataFrame) -> pl.DataFrame:
    """The one-shot Polars result: every window (or session) that the final
    watermark closes, with ``n`` and ``total`` (exact decimal sums), sorted by key;
    for ``fire_once``, every window with at least ``FIRE_AT`` rows, closed or not,
    with its final ``n`` and ``total`` (the fired row holds them as they were when
    it fired: at least ``FIRE_AT``, at most the final values)."""
    delay = parse_duration_ms(spec.delay)
    t = pl.col("event_time").dt.epoch("ms")
    final_wm = rows.group_by("__p").agg(t.max()).get_column("event_time").min() - delay
    total = pl.col("amount").sum()
    if spec.agg == "session":
        gap = parse_duration_ms(spec.gap)
        keyed = (
            rows.with_columns(t.alias("__t")).sort("card_id", "__t", maintain_order=True)
            .with_columns((pl.col("__t") + gap).cum_max().over("card_id").alias("__end"))
            .with_columns((pl.col("__t") > pl.col("__end").shift(1).over("card_id"))
                          .fill_null(True).cum_sum().over("card_id").alias("__sid"))
            .group_by("card_id", "__sid")
            .agg(pl.col("__t").min().alias("ws"), (pl.col("__t").max() + gap).alias("we"),
                 pl.len().alias("n"), total.alias("total"))
        )
    else:
        size = parse_duration_ms(spec.window)
        keyed = (
            rows.with_columns((t // size * size).alias("ws"))
            .group_by("ws", "card_id")
            .agg(pl.len().alias("n"), total.alias("total"))
            .with_columns((pl.col("ws") + size).alias("we"))
        )
    # fire_once fires as rows arrive: whether the window closed does not matter
    closed = pl.col("n") >= FIRE_AT if spec.agg == "fire_once" else pl.col("we") <= final_wm
    return normalize(
        keyed.filter(closed).select(
            pl.from_epoch("ws", time_unit="ms").alias("window_start"),
            pl.from_epoch("we", time_unit="ms").alias("window_end"),
            "card_id", "n", "total",
        )
    )


def normalize(frame: pl.DataFrame) -> pl.DataFrame:
    """Comparable columns: naive-UTC millisecond window bounds, Int64 counts, sorted."""
    schema = {"window_start": pl.Datetime("ms"), "window_end": pl.Datetime("ms"),
              "card_id": pl.Int64, "n": pl.Int64, "total": pl.Decimal(38, 2)}
    if frame.width == 0:
        return pl.DataFrame(schema=schema)
    exprs = []
    for name in ("window_start", "window_end"):
        expr = pl.col(name)
        dtype = frame.schema[name]
        if isinstance(dtype, pl.Datetime) and dtype.time_zone:
            expr = expr.dt.convert_time_zone("UTC").dt.replace_time_zone(None)
        exprs.append(expr.dt.cast_time_unit("ms"))
    return (
        frame.select("window_start", "window_end", "card_id", "n", "total")
        .with_columns(*exprs)
        .cast(schema)  # type: ignore[arg-type]
        .sort(KEYS)
    )


def read_output(spec: JobSpec, out: Path) -> pl.DataFrame:
    """What the job's sink holds, normalized like :func:`expected_output` (Kafka:
    what a ``read_committed`` consumer of the output topic sees)."""
    if spec.sink == "kafka":
        return parse_json_rows(consume_topic(spec.bootstrap, f"{spec.topic}-out"))
    if spec.sink == "webhook":
        return read_webhook(out.parent / "received.jsonl")[0]
    if spec.sink == "delta":
        if not (out / "_delta_log").is_dir():
            return normalize(pl.DataFrame())
        return normalize(pl.read_delta(str(out)))
    if spec.sink == "iceberg":
        return normalize(read_iceberg_output(out))
    return normalize(mb.parquet_table(out)) if out.is_dir() else normalize(pl.DataFrame())


def read_iceberg_output(out: Path) -> pl.DataFrame:
    """The job's Iceberg table (``reliability_job.ICEBERG_TABLE`` in the SQLite
    catalog under ``out``), scanned by PyIceberg; empty before its first commit."""
    import reliability_job

    from sinks.iceberg_catalog import load_iceberg_table, resolve_catalog

    if not (out / "catalog.db").is_file():
        return pl.DataFrame()
    table = load_iceberg_table(resolve_catalog(reliability_job.iceberg_catalog(str(out))),
                               reliability_job.ICEBERG_TABLE)
    if table is None:
        return pl.DataFrame()
    frame = pl.from_arrow(table.scan().to_arrow())
    assert isinstance(frame, pl.DataFrame)
    return frame


def parse_json_rows(values: list[bytes]) -> pl.DataFrame:
    """Result rows serialized as JSON objects (``write_ndjson``: ISO-8601 window
    bounds, exact decimal strings), normalized."""
    if not values:
        return normalize(pl.DataFrame())
    text = b"\n".join(values)
    frame = pl.read_ndjson(text, schema={"window_start": pl.String, "window_end": pl.String,
                                         "card_id": pl.Int64, "n": pl.Int64,
                                         "total": pl.String})
    when = [pl.col(c).str.to_datetime("%+", time_unit="ms", time_zone="UTC")
            for c in ("window_start", "window_end")]
    return normalize(frame.with_columns(*when, pl.col("total").cast(pl.Decimal(38, 2))))


def read_webhook(log: Path) -> tuple[pl.DataFrame, dict[str, int]]:
    """The rows a webhook receiver accepted (the first body of each key) and its
    counts: ``deliveries`` (2xx answers, redeliveries included), ``redeliveries``
    (the same key and body again), ``conflicts`` (the same key, another body)."""
    entries = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    accepted = [e for e in entries if e["status"] == 200 and not e["duplicate"]]
    counts = {
        "deliveries": sum(200 <= e["status"] < 300 for e in entries),
        "redeliveries": sum(e["status"] == 200 and e["duplicate"] for e in entries),
        "conflicts": sum(e["status"] == 409 for e in entries),
    }
    return parse_json_rows([e["body"].encode() for e in accepted]), counts


def consume_topic(bootstrap: str, topic: str, *, read_committed: bool = True) -> list[bytes]:
    """Every value of ``topic`` from the beginning to its end now."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"check-{os.getpid()}-{time.time_ns()}",
        "enable.auto.commit": False, "enable.partition.eof": True,
        "isolation.level": "read_committed" if read_committed else "read_uncommitted",
    })
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        parts = sorted(meta.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        done: set[int] = set()
        out: list[bytes] = []
        idle_since = time.monotonic()
        while len(done) < len(parts):
            if time.monotonic() - idle_since > 60:
                raise RuntimeError(f"{topic}: partitions {set(parts) - done} never reached "
                                   "their end")
            for m in consumer.consume(10_000, timeout=0.5):
                idle_since = time.monotonic()
                if m.error() is not None:
                    if m.error().code() == -191:  # _PARTITION_EOF
                        done.add(m.partition())
                    continue
                out.append(m.value())
        return out
    finally:
        consumer.close()


def _create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    """Create the topics (if new: a resumed soak finds them) and wait until their
    partitions are known."""
    from sinks.kafka_client import create_topics

    create_topics(bootstrap, names, partitions=partitions, replication_factor=1, exist_ok=True)


def verify(spec: JobSpec, work: Path) -> Verdict:
    """Compare the job's output (and side outputs) with the one-shot computation."""
    rows = input_rows(spec)
    want = expected_output(spec, rows)
    extra: dict[str, Any] = {}
    if spec.sink == "webhook":
        got, extra = read_webhook(work / "received.jsonl")
    else:
        got = read_output(spec, work / "out")
        if spec.sink == "kafka":
            everything = len(consume_topic(spec.bootstrap, f"{spec.topic}-out",
                                           read_committed=False))
            extra["aborted_rows"] = everything - got.height
    counts = got.group_by(KEYS).len()
    both = want.join(got, on=KEYS, how="inner", suffix="_got")
    if spec.agg == "fire_once":  # fired early: at least FIRE_AT, at most the final values
        differs = (
            (pl.col("n_got") < FIRE_AT) | (pl.col("n_got") > pl.col("n"))
            | (pl.col("total_got") > pl.col("total"))
        )
        equal = got.select(KEYS).equals(want.select(KEYS))
    else:
        differs = (pl.col("n") != pl.col("n_got")) | (pl.col("total") != pl.col("total_got"))
        equal = got.equals(want)
    wrong = both.filter(
        differs | (pl.col("window_end") != pl.col("window_end_got"))
    ).height
    late_dir = work / "out-late"
    dead_dir = work / "chk" / "dead_letter"
    dead = mb.parquet_table(dead_dir) if dead_dir.is_dir() else pl.DataFrame()
    return Verdict(
        **extra,
        records_in=rows.height,
        records_out=int(got.get_column("n").sum() or 0),
        records_expected=int(want.get_column("n").sum() or 0),
        rows_expected=want.height,
        rows_out=got.height,
        duplicates=int(counts.filter(pl.col("len") > 1).get_column("len").sum() or 0)
        + extra.get("conflicts", 0),
        missing=want.join(got, on=KEYS, how="anti").height,
        extra=got.join(want, on=KEYS, how="anti").height,
        wrong_values=wrong,
        late_rows=mb.parquet_table(late_dir).height if late_dir.is_dir() else 0,
        dead_letters=dead.height,
        dead_letters_expected=BAD_LINES_PER_FILE * spec.files if spec.landed_input else 0,
        dead_letter_duplicates=dead.height - dead["location"].n_unique() if dead.height else 0,
        equal=equal,
    )
