"""Savepoints: a job's state saved, then a changed job started from it, under
SIGKILLs, against the oracle "old code for the batches before the savepoint,
new code after"; and incompatible changes refused, naming each one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from savepoint_jobs import SCHEMA

import microbatch as mb
from microbatch.state.restore import restore_savepoint
from microbatch.state.savepoint import write_savepoint

pytestmark = [pytest.mark.crash]

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("savepoint_jobs.py")

T0 = datetime(2026, 1, 1, tzinfo=UTC)
OLD, NEW = range(3), range(3, 6)


def _file(i: int) -> pl.DataFrame:
    """File i: 12 rows from i min 30 s on, every 5 s (so each spans two windows)."""
    return pl.DataFrame({
        "k": [j % 3 for j in range(12)],
        "ts": [T0 + timedelta(seconds=i * 60 + 30 + j * 5) for j in range(12)],
        "v": [float((i * 7 + j) % 10) for j in range(12)],
    }, schema=SCHEMA)


def _cli(base: Path, kind: str, version: str, chk: str, *extra: str, fault: str | None = None,
         ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("MICROBATCH_FAULT", None)
    if fault:
        env["MICROBATCH_FAULT"] = fault
    cmd = [sys.executable, "-m", "microbatch.cli", "run", str(JOB), "--checkpoint",
           str(base / chk), "--trigger", "available-now", "-p", f"kind={kind}",
           "-p", f"version={version}", "-p", f"input={base / 'in'}",
           "-p", f"output={base / ('out_' + chk)}", *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, timeout=120)


def _killed(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == -signal.SIGKILL, done.stderr


def _ok(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stderr


def _upgrade(base: Path, kind: str, *, every_kill: bool) -> dict[str, object]:
    """Old job on files 0-2, savepoint, files 3-5 added, new job from the savepoint:
    killed mid-run, then finished; ``every_kill``: the old job is killed once too,
    and the new one also while assembling its checkpoint."""
    (base / "in").mkdir(parents=True)
    for i in OLD:
        _file(i).write_parquet(base / "in" / f"f{i}.parquet")
    if every_kill:
        _killed(_cli(base, kind, "old", "old", fault="after_sink@1"))
    _ok(_cli(base, kind, "old", "old"))
    manifest = write_savepoint(base / "old", base / "save")
    for i in NEW:
        _file(i).write_parquet(base / "in" / f"f{i}.parquet")
    n = int(manifest["batch_id"])  # type: ignore[call-overload]
    flush = ("--flush",) if kind == "window" else ()
    restore = ("--from-savepoint", str(base / "save"), *flush)
    if every_kill:
        _killed(_cli(base, kind, "new", "new", *restore, fault=f"restore.before_publish@{n}"))
        assert not (base / "new").exists()  # nothing usable-looking was left
    _killed(_cli(base, kind, "new", "new", *restore, fault=f"after_sink@{n + 2}"))
    last = _cli(base, kind, "new", "new", *restore)
    _ok(last)
    assert "resumed from savepoint" in last.stderr
    return {"old": mb.parquet_table(base / "out_old"), "new": mb.parquet_table(base / "out_new"),
            "manifest": manifest}


@pytest.fixture(scope="module")
def window(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    return _upgrade(tmp_path_factory.mktemp("window"), "window", every_kill=True)


def _windows(rows: pl.DataFrame) -> pl.DataFrame:
    return rows.with_columns(pl.col("ts").dt.truncate("1m").alias("window_start"))


def test_window_output_is_old_code_before_the_savepoint_and_new_code_after(window):
    old = pl.concat([_file(i) for i in OLD]).filter(pl.col("v") >= 0)
    new = pl.concat([_file(i) for i in NEW]).filter(pl.col("v") >= 1)
    # delay 0s: the old run emitted the windows its last watermark (newest old row) closed
    closed = old["ts"].max()
    key = ["window_start", "window_end", "k"]
    want_old = (_windows(old).group_by("window_start", "k")
                .agg(pl.len().cast(pl.Int64).alias("n"), pl.col("v").sum().alias("total"),
                     pl.col("v").max().alias("top"))
                .with_columns((pl.col("window_start") + timedelta(minutes=1)).alias("window_end"))
                .filter(pl.col("window_end") <= closed).select(*key, "n", "total", "top"))
    got_old = window["old"]
    assert got_old.sort(key).equals(want_old.sort(key))
    # the rest: every row's count and sum, but the added min() only of the new job's rows
    both = _windows(pl.concat([old.with_columns(pl.lit(None, pl.Float64).alias("new_v")),
                               new.with_columns(pl.col("v").alias("new_v"))]))
    want_new = (both.group_by("window_start", "k")
                .agg(pl.len().cast(pl.Int64).alias("n"), pl.col("v").sum().alias("total"),
                     pl.col("new_v").min().alias("low"))
                .with_columns((pl.col("window_start") + timedelta(minutes=1)).alias("window_end"))
                .filter(pl.col("window_end") > closed).select(*key, "n", "total", "low"))
    got_new = window["new"]
    assert got_new.sort(key).equals(want_new.sort(key))
    assert got_new["low"].null_count() == 0  # every carried window got new rows too


def test_transform_state_gains_a_column_across_the_savepoint(tmp_path):
    got = _upgrade(tmp_path, "transform", every_kill=False)
    rows = [_file(i) for i in range(6)]
    want = pl.concat([
        rows[j].group_by("k").agg().join(
            pl.concat(rows[: j + 1]).group_by("k").agg(pl.len().cast(pl.Int64).alias("n")), on="k")
        .join(pl.concat(rows[3: j + 1]).group_by("k").agg(pl.col("v").sum().alias("total")),
              on="k")
        for j in NEW])
    assert got["new"].sort("k", "n").equals(want.select("k", "n", "total").sort("k", "n"))
    assert got["old"].columns == ["k", "n"]


def _writer(base: Path, stream: mb.Stream) -> mb.DataStreamWriter:
    return stream.write_parquet(str(base / "out"))


def test_incompatible_changes_are_refused_naming_each_and_a_map_pairs_operators(window, tmp_path):
    save = Path(str(window["manifest"]["checkpoint"])).parent / "save"  # type: ignore[index]
    source = mb.read_files(save.parent / "in", format="parquet", schema=SCHEMA,
                           max_files_per_batch=1).with_watermark("ts", delay="0s")
    changed = source.with_columns(pl.col("k").cast(pl.String), (pl.col("v") > 4).alias("big"))
    bad = changed.group_by(mb.window("ts", "1m"), "k", "big").agg(pl.len().alias("n"))
    with pytest.raises(mb.SavepointError) as refused:
        restore_savepoint(save, tmp_path / "a", _writer(tmp_path, bad))
    message = str(refused.value)
    assert "key column 'k' changed type (Int64 -> String)" in message
    assert "key column 'big' was added" in message
    assert not (tmp_path / "a").exists()
    elsewhere = mb.read_files(tmp_path, format="parquet", schema=SCHEMA).with_watermark(
        "ts", delay="0s")
    resized = elsewhere.group_by(mb.window("ts", "2m"), "k").agg(pl.len().alias("n"))
    with pytest.raises(mb.SavepointError, match=r"sources changed.*agg-0 -> agg-0: 'window' "
                       r"changed"):
        restore_savepoint(save, tmp_path / "b", _writer(tmp_path, resized))
    # an operator's state is never silently dropped, nor one started empty mid-stream
    with pytest.raises(mb.SavepointError, match=r"agg-0 \(window_aggregate\) has state and no "
                       r"counterpart.*--map agg-0=NEW_ID or drop its state with --map agg-0="):
        restore_savepoint(save, tmp_path / "c", _writer(tmp_path, source))
    ahead = source.drop_duplicates(["k", "ts"], within="1m").group_by(
        mb.window("ts", "1m"), "k").agg(pl.len().alias("n"), pl.col("v").sum().alias("total"))
    with pytest.raises(mb.SavepointError, match=r"operator dedupe-1 .*--map =dedupe-1"):
        restore_savepoint(save, tmp_path / "c", _writer(tmp_path, ahead))
    done = restore_savepoint(save, tmp_path / "c", _writer(tmp_path, ahead), [("", "dedupe-1")])
    assert done == "restored"
    carried = mb.read_state(tmp_path / "c", operator="agg-0")
    saved = mb.read_state(save.parent / "old")
    assert carried.select("window_start", "k", "n", "total").sort("window_start", "k").equals(
        saved.select("window_start", "k", "n", "total").sort("window_start", "k"))
    assert (tmp_path / "c" / "state" / "dedupe-1" / "operator.json").exists()  # starts empty
