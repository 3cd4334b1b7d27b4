"""The demo's sink step, per batch and per step: the webhook's POSTs and the Delta MERGE.

    .venv/bin/python -m benchmarks.fraud_sinks [--batches 30] [--reps 5] [--baseline REV]

The demo (``make demo``: the fraud rule on 5,000 generated payments a second, a
1 s trigger) hands each batch's alerts to its sinks: one POST per new alert to
a webhook receiver running in the same process (as ``microbatch demo`` runs
it), then every alert row MERGEd into a Delta table by ``alert_id``. This
benchmark:

1. runs the demo's pipeline (:func:`microbatch.demo.pipeline`) over the demo's
   generator, 5,000 payments per batch, and keeps each batch's output frame
   (what the engine hands to the sink in step 5);
2. gives those frames, in batch order, to the demo's sinks
   (:func:`microbatch.demo.sinks`) on a fresh table and checkpoint, timing
   every ``add_batch`` and each sink inside it;
3. with ``--baseline REV``, builds the same sinks from the ``sinks/`` modules
   of git revision ``REV`` too, and feeds both the same frames **interleaved
   batch by batch** (A, B, then B, A for the next batch), each with its own
   in-process receiver, table and checkpoint: both see the same load.

Prints per variant the median over batches (of the median over ``--reps``
runs) of the whole sink step and of each sink, the posts per batch, and the
Delta sink's own steps (:meth:`sinks.delta.DeltaSink.metrics`) when the
variant reports them. Writes the table to ``benchmarks/results/fraud_sinks.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

import microbatch as mb
from benchmarks.harness import markdown_table
from microbatch import demo
from microbatch.tools.receiver import Receiver, running
from sinks.base import BatchContext, Sink, SinkContext

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(__file__).resolve().parent / "results" / "fraud_sinks.md"
RATE = 5_000
"""Payments per batch: the demo's 5,000 a second with a 1 s trigger."""


def capture(batches: int, seed: int = 0) -> list[pl.DataFrame]:
    """The demo pipeline's output frames for ``batches`` batches of ``RATE`` payments."""
    frames: list[pl.DataFrame] = []
    tx = mb.generate(rows_per_second=None, total_rows=RATE * batches, event_rate=RATE,
                     partitions=4, cards=200_000, max_delay="5s", late_fraction=0.005,
                     late_by=("1m", "1h"), seed=seed, start="2026-01-01T00:00:00+00:00",
                     max_records_per_batch=RATE).with_columns(pl.col("amount").cast(demo.MONEY))
    with tempfile.TemporaryDirectory() as chk:
        query = demo.pipeline(tx).foreach_batch(
            lambda df, _batch_id: frames.append(df)).start(checkpoint=chk,
                                                           trigger="available-now")
        query.await_termination()
    return [f for f in frames if f.height]


class Timed(Sink):
    """``sink``, with the wall time of each ``add_batch`` kept in ``ms``."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.supported_modes = sink.supported_modes
        self.ms: list[float] = []

    @property
    def label(self) -> str:
        return self.sink.label

    def on_open(self, ctx: SinkContext) -> None:
        self.sink.open(ctx)

    def write(self, batch: BatchContext, df: pl.DataFrame) -> None:
        t0 = time.perf_counter()
        self.sink.add_batch(batch.batch_id, df)
        self.ms.append((time.perf_counter() - t0) * 1000)

    def close(self) -> None:
        self.sink.close()

    def metrics(self) -> dict[str, Any]:
        return self.sink.metrics()


def baseline_modules(rev: str) -> dict[str, types.ModuleType]:
    """``sinks.webhook``, ``sinks.fanout``, ``sinks.routed`` and ``sinks.delta`` as
    they were at ``rev``, imported as separate modules (for the comparison only)."""
    out = {}
    for name in ("delta", "webhook", "routed", "fanout"):
        text = subprocess.run(["git", "show", f"{rev}:sinks/{name}.py"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout
        module = types.ModuleType(f"baseline_sinks_{name}")
        module.__file__ = f"<{rev}:sinks/{name}.py>"
        sys.modules[module.__name__] = module
        exec(compile(text, module.__file__, "exec"), module.__dict__)
        out[name] = module
    return out


Build = Callable[[str, str], tuple[Sink, dict[str, Timed]]]


def demo_sinks(modules: dict[str, Any] | None) -> Build:
    """The demo's sink tree (``demo.sinks``), each route wrapped in :class:`Timed`;
    from ``modules`` (a baseline) when given."""

    def build(output: str, url: str) -> tuple[Sink, dict[str, Timed]]:
        if modules is None:
            tree = demo.sinks(output, url)
        else:
            routed, fanout = modules["routed"].Routed, modules["fanout"].FanOutSink
            tree = fanout.__call__(  # the demo's routes, from the baseline's classes
                [routed(modules["webhook"].WebhookSink(url, key="alert_id"),
                        where=pl.col("revision") == 0),
                 routed(modules["delta"].DeltaSink(output, merge_keys="alert_id"),
                        output_mode="update", key_columns=("alert_id",))])
        timed = {}
        for route in tree.sinks:  # type: ignore[attr-defined]
            inner = Timed(route.sink)
            route.sink = inner
            timed["webhook" if "Webhook" in type(inner.sink).__name__ else "delta"] = inner
        return tree, timed

    return build


class Variant:
    """One sink tree being fed the frames: its receiver, table, checkpoint and times."""

    def __init__(self, name: str, build: Build, work: Path) -> None:
        self.name, self.work = name, work
        self.receiver = Receiver(log=None)
        self._serving = running(self.receiver)
        url = self._serving.__enter__() + "/alerts"
        self.sink, self.timed = build(str(work / "alerts"), url)
        self.sink.open(SinkContext(query_id="bench", checkpoint_dir=work / "chk",
                                   output_mode="update", key_columns=("alert_id",)))
        self.total: list[float] = []
        self.steps: list[dict[str, Any]] = []

    def feed(self, batch_id: int, df: pl.DataFrame) -> None:
        t0 = time.perf_counter()
        self.sink.add_batch(batch_id, df)
        self.total.append((time.perf_counter() - t0) * 1000)
        delta = self.timed["delta"].metrics()
        self.steps.append({k: v for k, v in delta.items() if k.endswith("_ms")})

    def close(self) -> None:
        self.sink.close()
        self._serving.__exit__(None, None, None)


def run(frames: list[pl.DataFrame], builds: dict[str, Build], reps: int
        ) -> dict[str, dict[str, Any]]:
    """Per variant and batch, the median over ``reps`` runs of each figure."""
    runs: dict[str, list[Variant]] = {name: [] for name in builds}
    for rep in range(reps):
        with tempfile.TemporaryDirectory(prefix="bench-sinks-") as tmp:
            variants = [Variant(name, build, Path(tmp) / name) for name, build in builds.items()]
            for batch_id, df in enumerate(frames):
                order = variants if (batch_id + rep) % 2 == 0 else variants[::-1]
                for v in order:
                    v.feed(batch_id, df)
            for v in variants:
                v.close()
                runs[v.name].append(v)
    out = {}
    for name, vs in runs.items():
        def per_batch(get: Callable[[Variant, int], float | None], vs: list[Variant] = vs
                      ) -> float | None:
            meds = []
            for i in range(1, len(frames)):  # batch 0 creates the table: left out
                values = [x for v in vs if (x := get(v, i)) is not None]
                if values:
                    meds.append(statistics.median(values))
            return statistics.median(meds) if meds else None

        keys = sorted({k for v in vs for s in v.steps for k in s})
        out[name] = {
            "total": per_batch(lambda v, i: v.total[i]),
            "webhook": per_batch(lambda v, i: v.timed["webhook"].ms[i]),
            "delta": per_batch(lambda v, i: v.timed["delta"].ms[i]),
            "steps": {k: per_batch(lambda v, i, k=k: v.steps[i].get(k)) for k in keys},
            "accepted": vs[0].receiver.stats()["accepted"],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also run the sinks of this git revision, interleaved")
    args = parser.parse_args(argv)
    frames = capture(args.batches)
    posts = statistics.median(f.filter(pl.col("revision") == 0).height for f in frames[1:])
    rows = statistics.median(f.height for f in frames[1:])
    builds: dict[str, Build] = {}
    if args.baseline:
        builds[f"baseline {args.baseline}"] = demo_sinks(baseline_modules(args.baseline))
    builds["this tree"] = demo_sinks(None)
    load = os.getloadavg()
    results = run(frames, builds, args.reps)

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f} ms"

    first = next(iter(results.values()))["total"]
    step_names = sorted({k for r in results.values() for k in r["steps"]})
    cells = [
        (name, ms(r["total"]), f"{first / r['total']:.2f}x" if first and r["total"] else "-",
         ms(r["webhook"]), ms(r["delta"]), *(ms(r["steps"].get(k)) for k in step_names))
        for name, r in results.items()
    ]
    lines = markdown_table(("sinks", "sink step", "speed-up", "webhook", "Delta MERGE",
                            *(f"Delta {k.removesuffix('_ms')}" for k in step_names)), cells)
    text = (f"{len(frames)} batches of {RATE:,} payments (median {rows:.0f} alert rows, "
            f"{posts:.0f} POSTs per batch), {args.reps} runs, medians per batch (batch 0, "
            f"which creates the table, left out); load average {load[0]:.2f} at the start."
            "\n\n" + "\n".join(lines) + "\n")
    print(text)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
