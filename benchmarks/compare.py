"""``python -m benchmarks.compare [WORKLOAD ...] [--quick] [--install] [--engines ...]
[--data DIR] [--spark-default-partitions]`` (also ``python -m benchmarks compare ...``).

Runs the same workloads, on the same generated data, on this engine, on
Spark Structured Streaming (PySpark, ``local[2]``, 2 shuffle partitions),
Bytewax and Quix Streams (over a local Kafka broker started with
``scripts/kafka_broker.py``, which also serves Q5, where every engine reads one
3-partition topic), and on the one-shot Polars computation of the same
result (the limit). Each engine runs in a fresh process, interleaved,
repeated (median of 3 and spread; ``--quick``: 1 process), and every process
runs the workload twice (:mod:`benchmarks.compare_engines`): **cold**, the
first run in the fresh process (imports, first calls and the JVM's JIT
included), then **warm**, the same workload again in the same process (Spark:
the same SparkSession and JVM). The report shows both; every ratio uses the
warm figures. Peak memory is the resident set of the engine's whole process
tree (JVM included) over both runs, sampled every 50 ms. Outputs of the warm
runs are checked against this engine's (:mod:`benchmarks.compare_check`), and
each engine's cold output against its warm one.

``--data DIR`` runs the event workloads (Q1-Q3, Q5) on ``DIR`` instead of the
generated data, e.g. ``python -m benchmarks.compare q1-small q1-large --data
DIR``: a directory of Parquet files with the generator's columns
(``event_id``, ``card_id`` int64, ``merchant`` string, ``amount`` float64,
``event_time`` datetime in ms or us, UTC), read in file-name order (when their
modification times do not follow their names, a copy whose do is made under
``benchmarks/.data/staged``, since the file sources of this engine and Spark
admit files by modification time). Rows per batch = rows per file (the mean,
from the Parquet metadata) times files per batch (q1-small: 1, q1-large: 10); Q4
keeps its generated 1,000-row files. ``--spark-default-partitions`` also runs
Spark with its default 200 shuffle partitions (engine ``spark-200p``).

Durations on the 2-core machine when each process ran the workload once
(now it runs it twice: count on up to twice as long): ``--quick`` ~35 min
(Quix's session windows alone time out, at 10 min); ``--quick --reps 3
--record-reps 1`` ~1 h; the full run over 2 h for every workload (Spark and
the per-record peers take 10-20 min per run on Q2 and Q3), ~15 min for
``q1-small q1-large`` without the per-record peers. With cold and warm runs,
``q1-small q1-large q4 --quick --engines microbatch spark bytewax
polars-oneshot`` took 10.5 min with other work loading the machine (1-minute
load 4-7).

Writes ``benchmarks/results/compare/<quick|full>/compare.md``, ``compare.json``
and ``compare.png``. A peer that cannot be installed or run here is skipped
with the reason, never a crash. ``--install`` pip-installs the ``bench``
extra (each package on its own, so one failure skips one peer). The peers
are never needed by ``make test``; ``make bench-peers`` does all of it from a
fresh clone in a separate venv (``benchmarks/.venv-peers``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import data
from benchmarks.compare_engines import (
    ALL_ENGINES,
    ENGINES,
    SPARK_CONF,
    SPARK_DEFAULT_PARTITIONS,
    SPARK_DEFAULT_SHUFFLE_PARTITIONS,
    WORKLOADS,
    Spec,
    base_engine,
)
from benchmarks.compare_summary import HEADLINE, measurement
from benchmarks.harness import PHASES, fmt_num, markdown_table, median, ratio, run_process
from scripts.kafka_broker import BrokerError, LocalBroker

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "compare"
BROKER_DIR = data.ROOT / "kafka-broker"
SCRATCH = data.ROOT / "compare-runs"

PEERS = {"spark": "pyspark", "bytewax": "bytewax", "quix": "quixstreams"}
"""Peer engine -> the module it needs (its pip package is in the ``bench`` extra)."""

NOT_APPLICABLE = {
    ("bytewax", "q1-large"): "per-record dataflow: the batch size does not change its work "
                             "(its input yields one file per batch; see q1-small)",
    ("quix", "q1-large"): "per-record consumer of a Kafka topic: no batch size (see q1-small)",
    ("quix", "q4"): "no batches to size: it consumes Kafka records one by one",
    ("microbatch-noop", "q5"): "the sink's share is shown on q1-small",
    ("spark-noop", "q5"): "the sink's share is shown on q1-small",
}
LABELS = {
    "polars-oneshot": ("one-shot Polars (limit)", "parquet"),
    "microbatch": ("microbatch (this engine)", "parquet"),
    "microbatch-noop": ("microbatch (this engine)", "noop"),
    "spark": ("Spark Structured Streaming", "parquet"),
    "spark-noop": ("Spark Structured Streaming", "noop"),
    SPARK_DEFAULT_PARTITIONS: (f"Spark SS, {SPARK_DEFAULT_SHUFFLE_PARTITIONS} shuffle "
                               "partitions (its default)", "parquet"),
    "bytewax": ("Bytewax", "list → parquet"),
    "quix": ("Quix Streams (Kafka)", "list → parquet"),
}


# --------------------------------------------------------------------------- peers


def bench_requirements() -> list[str]:
    """The ``bench`` extra of pyproject.toml."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extra: list[str] = meta["project"]["optional-dependencies"].get("bench", [])
    return extra


def install_extras() -> dict[str, str]:
    """pip-install the project and each ``bench`` requirement on its own; failures."""
    failures: dict[str, str] = {}
    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    print(f"installing the project and the bench extra into {sys.prefix} ...", flush=True)
    proc = subprocess.run([*pip, "-e", str(ROOT)], capture_output=True, text=True, check=False)
    if proc.returncode:
        failures["microbatch"] = _last_line(proc.stderr)
    for req in bench_requirements():
        print(f"  pip install {req}", flush=True)
        proc = subprocess.run([*pip, req], capture_output=True, text=True, check=False)
        if proc.returncode:
            failures[req] = _last_line(proc.stderr)
            print(f"    failed: {failures[req]}", flush=True)
    importlib.invalidate_caches()
    return failures


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def probe_peers(wanted: list[str], install_failures: dict[str, str]) -> dict[str, str]:
    """Peer engine -> why it is skipped (only the skipped ones)."""
    skipped: dict[str, str] = {}
    for engine in wanted:
        base = base_engine(engine)
        module = PEERS.get(base)
        if module is None:
            continue
        if importlib.util.find_spec(module) is None:
            failed = [f"{req}: {why}" for req, why in install_failures.items()
                      if req.startswith(module)]
            skipped[engine] = ("pip install failed: " + failed[0] if failed else
                               f"`{module}` is not installed (pip install -e '.[bench]', "
                               "or run with --install)")
            continue
        if base == "spark" and shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            skipped[engine] = "no Java runtime (PySpark needs JDK 17+ on PATH or JAVA_HOME)"
        if base == "quix" and importlib.util.find_spec("confluent_kafka") is None:
            skipped[engine] = "confluent-kafka is not installed"
    return skipped


def java_version() -> str:
    try:
        proc = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "none"
    first = (proc.stderr or proc.stdout).strip().splitlines()
    return first[0] if first else "unknown"


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("polars", "pyarrow", "pyspark", "bytewax", "quixstreams", "confluent-kafka",
                "deltalake"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    out["java"] = java_version()
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=False)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--",
                                "microbatch", "statestore", "sinks"], capture_output=True,
                               text=True, timeout=10, check=False)
        out["microbatch"] = head.stdout.strip() + (
            " + uncommitted engine changes" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        out["microbatch"] = "unknown"
    out["python"] = platform.python_version()
    return out


# --------------------------------------------------------------------------- Kafka


@dataclass
class Broker:
    """A broker from ``scripts/kafka_broker.py`` (started by us, stopped by us)."""

    bootstrap: str | None = None
    error: str | None = None
    started: bool = False
    topics: dict[str, str] = field(default_factory=dict)

    def start(self) -> None:
        try:
            self.bootstrap = LocalBroker(BROKER_DIR).start()
        except (BrokerError, OSError) as exc:
            self.error = f"the Kafka broker did not start: {_last_line(str(exc))}"
            return
        self.started = True

    def stop(self) -> None:
        if self.started:
            LocalBroker(BROKER_DIR).stop()

    def topic_for(self, ds: data.EventFiles, partitions: int = 1) -> str:
        """A topic of ``partitions`` partitions with ``ds``'s rows in arrival order
        within each partition (made once; kept across runs of the runner)."""
        name = f"compare-{ds.path.name}-p{partitions}"
        if name in self.topics:
            return name
        assert self.bootstrap
        if _topic_size(self.bootstrap, name) != (ds.rows, partitions):
            _produce(self.bootstrap, name, ds, partitions)
        self.topics[name] = name
        return name


def _topic_size(bootstrap: str, topic: str) -> tuple[int, int] | None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "compare-probe"})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return None
        total = 0
        for p in meta.partitions:
            lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            total += hi - lo
        return total, len(meta.partitions)
    finally:
        consumer.close()


def _produce(bootstrap: str, topic: str, ds: data.EventFiles, partitions: int) -> None:
    """Key = card id, value = JSON row, timestamp = event time; file order; partition =
    card id mod ``partitions`` (so each card's rows stay in one ordered partition)."""
    import polars as pl
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    from sinks.kafka_client import create_topics

    AdminClient({"bootstrap.servers": bootstrap}).delete_topics([topic])
    time.sleep(1)
    # Event times are in the past: without retention.ms=-1 the broker deletes the
    # segments at once (time-based retention looks at the message timestamps).
    create_topics(bootstrap, [topic], partitions=partitions, replication_factor=1,
                  topic_config={"retention.ms": "-1", "retention.bytes": "-1"})
    time.sleep(1)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50,
                         "batch.size": 1_000_000, "compression.type": "lz4",
                         "queue.buffering.max.messages": 2_000_000})
    t0 = time.perf_counter()
    print(f"  producing {ds.rows:,} records to Kafka topic {topic} ...", end=" ", flush=True)
    for path in ds.file_paths():
        frame = pl.read_parquet(path).select(
            pl.col("card_id").cast(pl.String).alias("key"),
            pl.struct(pl.col("event_id"), pl.col("card_id"), pl.col("amount"),
                      pl.col("event_time").dt.epoch("ms").alias("event_time"))
            .struct.json_encode().alias("value"),
            pl.col("event_time").dt.epoch("ms").alias("ts"),
            (pl.col("card_id") % partitions).alias("partition"),
        )
        for key, value, ts, partition in frame.iter_rows():
            while True:
                try:
                    producer.produce(topic, value=value, key=key, timestamp=ts,
                                     partition=partition)
                    break
                except BufferError:
                    producer.poll(0.1)
        producer.poll(0)
    if producer.flush(300):
        raise RuntimeError("Kafka producer could not flush")
    print(f"{time.perf_counter() - t0:.1f} s", flush=True)


# --------------------------------------------------------------------------- runs


@dataclass
class Cell:
    """All repetitions of one engine on one workload (each a cold and a warm run)."""

    engine: str
    workload: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    skipped: str | None = None
    check: str = ""
    check_detail: list[str] = field(default_factory=list)

    def rates(self, phase: str = HEADLINE) -> list[float]:
        """Events/s of each repetition's ``phase`` run."""
        from benchmarks.compare_summary import rates

        return rates({"runs": self.runs}, phase)

    def rate(self, phase: str = HEADLINE) -> float:
        """Median events/s of the ``phase`` runs (NaN when none)."""
        found = self.rates(phase)
        return median(found)

    def first(self, phase: str = HEADLINE) -> dict[str, Any] | None:
        """The first repetition's ``phase`` run (checks and profiles use it)."""
        return measurement(self.runs[0], phase) if self.runs else None

    def checked(self) -> dict[str, Any] | None:
        """The run whose output is checked: the first warm one, else the cold one."""
        return self.first("warm") or self.first("cold")

    @property
    def peak_mb(self) -> float:
        return max((r["peak_tree_rss_mb"] for r in self.runs), default=math.nan)


def run_one(engine: str, spec: Spec, quick: bool, rep: int, *, timeout_s: float,
            topic: str | None, bootstrap: str | None) -> dict[str, Any]:
    """One worker process (:func:`benchmarks.harness.run_process`), its cold and warm
    runs (``timeout_s`` each), its tree's RSS sampled. Raises when not even the cold
    run finished; a warm run that did not leaves the cold one and ``warm_error``."""
    workdir = SCRATCH / spec.name / f"{engine}-r{rep}"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    limit = timeout_s * len(PHASES)
    run = run_process(worker_command(engine, spec, quick, workdir, workdir / "result.json",
                                     topic=topic, bootstrap=bootstrap),
                      result_file=workdir / "result.json", log=workdir / "stderr.log",
                      timeout_s=limit, cwd=ROOT, sample_tree_rss=True)
    failure = run.failure
    if failure is not None and failure.startswith("timed out"):
        rows = spec.dataset(quick).rows
        failure = (f"timed out after {limit:.0f} s for the cold and warm runs "
                   f"(< {rows / limit:,.0f} events/s on {rows:,} events)")
    measured = run.result or {}
    if "cold" not in measured:
        raise RuntimeError(failure or f"no result written (log: {run.log})")
    result: dict[str, Any] = {
        phase: {**m, "output_file": str(workdir / phase / "result.parquet")}
        for phase, m in measured.items()}
    result["peak_tree_rss_mb"] = run.peak_tree_rss_mb
    result["process_s"] = run.seconds
    result["load_avg_1m"] = os.getloadavg()[0]
    if "warm" not in measured:
        result["warm_error"] = failure or "no warm result written"
    return result


def worker_command(engine: str, spec: Spec, quick: bool, workdir: Path, result_file: Path,
                   *, topic: str | None, bootstrap: str | None) -> list[str]:
    """The command line of the worker process (:mod:`benchmarks.compare_engines`)."""
    cmd = [sys.executable, "-m", "benchmarks.compare_engines", engine, spec.name, str(workdir),
           str(result_file)]
    if quick:
        cmd.append("--quick")
    if topic and bootstrap:
        cmd += ["--bootstrap", bootstrap, "--topic", topic]
    if spec.data_dir is not None:
        cmd += ["--data", str(spec.data_dir)]
    return cmd


# --------------------------------------------------------------------------- checks


def check_cells(spec: Spec, quick: bool, cells: dict[str, Cell]) -> None:
    """Fill each cell's ``check`` from the warm runs (a cell without one: its cold run):
    ours vs the simulated reference, peers vs ours; then each cell's cold output
    against its warm output."""
    from benchmarks import compare_check as cc

    ours = cells.get("microbatch")
    ours_run = ours.checked() if ours else None
    ours_out = cc.load(Path(ours_run["output_file"])) if ours_run else None
    limit = cells.get("polars-oneshot")
    limit_run = limit.checked() if limit else None
    all_rows = cc.load(Path(limit_run["output_file"])) if limit_run else None
    final_wm = cc.final_watermark(ours_run) if ours_run else None
    if ours and ours_run and spec.kafka_partitions:
        if all_rows is None or ours_out is None:
            ours.check = "not checked: Q5 is checked against the polars-oneshot run"
        else:
            verdict, detail = cc.check_against_all(ours_out, all_rows, final_wm or 0,
                                                   int(ours_run.get("late_rows") or 0))
            ours.check, ours.check_detail = f"vs one-shot: {verdict}", detail
    elif ours and ours_run and spec.windowed:
        try:
            from benchmarks import windowed
            from benchmarks.compare_engines import _oneshot_case

            verdict, detail = windowed.check(_oneshot_case(spec), spec.dataset(quick),
                                             ours_run)
            ours.check, ours.check_detail = f"vs simulated reference: {verdict}", detail
        except Exception as exc:
            ours.check = f"check failed: {type(exc).__name__}: {exc}"
    if ours and ours_out is not None and all_rows is not None and not spec.windowed:
        verdict, _counts = cc.compare_rows(all_rows, ours_out)
        ours.check = f"vs one-shot: {verdict}"
    for engine, cell in cells.items():
        peer_run = cell.checked()
        if peer_run is None or engine == "microbatch":
            continue
        peer_out = cc.load(Path(peer_run["output_file"]))
        if peer_out is None:
            cell.check = "noop sink: rate only"
            continue
        if engine == "polars-oneshot":
            cell.check = ("all rows, no lateness, every window (the limit's result)"
                          if spec.windowed else f"{peer_out.height:,} rows")
            if not spec.windowed and ours_out is not None:
                cell.check, _ = cc.compare_rows(ours_out, peer_out)
            continue
        if ours_out is None:
            cell.check = "not checked: this engine's output is missing"
            continue
        try:
            if spec.windowed:
                verdict, detail, counts = cc.compare_windows(
                    ours_out, peer_out, all_rows if all_rows is not None else ours_out, final_wm)
                cell.check, cell.check_detail = verdict, detail
                peer_run["check_counts"] = counts
                if (base_engine(engine) == "spark" and spec.query in ("q1", "q2")
                        and final_wm is not None and not spec.kafka_partitions):
                    cell.check += "; " + _spark_rule_check(spec, quick, peer_out, final_wm)
            else:
                cell.check, counts = cc.compare_rows(ours_out, peer_out)
                peer_run["check_counts"] = counts
        except Exception as exc:
            cell.check = f"check failed: {type(exc).__name__}: {exc}"
    for cell in cells.values():
        consistency = _cold_vs_warm(spec, cell)
        if consistency:
            cell.check = f"{cell.check}; {consistency}" if cell.check else consistency


def _cold_vs_warm(spec: Spec, cell: Cell) -> str:
    """Whether the first repetition's cold run wrote the same output as its warm run
    (empty when there is nothing to compare: a no-op sink or a missing run)."""
    from benchmarks import compare_check as cc

    cold, warm = cell.first("cold"), cell.first("warm")
    if cold is None or warm is None:
        return ""
    cold_out, warm_out = cc.load(Path(cold["output_file"])), cc.load(Path(warm["output_file"]))
    if cold_out is None or warm_out is None:
        return ""
    try:
        if spec.windowed:
            verdict, _detail, _counts = cc.compare_windows(warm_out, cold_out, warm_out, None)
        else:
            verdict, _counts = cc.compare_rows(warm_out, cold_out)
    except Exception as exc:
        return f"cold vs warm output: check failed: {type(exc).__name__}: {exc}"
    return "cold output = warm output" if verdict.startswith("agrees") else (
        f"cold output ≠ warm output: {verdict}")


def _spark_rule_check(spec: Spec, quick: bool, peer_out: Any, final_wm: int) -> str:
    """Spark's output against a simulation of Spark's own late-row rule."""
    from benchmarks import compare_check as cc
    from benchmarks.compare_engines import _oneshot_case

    expected = cc.spark_rule_reference(_oneshot_case(spec), spec.dataset(quick),
                                       spec.files_per_batch, final_wm)
    _verdict, _detail, counts = cc.compare_windows(expected, peer_out, expected, final_wm)
    if counts["same"] == expected.height == peer_out.height:
        return (f"all {peer_out.height:,} windows equal a simulation of Spark's rule "
                "(late rows cut with the previous batch's watermark)")
    return (f"vs a simulation of Spark's rule (previous batch's watermark): "
            f"{counts['same']:,} of {expected.height:,} equal")


# --------------------------------------------------------------------------- report

AT_A_GLANCE = (
    "Events/s with the sink that writes the result (median of the runs), cold (the first "
    "run in a fresh process) · warm (the same again in that process); ratios use the warm "
    "figures. The full table, checks and profiles follow.")


def fmt_rate(x: float) -> str:
    """Events/s as ``1.23M``."""
    return fmt_num(x)


def rows_per_batch(specs: list[Spec], quick: bool) -> dict[str, int]:
    """Workload name -> rows (Q5: records) per batch over the data this run read."""
    return {spec.name: spec.rows_per_batch(quick) for spec in specs}


def _without_progress(run: dict[str, Any]) -> dict[str, Any]:
    """A run record without the per-batch progress of its cold and warm runs."""
    return {key: ({k: v for k, v in value.items() if k != "progress"}
                  if key in PHASES and isinstance(value, dict) else value)
            for key, value in run.items()}


def cells_json(specs: list[Spec], table: dict[str, dict[str, Cell]]) -> dict[str, Any]:
    """The cells as ``compare.json`` stores them (progress left out)."""
    return {s.name: {e: {"skipped": c.skipped, "check": c.check,
                         "runs": [_without_progress(r) for r in c.runs]}
                     for e, c in table[s.name].items()} for s in specs}


def _cell_note(cell: Cell) -> str:
    """Start-up left out of the timing, batches, ms per batch cold and warm, late items,
    and a warm run that failed."""
    cold, warm = cell.first("cold"), cell.first("warm")
    notes = []
    if cold and cold.get("startup_s"):
        what = ("SparkSession/JVM start" if base_engine(cell.engine) == "spark"
                else "consumer start")
        notes.append(f"+{cold['startup_s']:.1f} s {what} not timed (cold)")
    timed = [(phase, m) for phase, m in (("cold", cold), ("warm", warm))
             if m and m.get("batches")]
    if timed:
        per_batch = ", ".join(f"{m['wall_s'] * 1000 / m['batches']:.0f} ms/batch {phase}"
                              for phase, m in timed)
        notes.append(f"{timed[0][1]['batches']} batches, {per_batch}")
    late = (warm or cold or {}).get("late_rows")
    if late is not None and cell.engine == "bytewax":
        notes.append(f"{late:,} late items")
    if cell.runs and cell.runs[0].get("warm_error"):
        notes.append(f"warm run failed: {cell.runs[0]['warm_error']}")
    return "; ".join(notes)


def render(specs: list[Spec], table: dict[str, dict[str, Cell]], quick: bool, *,
           engines: list[str], skipped_peers: dict[str, str], info: dict[str, Any]) -> str:
    """The Markdown report of a comparison run."""
    lines = [
        *_preamble(specs, table, quick, info),
        "", "## At a glance", "", AT_A_GLANCE, "",
        *summary_matrix(cells_json(specs, table), quick, specs),
        "", _spark_partitions_note(specs, table),
        "", "## Every engine and sink", "",
        *_engine_table(specs, table, quick, engines),
        *_load_note(table, info),
        "", "Workloads:", "", *_workload_lines(specs, quick),
        *_skipped_lines(table, engines, skipped_peers),
        *_lateness_lines(),
        *_difference_lines(specs, table),
        *_profile_lines(specs, table),
    ]
    return "\n".join(lines)


def _preamble(specs: list[Spec], table: dict[str, dict[str, Cell]], quick: bool,
              info: dict[str, Any]) -> list[str]:
    """Title, machine and versions, data, and how to read the numbers."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    v = info["versions"]
    partitions = SPARK_CONF["spark.sql.shuffle.partitions"]
    return [
        f"# microbatch vs Spark, Bytewax, Quix Streams ({'quick' if quick else 'full'} run, "
        f"{stamp})",
        "",
        f"Machine: {info['nproc']} cores, {info['ram_gib']} GiB RAM, {info['cpu']}. "
        f"microbatch {v['microbatch']}, Python {v['python']}, Polars {v['polars']}, "
        f"PyArrow {v['pyarrow']}, "
        f"PySpark {v['pyspark']} ({v['java']}), Bytewax {v['bytewax']}, "
        f"Quix Streams {v['quixstreams']} (confluent-kafka {v['confluent-kafka']}).",
        "",
        _data_line(specs, table, quick),
        "",
        "- events/s = input rows / wall time of the query (start to end; Spark's JVM and "
        "SparkSession start-up and Quix's consumer-group join are noted, not timed).",
        "- cold = the first run in a fresh process (imports, first calls and the JVM's JIT "
        "compilation included); warm = the same workload again right after, in the same "
        "process (Spark: the same SparkSession and JVM), same data, query, batch size and "
        "sink, fresh output and checkpoint directories (Kafka readers: the topic from the "
        "start, a new consumer group). Every ratio uses the warm figures.",
        "- vs microbatch = engine rate / this engine's rate with the same sink kind "
        "(> 1: faster than us); vs one-shot = engine rate / one-shot Polars rate; "
        "microbatch ÷ Spark = our rate / Spark's.",
        "- peak RSS = resident memory of the engine's whole process tree over its cold and "
        "warm run (the PySpark JVM included; the Kafka broker, shared by Quix, not included).",
        f"- Spark: `local[2]`, `spark.sql.shuffle.partitions={partitions}` (one per core; "
        f"Spark's default is {SPARK_DEFAULT_SHUFFLE_PARTITIONS}), driver heap 4 GiB, "
        "`maxFilesPerTrigger`, `withWatermark`, `groupBy(window(...), card_id)`, "
        "available-now trigger, default (HDFS-backed) state store. Bytewax: one worker "
        "(`run_main`), event-time clock with a fixed system clock. Quix: one-partition "
        "topic (Q5: three), `closing_strategy=\"partition\"`, grace 10 s. Q5: every engine "
        "reads the same 3-partition topic (JSON values; event time = message timestamp); "
        "its one-shot limit is Q1's, over the Parquet files.",
    ]


def _data_line(specs: list[Spec], table: dict[str, dict[str, Cell]], quick: bool) -> str:
    """What the engines read, and how many processes each ran."""
    events = next((s.dataset(quick) for s in specs if not s.tiny), data.events(quick))
    tiny = data.tiny(quick)
    if isinstance(events, data.Dataset):
        what = (f"{events.rows:,} card transactions in {events.files} Parquet files in "
                f"arrival order (~{events.cards // 1000}k Zipf keys, {events.max_delay} "
                f"disorder, {events.late_fraction:.1%} late)")
    else:
        what = (f"{events.rows:,} rows in {events.files} Parquet files of `{events.path}` "
                f"(`--data`, read in name order; {events.rows_per_file:,} rows per file on "
                "average)")
    runs = sorted({len(c.runs) for cells in table.values() for c in cells.values() if c.runs})
    reps = ("1 process each" if runs == [1] else
            f"median of {'/'.join(map(str, runs))} processes (spread: min-max in brackets)")
    return (f"Data: {what}; Q4: {tiny.rows:,} rows in {tiny.files} files of 1,000. "
            f"Watermark delay 10 s, append mode. {reps}, each a fresh process running the "
            "workload cold, then warm.")


def _spark_partitions_note(specs: list[Spec], table: dict[str, dict[str, Cell]]) -> str:
    """What Spark's default shuffle partitions give: measured when ``spark-200p`` ran."""
    ours = SPARK_CONF["spark.sql.shuffle.partitions"]
    default = SPARK_DEFAULT_SHUFFLE_PARTITIONS
    for spec in specs:
        tuned = table[spec.name].get("spark")
        stock = table[spec.name].get(SPARK_DEFAULT_PARTITIONS)
        if tuned and stock and tuned.rates() and stock.rates():
            return (f"Spark with its default {default} shuffle partitions instead of {ours} "
                    f"(`{SPARK_DEFAULT_PARTITIONS}` rows below): {spec.name} "
                    f"{fmt_rate(stock.rate('cold'))}/s cold · {fmt_rate(stock.rate())}/s warm, "
                    f"{tuned.rate() / stock.rate():.1f}× slower warm "  # noqa: RUF001
                    f"than with {ours}.")
    return (f"Spark runs with {ours} shuffle partitions, one per core; with its default of "
            f"{default} every stateful batch runs {default} state-store tasks on the "
            f"{ours} cores (not measured in this run: `--spark-default-partitions` adds "
            f"Spark with {default} as `{SPARK_DEFAULT_PARTITIONS}`).")


def _rate_text(cell: Cell, phase: str) -> str:
    """Median events/s of ``phase``, with the min-max spread over several runs."""
    rates = cell.rates(phase)
    if not rates:
        return "-"
    spread = f" ({fmt_rate(min(rates))}-{fmt_rate(max(rates))})" if len(rates) > 1 else ""
    return fmt_rate(median(rates)) + spread


ENGINE_TABLE = ("workload", "rows/batch", "engine", "sink", "events/s cold", "events/s warm",
                "vs microbatch", "vs one-shot", "peak RSS (tree)", "output check", "notes")


def _engine_table(specs: list[Spec], table: dict[str, dict[str, Cell]], quick: bool,
                  engines: list[str]) -> list[str]:
    """Every engine and sink on every workload, cold and warm."""
    rows = [row for spec in specs for row in _engine_rows(spec, table[spec.name], quick,
                                                           engines)]
    return markdown_table(ENGINE_TABLE, rows, align="lrllrrrrrll")


def _engine_rows(spec: Spec, cells: dict[str, Cell], quick: bool,
                 engines: list[str]) -> list[tuple[str, ...]]:
    limit = cells.get("polars-oneshot")
    limit_rate = limit.rate() if limit else math.nan
    rpb = f"{spec.rows_per_batch(quick):,}"
    rows = []
    for engine in engines:
        cell = cells.get(engine)
        if cell is None:
            continue
        name, sink = LABELS[engine]
        if cell.skipped:
            rows.append((spec.name, rpb, name, sink, "skipped", "", "", "", "",
                         _esc(cell.skipped), ""))
            continue
        base = cells.get("microbatch-noop" if sink == "noop" else "microbatch")
        per = "per record" if engine in ("bytewax", "quix") and spec.query != "q4" else rpb
        rows.append((
            spec.name, per, name, sink, _rate_text(cell, "cold"), _rate_text(cell, "warm"),
            _ratio(ratio(cell.rate(), base.rate() if base else None)),
            _ratio(ratio(cell.rate(), limit_rate)), f"{cell.peak_mb:,.0f} MiB",
            _esc(cell.check), _esc(_cell_note(cell))))
    return rows


def _load_note(table: dict[str, dict[str, Cell]], info: dict[str, Any]) -> list[str]:
    loads = [r["load_avg_1m"] for cells in table.values() for c in cells.values()
             for r in c.runs if "load_avg_1m" in r]
    if not loads:
        return []
    return ["", f"1-minute load average at the end of the runs: {min(loads):.1f} to "
            f"{max(loads):.1f} on {info['nproc']} cores, the engine itself included (up to "
            f"{info['nproc']}); well above that, other processes were competing for the "
            "CPUs and the numbers are pessimistic."]


def _workload_lines(specs: list[Spec], quick: bool) -> list[str]:
    return [f"- **{s.name}**: {s.title}; " + (
        f"{s.rows_per_batch(quick):,} records per batch" if s.kafka_partitions else
        f"{s.files_per_batch} file(s) per batch") + "." for s in specs]


def _skipped_lines(table: dict[str, dict[str, Cell]], engines: list[str],
                   skipped_peers: dict[str, str]) -> list[str]:
    lines: list[str] = []
    if skipped_peers:
        lines += ["", "## Skipped peers", ""]
        lines += [f"- **{engine}**: {why}" for engine, why in skipped_peers.items()]
    na = [(e, w, why) for (e, w), why in NOT_APPLICABLE.items()
          if e in engines and w in table]
    if na:
        lines += ["", "Not applicable:", ""]
        lines += [f"- {e} on {w}: {why}" for e, w, why in na]
    return lines


def _lateness_lines() -> list[str]:
    from benchmarks.compare_check import LATENESS_RULES

    return ["", "## Late data: each engine's rule", "",
            *(f"- **{k}**: {v}" for k, v in LATENESS_RULES.items())]


def _difference_lines(specs: list[Spec], table: dict[str, dict[str, Cell]]) -> list[str]:
    lines = ["", "## Output differences (each engine's first warm run vs ours)", ""]
    for spec in specs:
        for engine, cell in table[spec.name].items():
            if cell.check_detail:
                lines += [f"### {spec.name}: {engine}", "", *cell.check_detail, ""]
    return lines


def _profile_lines(specs: list[Spec], table: dict[str, dict[str, Cell]]) -> list[str]:
    """Per-step profiles of this engine and Spark, from their first warm run."""
    from benchmarks.profile import step_profile

    lines = ["## Where the time goes (first warm run)", ""]
    for spec in specs:
        ours = table[spec.name].get("microbatch")
        run = ours.first("warm") if ours else None
        if run and run.get("progress"):
            lines += step_profile(f"{spec.name}, microbatch, warm", run)
        spark = table[spec.name].get("spark")
        run = spark.first("warm") if spark else None
        if run and run.get("progress"):
            lines += spark_profile(f"{spec.name}, Spark, warm", run)
    return lines


def summary_matrix(cells: dict[str, dict[str, Any]], quick: bool,
                   specs: list[Spec]) -> list[str]:
    """The at-a-glance matrix (:mod:`benchmarks.compare_summary`) of these cells."""
    from benchmarks.compare_summary import matrix, titles

    return matrix({"cells": cells}, titles(quick, rows_per_batch(specs, quick)))


def spark_profile(title: str, run: dict[str, Any]) -> list[str]:
    """Spark's per-batch ``durationMs`` (median over batches)."""
    progress = run["progress"]
    keys = sorted({k for p in progress for k in p["duration_ms"]})
    rows = []
    for key in keys:
        values = [float(p["duration_ms"].get(key, 0)) for p in progress]
        rows.append((key, f"{sum(values):.0f}", f"{median(values):.0f}"))
    lines = [f"### {title}: per-batch durationMs ({len(progress)} batches, wall "
             f"{run['wall_s']:.2f} s)", "",
             *markdown_table(("step", "total ms", "median ms/batch"), rows, align="lrr")]
    late = sum(p.get("late_rows", 0) for p in progress)
    lines += ["", f"rows dropped by watermark (numRowsDroppedByWatermark): {late:,}", ""]
    return lines


def _esc(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")


def _ratio(x: float) -> str:
    return "" if math.isnan(x) else f"{x:.2f}"


def write_chart(path: Path, specs: list[Spec], table: dict[str, dict[str, Cell]],
                engines: list[str], quick: bool) -> str:
    """Warm events/s per engine and workload as bars (log scale), cold as a tick."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "chart skipped: matplotlib is not installed (pip install -e '.[bench]')"
    colors = {"polars-oneshot": "#999999", "microbatch": "#1f77b4",
              "microbatch-noop": "#aec7e8", "spark": "#d62728", "spark-noop": "#ff9896",
              SPARK_DEFAULT_PARTITIONS: "#8c564b", "bytewax": "#2ca02c", "quix": "#9467bd"}
    shown = [e for e in engines if any(table[s.name].get(e) and table[s.name][e].runs
                                       for s in specs)]
    if not shown:
        return "chart skipped: nothing ran"
    fig, ax = plt.subplots(figsize=(max(7.0, 1.9 * len(specs)), 4.8))
    width = 0.8 / len(shown)
    for i, engine in enumerate(shown):
        xs, warm, cold = [], [], []
        for j, spec in enumerate(specs):
            cell = table[spec.name].get(engine)
            if cell and cell.runs:
                xs.append(j + (i - (len(shown) - 1) / 2) * width)
                warm.append(cell.rate())
                cold.append(cell.rate("cold"))
        name, sink = LABELS[engine]
        ax.bar(xs, warm, width, label=f"{name}, {sink}", color=colors.get(engine))
        ax.scatter(xs, cold, marker="_", s=120, color="black", zorder=3,
                   label="cold run (first in its process)" if i == 0 else None)
    ax.set_yscale("log")
    ax.set_ylabel("events/s, warm run (log scale)")
    ax.set_xticks(range(len(specs)),
                  [f"{s.name}\n{s.rows_per_batch(quick):,} rows/batch" for s in specs],
                  fontsize=8)
    ax.set_title(f"Same workloads, same machine ({'quick' if quick else 'full'} run)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"chart written to {path}"


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                        help=f"any of {', '.join(WORKLOADS)} (default: all)")
    parser.add_argument("--quick", action="store_true",
                        help="1M events in 20 files (Q4: 100 files of 1,000), one process each")
    parser.add_argument("--engines", nargs="+", choices=ALL_ENGINES, default=list(ENGINES),
                        metavar="ENGINE", help=f"any of {', '.join(ALL_ENGINES)} (default: "
                                               f"all but {SPARK_DEFAULT_PARTITIONS})")
    parser.add_argument("--reps", type=int,
                        help="processes per engine, each a cold and a warm run "
                             "(default 3; --quick 1)")
    parser.add_argument("--record-reps", type=int,
                        help="processes of the per-record peers, Bytewax and Quix (default: "
                             "--reps if given, else 1: they take 10-40 min per run on the "
                             "full data)")
    parser.add_argument("--install", action="store_true",
                        help="pip-install the `bench` extra (peers, psutil, matplotlib) first")
    parser.add_argument("--out", type=Path, default=None,
                        help="results directory (default benchmarks/results/compare/<quick|full>)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per run (a process gets twice that for its cold and warm "
                             "runs) before it counts as failed (default 600 quick, 1200 full)")
    parser.add_argument("--data", type=Path, metavar="DIR",
                        help="run the event workloads (Q1-Q3, Q5) on DIR's Parquet files with "
                             "the generator's columns, in name order, instead of generated "
                             "data; rows per batch = rows per file x files per batch")
    parser.add_argument("--spark-default-partitions", action="store_true",
                        help=f"also run Spark with its default {SPARK_DEFAULT_SHUFFLE_PARTITIONS}"
                             f" shuffle partitions (engine {SPARK_DEFAULT_PARTITIONS})")
    args = parser.parse_args(argv)
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {list(WORKLOADS)}")
    if args.data is not None and not args.data.is_dir():
        parser.error(f"--data {args.data}: not a directory")
    return args


def selected_specs(names: list[str], data_dir: Path | None) -> list[Spec]:
    """The workloads to run, over ``data_dir``'s files when given (a copy whose
    modification times follow the file names, when theirs do not)."""
    specs = [WORKLOADS[w] for w in (names or list(WORKLOADS))]
    if data_dir is None:
        return specs
    try:
        ds = data.staged_in_name_order(data.from_directory(data_dir))
    except ValueError as exc:
        raise SystemExit(f"--data: {exc}") from None
    return [dataclasses.replace(s, data_dir=ds.path) for s in specs]


def selected_engines(args: argparse.Namespace) -> list[str]:
    """``--engines`` (plus ``spark-200p`` with ``--spark-default-partitions``), in
    :data:`ALL_ENGINES` order."""
    wanted = set(args.engines)
    if args.spark_default_partitions:
        wanted.add(SPARK_DEFAULT_PARTITIONS)
    return [e for e in ALL_ENGINES if e in wanted]


def describe(result: dict[str, Any]) -> str:
    """One line for a process's cold and warm runs."""
    parts = []
    for phase in PHASES:
        m = result.get(phase)
        if m:
            parts.append(f"{phase} {m['wall_s']:.2f} s, {m['input_rows'] / m['wall_s']:,.0f} "
                         "events/s")
    if result.get("warm_error"):
        parts.append(f"warm failed: {result['warm_error']}")
    return "; ".join(parts) + f"; peak tree RSS {result['peak_tree_rss_mb']:.0f} MiB"


@dataclass
class Plan:
    """What every workload of a comparison runs with."""

    quick: bool
    reps: int
    record_reps: int
    timeout: float
    engines: list[str]
    skipped_peers: dict[str, str]
    broker: Broker


def run_workload(spec: Spec, plan: Plan) -> dict[str, Cell]:
    """Every engine on ``spec``, ``plan.reps`` processes each (interleaved), checked."""
    quick = plan.quick
    data.ensure(spec.dataset(quick))
    cells = {e: Cell(e, spec.name) for e in plan.engines}
    for engine, cell in cells.items():
        if engine in plan.skipped_peers:
            cell.skipped = plan.skipped_peers[engine]
        elif (engine, spec.name) in NOT_APPLICABLE:
            cell.skipped = "n/a: " + NOT_APPLICABLE[(engine, spec.name)]
    topic = None
    readers = [e for e, c in cells.items() if not c.skipped and (
        e == "quix" or (spec.kafka_partitions and e != "polars-oneshot"))]
    if readers:
        try:
            if plan.broker.error:
                raise RuntimeError(plan.broker.error)
            topic = plan.broker.topic_for(spec.dataset(quick), spec.kafka_partitions or 1)
        except Exception as exc:
            for engine in readers:
                cells[engine].skipped = f"no Kafka topic: {exc}"
    print(f"== {spec.name}: {spec.title}, {spec.rows_per_batch(quick):,} rows/batch",
          flush=True)
    for rep in range(plan.reps):
        for engine, cell in cells.items():
            if cell.skipped or (engine in ("bytewax", "quix") and rep >= plan.record_reps):
                continue
            print(f"  {engine} (process {rep + 1}: cold, warm) ...", end=" ", flush=True)
            reads_kafka = engine in readers
            try:
                result = run_one(engine, spec, quick, rep, timeout_s=plan.timeout,
                                 topic=topic if reads_kafka else None,
                                 bootstrap=plan.broker.bootstrap if reads_kafka else None)
            except Exception as exc:
                print(f"failed: {exc}", flush=True)
                if not cell.runs:
                    cell.skipped = f"failed to run here: {exc}"
                continue
            cell.runs.append(result)
            print(describe(result), flush=True)
    check_cells(spec, quick, cells)
    return cells


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quick = args.quick
    reps = args.reps or (1 if quick else 3)
    out = args.out or DEFAULT_OUT / ("quick" if quick else "full")
    specs = selected_specs(args.workloads, args.data)
    engines = selected_engines(args)
    install_failures = install_extras() if args.install else {}
    plan = Plan(quick=quick, reps=reps,
                # Bytewax and Quix take 10-40 min per run on the full data: once by default.
                record_reps=args.record_reps or (reps if args.reps else 1),
                timeout=args.timeout or (600.0 if quick else 1200.0), engines=engines,
                skipped_peers=probe_peers(engines, install_failures), broker=Broker())
    skipped_peers = plan.skipped_peers
    if any(s.kafka_partitions for s in specs) or (
            "quix" in engines and "quix" not in skipped_peers
            and any(("quix", s.name) not in NOT_APPLICABLE for s in specs)):
        print("starting a Kafka broker for Quix Streams and Q5 ...", flush=True)
        plan.broker.start()
        if plan.broker.error:
            skipped_peers["quix"] = plan.broker.error
    for line in (f"skipping {e}: {why}" for e, why in skipped_peers.items()):
        print(line, flush=True)
    from benchmarks.measure import machine_info

    info = {**machine_info(), "versions": versions()}
    table: dict[str, dict[str, Cell]] = {}
    t_all = time.perf_counter()
    try:
        for spec in specs:
            table[spec.name] = run_workload(spec, plan)
    finally:
        plan.broker.stop()
    for spec in specs:
        for engine, cell in table[spec.name].items():
            if (cell.skipped and base_engine(engine) in PEERS
                    and not cell.skipped.startswith("n/a") and engine not in skipped_peers):
                skipped_peers[f"{engine} on {spec.name}"] = cell.skipped
    text = render(specs, table, quick, engines=engines, skipped_peers=skipped_peers,
                  info=info)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(text + "\n")
    raw = {
        "quick": quick, "reps": reps, "info": info, "skipped_peers": skipped_peers,
        "seconds": time.perf_counter() - t_all,
        "data": str(specs[0].data_dir) if specs[0].data_dir else None,
        "rows_per_batch": rows_per_batch(specs, quick),
        "cells": cells_json(specs, table),
    }
    (out / "compare.json").write_text(json.dumps(raw, indent=1, default=str))
    print()
    print(text)
    print(write_chart(out / "compare.png", specs, table, engines, quick))
    print(f"results written to {out}/compare.md, compare.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
