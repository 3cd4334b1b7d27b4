"""The ``microbatch`` command line, run as a real subprocess.

Covers: exactly-once output of ``run`` against the one-shot Polars result,
idempotent re-runs, ``status`` (table and JSON), the checkpoint lock, graceful
SIGTERM, the ``demo`` command, and every user mistake ending in exit code 2
with a clear message and no traceback.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import microbatch as mb
from microbatch.checkpoint import Checkpoint
from microbatch.sources.generator import GeneratorSource

REPO = Path(__file__).resolve().parents[2]
GENERATED_JOB = REPO / "jobs" / "generated_to_parquet.py"
CLI = [sys.executable, "-m", "microbatch.cli"]

ROWS = 50_000
BATCH = 10_000


def cli(*args: str | Path, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the CLI to completion; stdout is a pipe, so it logs plain lines."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROBATCH_FAULT")}
    return subprocess.run(
        [*CLI, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env=env, check=False,
    )


def run_generated(chk: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``run`` the generated-rows job over ROWS rows in batches of BATCH, then stop."""
    return cli(
        "run", GENERATED_JOB, "--checkpoint", chk, "--trigger", "available-now",
        "--param", f"output={out}", "--param", f"rows={ROWS}",
        "--param", f"max_records_per_batch={BATCH}", *extra, cwd=out.parent,
    )


def expected_rows() -> pl.DataFrame:
    """The one-shot Polars computation of what the job must write.

    Written out independently of the job file on purpose: same generator
    parameters (the job's defaults), same filter and projection.
    """
    source = GeneratorSource(rows_per_second=None, total_rows=ROWS, seed=7, cards=1_000,
                             start="2026-01-01T00:00:00+00:00")
    start = source.initial_offset()
    rows = source.read(start, source.latest_offset(start, capped=False)).data
    return rows.filter(pl.col("amount") >= 20.0).select(
        "event_id", "card_id", "amount", "event_time"
    )


def batch_lines(stderr: str) -> list[str]:
    """The per-batch log lines ``run`` prints when stdout is not a terminal."""
    return [line for line in stderr.splitlines() if re.match(r"^\S+ batch \d+: ", line)]


def assert_clean_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert "Traceback" not in result.stdout
    message = " ".join(result.stderr.split())
    assert message.startswith("error:"), message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def wait_for(predicate: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)


# ------------------------------------------------------------------ run + status


def test_run_available_now_writes_exactly_the_one_shot_result(tmp_path: Path) -> None:
    chk, out = tmp_path / "chk", tmp_path / "out"

    first = run_generated(chk, out)

    assert first.returncode == 0, first.stderr
    assert "Traceback" not in first.stderr
    assert len(batch_lines(first.stderr)) == ROWS // BATCH  # one plain line per batch
    got = mb.parquet_table(out).sort("event_id")
    assert_frame_equal(got.select(expected_rows().columns), expected_rows())

    again = run_generated(chk, out)

    assert again.returncode == 0, again.stderr
    assert batch_lines(again.stderr) == []  # no batch ran
    assert mb.parquet_table(out).height == got.height

    table = cli("status", chk, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    text = " ".join(table.stdout.split())
    assert "stopped" in text
    assert "last committed batch 4" in text
    assert "last planned batch 4" in text
    assert "pending recovery no" in text

    doc = json.loads(cli("status", chk, "--json", cwd=tmp_path).stdout)
    assert doc["state"] == "stopped"
    assert doc["running"] is False
    assert doc["last_planned_batch"] == doc["last_committed_batch"] == ROWS // BATCH - 1
    assert doc["pending_recovery"] is False
    assert doc["sources"][0]["end_offset"]["rows"] == ROWS
    assert [b["batch_id"] for b in doc["recent_batches"]] == list(range(ROWS // BATCH))
    assert sum(b["input_rows"] for b in doc["recent_batches"]) == ROWS
    assert doc["query_id"] == Checkpoint(chk).read_metadata()["query_id"]


def test_status_of_a_directory_that_is_no_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    assert_clean_error(cli("status", tmp_path / "nope", cwd=tmp_path), "does not exist")
    assert_clean_error(cli("status", tmp_path, cwd=tmp_path), "not a microbatch checkpoint")


# ------------------------------------------------------------------ a long-running query


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A ``run`` on a 1 s trigger that has committed its first batch."""
    chk, out = tmp_path / "chk", tmp_path / "out"
    proc = subprocess.Popen(
        [*CLI, "run", str(GENERATED_JOB), "--checkpoint", str(chk), "--trigger", "1s",
         "--param", f"output={out}", "--param", "rows_per_second=2000"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for(lambda: (chk / "commits" / "0").exists() or proc.poll() is not None)
        assert proc.poll() is None, proc.communicate()
        yield proc, chk
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_second_run_on_a_checkpoint_in_use_is_refused(
    running: tuple[subprocess.Popen[str], Path], tmp_path: Path
) -> None:
    proc, chk = running

    second = cli("run", GENERATED_JOB, "--checkpoint", chk, "--trigger", "1s",
                 "--param", f"output={tmp_path / 'other'}", "--param", "rows_per_second=2000",
                 cwd=tmp_path)

    assert_clean_error(second, f"checkpoint {chk.resolve()} is in use", f"pid {proc.pid}")
    doc = json.loads(cli("status", chk, "--json", cwd=tmp_path).stdout)
    assert doc["running"] is True
    assert doc["lock_owner"]["pid"] == proc.pid
    assert doc["last_committed_batch"] >= 0


def test_sigterm_finishes_the_batch_in_flight_and_exits_0(
    running: tuple[subprocess.Popen[str], Path],
) -> None:
    proc, chk = running

    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=20)

    assert proc.returncode == 0, stderr
    assert "SIGTERM" in stderr
    assert "Traceback" not in stderr
    reopened = Checkpoint(chk)
    last = reopened.offsets.latest()
    assert last is not None
    assert reopened.commits.get(last.batch_id) is not None
    assert not reopened.is_running()


# ------------------------------------------------------------------ user mistakes


JOBS = {
    "no_build.py": "import microbatch as mb\n\nx = 1\n",
    "returns_stream.py": (
        "import microbatch as mb\n\n\ndef build(params):\n"
        "    return mb.generate(total_rows=10, rows_per_second=None)\n"
    ),
}


@pytest.mark.parametrize(
    ("job", "args", "fragments"),
    [
        ("missing.py", [], ["job file missing.py does not exist"]),
        ("no_build.py", [], ["has no `build` function", "def build(params"]),
        ("returns_stream.py", [], ["returned a Stream", "write_parquet(", "without .start()"]),
        (GENERATED_JOB, ["--trigger", "10 parsecs"], ["unknown trigger '10 parsecs'"]),
        (GENERATED_JOB, ["--param", "rows"], ["--param 'rows' is not of the form KEY=VALUE"]),
    ],
    ids=["missing-job", "no-build", "build-returns-stream", "bad-trigger", "bad-param"],
)
def test_user_mistakes_exit_2_with_a_clear_message(
    tmp_path: Path, job: str | Path, args: list[str], fragments: list[str]
) -> None:
    if isinstance(job, str) and job in JOBS:
        (tmp_path / job).write_text(JOBS[job])

    result = cli("run", job, "--checkpoint", tmp_path / "chk", "--param", "output=out",
                 *args, cwd=tmp_path)

    assert_clean_error(result, *fragments)
    assert not (tmp_path / "chk").exists()


def test_unwritable_checkpoint_exits_2(tmp_path: Path) -> None:
    (tmp_path / "plain-file").write_text("not a directory")

    result = run_generated(tmp_path / "plain-file" / "chk", tmp_path / "out")

    assert_clean_error(result, "cannot write to checkpoint directory", "plain-file")


# ------------------------------------------------------------------ demo


def test_demo_runs_for_the_given_seconds_and_writes_alerts(tmp_path: Path) -> None:
    out, chk = tmp_path / "demo" / "alerts", tmp_path / "demo" / "chk"

    # alerts fire early (fire_once): the third payment of a card in a minute pages
    result = cli("demo", "--seconds", "18", "--rows-per-second", "3000", "--checkpoint", chk,
                 "--output", out, cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    written = pl.read_delta(str(out))
    assert written.height > 0
    assert written["payments"].min() >= 3
    assert written["alert_id"].n_unique() == written.height  # one row per alert
    assert (written["window_end"] - written["window_start"]).unique().to_list() == [
        timedelta(minutes=1)]
    pages = [json.loads(line) for line in (out.parent / "webhook.jsonl").read_text().splitlines()]
    assert sorted(p["key"] for p in pages) == sorted(written["alert_id"].to_list())
    assert all(json.loads(p["body"])["revision"] == 0 for p in pages)
    summary = " ".join(result.stdout.split())
    assert "pl.read_delta" in summary
    assert str(out.resolve()) in summary
    assert f"the webhook received {len(pages):,} alerts" in summary
    assert "0 with a changed body" in summary


def test_a_second_signal_exits_at_once_with_130(tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text(
        "import pathlib, time\n\n\ndef build(params):\n"
        "    pathlib.Path('building').touch()\n    time.sleep(30)\n"
    )
    proc = subprocess.Popen([*CLI, "run", "slow.py", "--checkpoint", "chk"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60  # the handlers are installed before the job is built
    while not (tmp_path / "building").exists():
        assert time.monotonic() < deadline, "the job was never built"
        time.sleep(0.05)

    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=10)

    assert proc.returncode == 130, stderr
    assert "second signal" in stderr


# ------------------------------------------------------------------ job files, in process


@pytest.mark.parametrize(
    ("source", "fragments"),
    [
        ("def build(params):\n    return 1 +\n", ["syntax error in job file", "job.py:2"]),
        ("import no_such_package_xyz\n", ["failed to import", "job.py:1",
                                          "No module named 'no_such_package_xyz'"]),
        ("build = 3\n", ["is of type int, not a function"]),
        ("def build():\n    pass\n", ["must accept exactly one argument"]),
        ("def build(params):\n    return params['output']\n",
         ["raised KeyError", "job.py:2", "--param output=VALUE"]),
        ("def build(params):\n    return None\n", ["returned NoneType", "without .start()"]),
    ],
    ids=["syntax", "import", "not-callable", "no-params", "build-raises", "returns-none"],
)
def test_job_file_problems_are_job_errors(
    tmp_path: Path, source: str, fragments: list[str]
) -> None:
    from microbatch.cli.jobfile import build_writer

    job = tmp_path / "job.py"
    job.write_text(source)

    with pytest.raises(mb.JobError) as info:
        build_writer(job, {})

    for fragment in fragments:
        assert fragment in str(info.value)


def test_the_demo_and_example_jobs_build_writers(tmp_path: Path) -> None:
    from microbatch.cli.jobfile import build_writer

    demo = build_writer(REPO / "microbatch" / "demo.py", {"output": str(tmp_path / "d")})
    files = build_writer(REPO / "jobs" / "transactions_to_parquet.py",
                         {"input": str(tmp_path), "output": str(tmp_path / "t")})

    assert isinstance(demo, mb.DataStreamWriter)
    assert isinstance(files, mb.DataStreamWriter)


def test_corrupt_checkpoint_file_exits_2_for_run_and_status(tmp_path: Path) -> None:
    chk = tmp_path / "chk"
    chk.mkdir()
    (chk / "metadata").write_text('{"format": 1, "kind": "metadata", "body": {"query_id"')

    ran = run_generated(chk, tmp_path / "out")
    status = cli("status", chk, cwd=tmp_path)

    assert_clean_error(ran, f"checkpoint file {chk.resolve() / 'metadata'}", "not valid JSON")
    assert_clean_error(status, "metadata", "not valid JSON")
