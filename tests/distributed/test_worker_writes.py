"""Ray workers write the sink's data files; the driver only commits them.

A windowed job (append) into Delta and into Parquet on ``RayExecutor(workers=2)``:
the table equals the local executor's and a one-shot Polars oracle; every batch
with rows is one Delta version carrying the app transaction ``(query id,
batch id)``; no output row crossed to the driver (the executor's profile counts
the output bytes the workers returned, and the sink's ``add_batch`` is never
called). Kills (real SIGKILLs, in fresh processes): a worker after it wrote its
files and before the driver committed them; the driver after the Delta commit
and before ``commits/N``. Each window is in the output once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from deltalake import DeltaTable

import microbatch as mb
from microbatch.cli.jobfile import load_job
from microbatch.exceptions import QueryTerminatedError
from microbatch.observability.progress import load_progress
from microbatch.sources.generator import GeneratorSource
from sinks.base import Sink
from sinks.parquet import committed_files

pytestmark = pytest.mark.slow
KEY = ["window_start", "window_end", "card_id"]
JOB = Path(__file__).resolve().parent / "jobs" / "windowed_to_table.py"
job = load_job(JOB)
payments, windowed = job.payments, job.windowed


def oracle() -> pl.DataFrame:
    """The windows of every generated row, computed once with Polars."""
    source = payments().plan.sources()[0]
    assert isinstance(source, GeneratorSource)
    start = int(datetime.fromisoformat(job.START).timestamp() * 1000)
    rows = source.rows(0, job.ROWS, origin_ms=start)
    every = 10_000
    ms = pl.col("event_time").dt.epoch("ms")
    return (
        rows.with_columns((pl.col("amount") * 100).round(0).cast(pl.Int64).alias("cents"),
                          (ms - ms % every).alias("w"))
        .group_by("w", "card_id")
        .agg(pl.len().cast(pl.UInt32).alias("n"), pl.col("cents").sum())
        .select(pl.from_epoch("w", "ms").dt.replace_time_zone("UTC").alias("window_start"),
                pl.from_epoch(pl.col("w") + every, "ms").dt.replace_time_zone("UTC")
                .alias("window_end"), "card_id", "n", "cents")
    )


def comparable(df: pl.DataFrame) -> pl.DataFrame:
    """Times as UTC microseconds and counts as Int64 (as Delta stores them), sorted."""
    return df.select(
        pl.col("window_start").cast(pl.Datetime("us", "UTC")),
        pl.col("window_end").cast(pl.Datetime("us", "UTC")),
        pl.col("card_id").cast(pl.Int64), pl.col("n").cast(pl.Int64),
        pl.col("cents").cast(pl.Int64),
    ).sort(KEY)


class Counting:
    """Counts ``add_batch`` (rows handed to the sink on the driver) and ``commit_files``."""

    def __init__(self, sink: Sink) -> None:
        self.rows_calls = 0
        self.file_commits = 0
        self.add_batch, self.commit_files = self._rows(sink.add_batch), self._files(
            sink.commit_files)
        sink.add_batch, sink.commit_files = self.add_batch, self.commit_files  # type: ignore[method-assign]

    def _rows(self, real: Any) -> Any:
        def add_batch(batch_id: int, df: pl.DataFrame) -> None:
            self.rows_calls += 1
            real(batch_id, df)
        return add_batch

    def _files(self, real: Any) -> Any:
        def commit_files(batch_id: int, written: Any) -> None:
            self.file_commits += 1
            real(batch_id, written)
        return commit_files


def run(writer: mb.DataStreamWriter, chk: Path, executor: Any) -> mb.StreamingQuery:
    query = writer.start(chk, trigger="available-now", executor=executor, flush_at_end=True)
    assert query.await_termination(300)
    if query.exception is not None:
        raise query.exception
    return query


@pytest.fixture(scope="module")
def local_delta(tmp_path_factory: pytest.TempPathFactory) -> pl.DataFrame:
    root = tmp_path_factory.mktemp("local")
    run(windowed(payments()).write_delta(root / "table"), root / "chk", None)
    return pl.read_delta(str(root / "table"))


def test_workers_write_delta_files_and_the_driver_commits_each_batch_once(
    ray_cluster: str, tmp_path: Path, local_delta: pl.DataFrame
) -> None:
    table = tmp_path / "table"
    writer = windowed(payments()).write_delta(table)
    counting = Counting(writer.sink)
    query = run(writer, tmp_path / "chk", mb.RayExecutor(workers=2, address=ray_cluster))
    got = pl.read_delta(str(table))
    want = oracle()
    assert want.height > 300
    assert comparable(got).equals(comparable(want)), "the table is not the oracle's"
    assert got.schema == local_delta.schema, "the workers' files have other column types"
    assert got.sort(KEY).equals(local_delta.sort(KEY)), "the table is not the local one's"
    # no row reached the driver: every batch's files were committed by commit_files
    assert counting.rows_calls == 0
    records = sorted(load_progress(tmp_path / "chk" / "progress", limit=100),
                     key=lambda r: r["batch_id"])
    assert counting.file_commits == len(records) >= 6
    assert all(r["executor"]["output_bytes"] == 0 for r in records)
    assert sum(r["executor"]["written_files"] for r in records) >= 6
    # each batch with rows is one version holding its app transaction
    dt = DeltaTable(str(table))
    history = [h for h in dt.history() if h.get("operation") != "CREATE TABLE"]
    with_rows = [r["batch_id"] for r in records if r["output_rows"]]
    assert len(history) == len(with_rows)
    assert dt.transaction_version(query.id) == with_rows[-1]
    versions = _app_transactions(table, query.id)
    assert versions == with_rows, "one Delta version per batch, in batch order"


def _app_transactions(table: Path, app_id: str) -> list[int]:
    """The batch id each log entry's app transaction records, in version order."""
    out = []
    for entry in sorted((table / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action and action["txn"]["appId"] == app_id:
                out.append(action["txn"]["version"])
    return out


def test_complete_mode_delta_overwrites_with_the_workers_files(
    ray_cluster: str, tmp_path: Path
) -> None:
    """``complete``: each batch is one overwrite of the whole result, from files the
    workers wrote; the last version is every key's count over all rows."""
    table = tmp_path / "t"
    totals = payments().group_by("card_id").agg(pl.len().alias("n"))
    writer = totals.write_delta(table, output_mode="complete")
    counting = Counting(writer.sink)
    run(writer, tmp_path / "chk", mb.RayExecutor(workers=2, address=ray_cluster))
    assert counting.rows_calls == 0
    assert counting.file_commits >= 6
    source = payments().plan.sources()[0]
    assert isinstance(source, GeneratorSource)
    rows = source.rows(0, job.ROWS, origin_ms=0)
    want = rows.group_by("card_id").agg(pl.len().cast(pl.Int64).alias("n")).sort("card_id")
    got = pl.read_delta(str(table)).with_columns(pl.col("n").cast(pl.Int64)).sort("card_id")
    assert got.equals(want)
    modes = [h["operationParameters"]["mode"] for h in DeltaTable(str(table)).history()
             if h["operation"] == "WRITE"]
    assert modes == ["Overwrite"] * counting.file_commits


def test_a_stateless_query_writes_its_delta_files_in_map(ray_cluster: str, tmp_path: Path) -> None:
    """Without state there is no reduce: each worker writes its slice's rows in map."""
    table = tmp_path / "t"
    rows = payments().filter(pl.col("amount") > 10).select("event_id", "card_id", "amount")
    writer = rows.write_delta(table)
    counting = Counting(writer.sink)
    run(writer, tmp_path / "chk", mb.RayExecutor(workers=2, address=ray_cluster))
    assert counting.rows_calls == 0
    source = payments().plan.sources()[0]
    assert isinstance(source, GeneratorSource)
    want = source.rows(0, job.ROWS, origin_ms=0).filter(pl.col("amount") > 10)
    got = pl.read_delta(str(table)).sort("event_id")
    assert got.equals(want.select(got.columns).sort("event_id"))
    assert len(_app_transactions(table, writer.sink.context.query_id)) == counting.file_commits


def test_changelog_mode_writes_the_local_runs_change_rows(
    ray_cluster: str, tmp_path: Path
) -> None:
    """``changelog``: the workers write the change rows the local run writes (the
    sink's changelog form made on the workers, as the driver makes it in one process)."""
    tables = {}
    for name, executor in (("local", None),
                           ("ray", mb.RayExecutor(workers=2, address=ray_cluster))):
        writer = windowed(payments()).write_delta(tmp_path / name, output_mode="changelog")
        counting = Counting(writer.sink)
        run(writer, tmp_path / f"chk-{name}", executor)
        assert (counting.rows_calls == 0) == (executor is not None)
        table = pl.read_delta(str(tmp_path / name))
        tables[name] = table.sort(table.columns)
    assert tables["ray"].height > 300
    assert "_change_type" in tables["ray"].columns
    assert tables["ray"].equals(tables["local"])


# --------------------------------------------------------------- kills (fresh processes)


def _cli(job_args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **env}
    for name in ("MICROBATCH_FAULT", "MICROBATCH_FAULT_ONCE"):
        if name not in env:
            full.pop(name, None)
    return subprocess.run([sys.executable, "-m", "microbatch.cli", *job_args], env=full,
                          capture_output=True, text=True, timeout=240)


@pytest.mark.crash
def test_kills_between_the_workers_files_and_the_commit_keep_each_window_once(
    ray_cluster: str, tmp_path: Path
) -> None:
    """A worker dies after writing its files in batch 2 (replaced, the batch re-run);
    the driver dies after batch 4's Delta commit, before ``commits/4`` (the restart
    re-runs batch 4, whose commit finds the app transaction and skips)."""
    sink, faults = "delta", ["worker.after_write@2", "sink.after_commit@4"]
    out, chk, fired = tmp_path / "out", tmp_path / "chk", tmp_path / "fired"
    fired.mkdir()
    args = ["run", str(JOB), "--checkpoint", str(chk), "--trigger", "available-now", "--flush",
            "--param", f"output={out}", "--param", f"sink={sink}",
            "--workers", "2", "--ray-address", ray_cluster]
    first = _cli(args, {"MICROBATCH_FAULT": ",".join(faults),
                        "MICROBATCH_FAULT_ONCE": str(fired)})
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert "replacing the workers" in first.stderr
    assert sorted(p.name for p in fired.iterdir()) == sorted(faults)
    again = _cli(args, {})
    assert again.returncode == 0, again.stderr
    got = pl.read_delta(str(out))
    assert got.select(KEY).is_duplicated().sum() == 0, "a window was written twice"
    assert comparable(got).equals(comparable(oracle()))
    on_disk = {p.name for p in out.glob("*.parquet")}
    referenced = {Path(f).name for f in DeltaTable(str(out)).file_uris()}
    # the lost attempts' files are on disk, unreferenced (VACUUM's to remove)
    assert referenced < on_disk, "the killed attempts left no unreferenced file"


def test_workers_write_parquet_files_and_a_crash_before_the_manifest_keeps_each_window_once(
    ray_cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parquet: the workers write the part files, the driver the manifest entries. The
    driver fails after the workers wrote batch 3's files, before its manifest entry
    (the commit point; an in-process crash: the query object is dropped); a new
    query on the checkpoint re-runs batch 3 once, and no row reaches its driver; the
    first attempt's files are gone once the re-run committed."""
    out, chk = tmp_path / "out", tmp_path / "chk"
    executor = mb.RayExecutor(workers=2, address=ray_cluster)
    monkeypatch.setenv("MICROBATCH_FAULT", "sink.after_data@3")
    monkeypatch.setenv("MICROBATCH_FAULT_ACTION", "raise")
    with pytest.raises(QueryTerminatedError, match=r"injected fault at sink\.after_data"):
        run(windowed(payments()).write_parquet(out), chk, executor)
    orphans = {p.name for p in out.glob("*.parquet")} - {f.name for f in committed_files(out)}
    assert orphans, "the workers wrote no file for batch 3"
    monkeypatch.delenv("MICROBATCH_FAULT")
    writer = windowed(payments()).write_parquet(out)
    counting = Counting(writer.sink)
    run(writer, chk, executor)
    assert counting.rows_calls == 0
    assert counting.file_commits >= 4
    got = mb.parquet_table(out)
    assert got.select(KEY).is_duplicated().sum() == 0, "a window was written twice"
    assert comparable(got).equals(comparable(oracle()))
    listed = {f.name for f in committed_files(out)}
    assert orphans.isdisjoint(listed)
    # the commit of the re-run batch deleted the first attempt's files: the directory
    # holds only listed files, as a reader globbing *.parquet expects
    assert {p.name for p in out.glob("*.parquet")} == listed
    assert all(len(name.split("-")) == 5 for name in listed), listed  # shard and uuid
