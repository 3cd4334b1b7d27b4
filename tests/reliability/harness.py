"""Crash-injection harness: run a real job, kill it, restart it, check the output.

The job (``reliability_job.py``) runs as a ``microbatch run`` subprocess on one
checkpoint. Each run is ended as its :class:`Kill` says:

- ``point``: ``MICROBATCH_FAULT=POINT[@BATCH]``, the engine SIGKILLs itself at
  a named lifecycle point (``microbatch.faults.POINTS``; the Delta sink has
  ``sink.before_commit`` / ``sink.after_commit`` instead of ``sink.after_data``);
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
"""

from __future__ import annotations

import contextlib
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
from typing import Literal

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
               "delta": ("sink.before_commit", "sink.after_commit")}
"""The fault points inside each sink's ``add_batch``."""
UNBATCHED = {p for points in SINK_POINTS.values() for p in points}
"""Points armed without a batch id (the first time the run passes them): the
Delta sink skips them for batches without rows."""
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

    source: Literal["generator", "files"] = "generator"
    agg: Literal["tumbling", "session", "fire_once"] = "tumbling"
    sink: Literal["parquet", "delta"] = "parquet"
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
    """Input files of the ``files`` source (EVENTS_PER_FILE good rows each, 50 s
    of event time per file)."""
    snapshot_every: int | None = 4
    state_retention: int | None = 3

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

    @property
    def exact(self) -> bool:
        """Nothing lost, nothing twice, nothing changed, nothing late."""
        return (
            self.equal
            and self.duplicates == self.missing == self.extra == self.wrong_values == 0
            and self.late_rows == 0
            and self.dead_letters == self.dead_letters_expected
            and self.dead_letter_duplicates == 0
        )


@dataclass
class Soak:
    """One job variant on one checkpoint: its runs and the final verdict."""

    spec: JobSpec
    work: Path
    outcomes: list[RunOutcome] = field(default_factory=list)
    verdict: Verdict | None = None
    landed: int = 0
    """Input files written so far (``files`` source: more land between runs)."""

    @property
    def chk(self) -> Path:
        """The checkpoint directory."""
        return self.work / "chk"

    @property
    def kills(self) -> int:
        """Runs that ended in SIGKILL."""
        return sum(o.killed for o in self.outcomes)

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
        """Create the work directory; land three quarters of the input files."""
        self.work.mkdir(parents=True, exist_ok=True)
        if self.spec.source == "files":
            (self.work / "in").mkdir(exist_ok=True)
            self.land(self.spec.files * 3 // 4)
        else:
            self.landed = self.spec.files  # the generator's log is there from the start

    def land(self, count: int) -> None:
        """Write the next ``count`` input files (``files`` source), atomically."""
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
               str(self.chk), "--trigger", "available-now", *self.spec.params(self.work)]
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
        outcome = self.run(Kill("clean"))
        if outcome.returncode != 0:
            raise AssertionError(
                f"{self.spec.name}: the clean run failed ({outcome.returncode}):\n"
                f"{outcome.stderr[-3000:]}\nhistory: {self.history()}"
            )
        self.verdict = verify(self.spec, self.work)
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
        if point in UNBATCHED:
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
    return points[:at] + missing + points[at:] + list(STATE_FAULTS)


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
    run.finish()
    return run


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


def input_rows(spec: JobSpec) -> pl.DataFrame:
    """Every good input record the job reads, with its watermark partition ``__p``."""
    if spec.source == "files":
        records = [r for index in range(spec.files) for r in file_records(spec, index)]
        return pl.DataFrame(records).select(
            pl.col("event_id").cast(pl.Int64), pl.col("card_id").cast(pl.Int64),
            pl.col("amount").cast(pl.Float64).cast(MONEY),
            pl.col("event_time").str.to_datetime("%+", time_unit="ms", time_zone="UTC"),
            pl.lit(0, pl.Int64).alias("__p"),
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
    """What the job's sink holds, normalized like :func:`expected_output`."""
    if spec.sink == "delta":
        if not (out / "_delta_log").is_dir():
            return normalize(pl.DataFrame())
        return normalize(pl.read_delta(str(out)))
    return normalize(mb.parquet_table(out)) if out.is_dir() else normalize(pl.DataFrame())


def verify(spec: JobSpec, work: Path) -> Verdict:
    """Compare the job's output (and side outputs) with the one-shot computation."""
    rows = input_rows(spec)
    want = expected_output(spec, rows)
    got = read_output(spec, work / "out")
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
        records_in=rows.height,
        records_out=int(got.get_column("n").sum() or 0),
        records_expected=int(want.get_column("n").sum() or 0),
        rows_expected=want.height,
        rows_out=got.height,
        duplicates=int(counts.filter(pl.col("len") > 1).get_column("len").sum() or 0),
        missing=want.join(got, on=KEYS, how="anti").height,
        extra=got.join(want, on=KEYS, how="anti").height,
        wrong_values=wrong,
        late_rows=mb.parquet_table(late_dir).height if late_dir.is_dir() else 0,
        dead_letters=dead.height,
        dead_letters_expected=BAD_LINES_PER_FILE * spec.files if spec.source == "files" else 0,
        dead_letter_duplicates=dead.height - dead["location"].n_unique() if dead.height else 0,
        equal=equal,
    )
