"""A new user's first hour: every mistake is caught at start, with the fix named.

Real ``microbatch`` subprocesses of the real jobs: declared parameters (an
unknown ``--param`` with "did you mean", a value of the wrong type, a missing
required one, ``run JOB --help`` listing them), paths checked at start (a
missing input directory, a Delta table given to ``read_files``, an output that
cannot be written), and the smaller things: the help's ``microbatch[ray]``,
``lateness`` piped, the demo's late table. Each asserts the exact exit code and
the key words of the message.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import microbatch as mb

REPO = Path(__file__).resolve().parents[2]
FRAUD_JOB = REPO / "jobs" / "fraud_alerts.py"
DAILY_JOB = REPO / "jobs" / "daily_totals.py"
GENERATED_JOB = REPO / "jobs" / "generated_to_parquet.py"
CLI = [sys.executable, "-m", "microbatch.cli"]


def cli(*args: str | Path, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the CLI to completion with stdout and stderr piped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROBATCH_FAULT")}
    return subprocess.run([*CLI, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)


def assert_refused(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit code 2, one ``error:`` paragraph holding ``fragments``, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    for text in (result.stdout, result.stderr):
        assert "Traceback" not in text
        assert "panicked" not in text
    message = " ".join(result.stderr.split())
    assert message.startswith("error:"), message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


# ------------------------------------------------------------------ declared parameters


def test_a_misspelled_param_is_refused_with_did_you_mean(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()

    result = cli("run", FRAUD_JOB, "--checkpoint", "chk", "--param", "input=in",
                 "--param", "max_file_per_batch=1", cwd=tmp_path)

    assert_refused(result, "unknown --param 'max_file_per_batch'",
                   "did you mean 'max_files_per_batch'", "--help")
    assert not (tmp_path / "chk").exists()


def test_a_misspelled_output_writes_nothing_to_a_default_table(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()

    result = cli("run", FRAUD_JOB, "--checkpoint", "chk", "--param", "input=in",
                 "--param", "outptu=elsewhere", cwd=tmp_path)

    assert_refused(result, "unknown --param 'outptu'", "did you mean 'output'")
    assert not (tmp_path / "lake").exists()


def test_a_param_of_the_wrong_type_names_the_param_and_the_type(tmp_path: Path) -> None:
    result = cli("run", FRAUD_JOB, "--checkpoint", "chk", "--param", "input=in",
                 "--param", "max_files_per_batch=abc", cwd=tmp_path)

    assert_refused(result, "--param max_files_per_batch='abc'", "expected an integer or none",
                   "got 'abc'")


def test_a_missing_required_param_is_named(tmp_path: Path) -> None:
    result = cli("run", DAILY_JOB, "--checkpoint", "chk", "--param", "output=out",
                 cwd=tmp_path)

    assert_refused(result, "needs --param input=TEXT")


def test_backfill_checks_params_too(tmp_path: Path) -> None:
    result = cli("backfill", DAILY_JOB, "--checkpoint", "chk", "--param", "input=a",
                 "--param", "output=b", "--param", "watermrk=1h", cwd=tmp_path)

    assert_refused(result, "unknown --param 'watermrk'", "did you mean 'watermark'")


def test_run_job_help_lists_the_declared_params(tmp_path: Path) -> None:
    result = cli("run", FRAUD_JOB, "--help", cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert f"Parameters of {FRAUD_JOB}" in text
    for name in ("input", "bootstrap", "topic", "max_files_per_batch", "max_records_per_batch",
                 "delay", "allowed_lateness", "webhook", "webhook_token_env", "output",
                 "late_output", "alerts_topic"):
        assert f"--param {name}=" in text, name
    assert "--param max_records_per_batch=INT records per batch (Kafka); default: 50000" in text


def test_run_help_shows_the_ray_extra(tmp_path: Path) -> None:
    result = cli("run", "--help", cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "microbatch[ray]" in "".join(result.stdout.split())


def test_an_undeclared_job_gets_the_dict_and_a_note(tmp_path: Path) -> None:
    from microbatch.cli.jobfile import build_writer

    job = tmp_path / "job.py"
    job.write_text("import microbatch as mb\n\n\ndef build(params):\n"
                   "    return mb.generate(total_rows=10, rows_per_second=None)"
                   ".write_parquet(params['output'])\n")
    notes: list[str] = []

    writer = build_writer(job, {"output": str(tmp_path / "out"), "typo": "1"},
                          note=notes.append)

    assert isinstance(writer, mb.DataStreamWriter)
    assert len(notes) == 1
    assert "declares no Params" in notes[0]
    assert "output, typo" in notes[0]


# ------------------------------------------------------------------ paths checked at start


def test_a_missing_input_directory_exits_2_at_start(tmp_path: Path) -> None:
    result = cli("run", FRAUD_JOB, "--checkpoint", "chk", "--trigger", "available-now",
                 "--param", "input=no-such-dir", cwd=tmp_path)

    assert_refused(result, "input directory", "no-such-dir does not exist", "create it")
    assert not (tmp_path / "chk").exists()


def test_a_delta_table_given_to_read_files_is_refused(tmp_path: Path) -> None:
    pl.DataFrame({"a": [1]}).write_delta(tmp_path / "table")

    result = cli("run", FRAUD_JOB, "--checkpoint", "chk", "--trigger", "available-now",
                 "--param", "input=table", cwd=tmp_path)

    assert_refused(result, "is a Delta table", "mb.read_delta(")


def test_an_unwritable_delta_output_exits_2_without_a_panic(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    if os.geteuid() == 0:  # root writes anywhere: an output under a file cannot be made
        (tmp_path / "blocker").write_text("a file")
        output, words = tmp_path / "blocker" / "alerts", ("is a file, not a directory",)
    else:
        (tmp_path / "locked").mkdir()
        (tmp_path / "locked").chmod(0o555)
        output, words = tmp_path / "locked" / "alerts", ("permission denied",)

    try:
        result = cli("run", FRAUD_JOB, "--checkpoint", "chk", "--trigger", "available-now",
                     "--param", "input=in", "--param", f"output={output}", cwd=tmp_path)
    finally:
        if (tmp_path / "locked").exists():
            (tmp_path / "locked").chmod(0o755)

    assert_refused(result, "cannot write the output", str(output), *words)
    assert not output.exists()


# ------------------------------------------------------------------ smaller things


def test_lateness_headers_are_whole_when_piped(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "jobs"))
    try:
        import fraud_alerts
    finally:
        sys.path.remove(str(REPO / "jobs"))
    data = fraud_alerts.generated_transactions(rows=2_000, cards=50)
    fraud_alerts.write_files(tmp_path / "in", data, files=2)

    result = cli("lateness", "in", "--key", "card_id", "--min-count", "3", cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    header = next(line for line in result.stdout.splitlines() if "delay s" in line)
    for head in ("lateness s", "late rows", "windows differ", "alerts missed", "state peak",
                 "state mean", "first result s", "final result s"):
        assert head in header, (head, header)
    assert "…" not in result.stdout


@pytest.mark.slow
def test_the_demo_names_its_late_table_only_when_it_exists(tmp_path: Path) -> None:
    result = cli("demo", "--seconds", "2", "--rows-per-second", "200", cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    late = tmp_path / "demo-output" / "alerts-late"
    line = next(li for li in result.stdout.splitlines() if li.strip().startswith("late:"))
    if (late / "_delta_log").is_dir():
        assert str(late) in line
    else:
        assert "none: no payment was more than an hour late" in line
        assert not late.exists()
