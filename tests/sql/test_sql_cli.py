"""``microbatch sql FILE.sql``, run as a real subprocess: a mistake in a script is one
paragraph naming ``FILE:LINE:COLUMN`` and the fix, exit code 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "microbatch.cli"]


def cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROBATCH_FAULT")}
    return subprocess.run([*CLI, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=env, check=False)


SCRIPT = """-- totals per card
CREATE TABLE tx (card_id BIGINT, amount DOUBLE, event_time TIMESTAMP(3),
  WATERMARK FOR event_time AS event_time - INTERVAL '5' SECOND)
  WITH ('connector' = 'files', 'path' = '${input}', 'format' = 'parquet');
CREATE TABLE totals WITH ('connector' = 'delta', 'path' = '${output}');
INSERT INTO totals SELECT card_id, amount FROM tx;
"""


@pytest.mark.parametrize(("script", "params", "fragments"), [
    (SCRIPT, ["input=in"], ["job.sql:5:60:", "${output} has no value",
                            "Pass --param output=VALUE"]),
    (SCRIPT, ["input=in", "output=out", "outptu=x"],
     ["unknown --param 'outptu'", "Did you mean 'output'?"]),
    (SCRIPT.replace("'format'", "'fromat'"), ["input=in", "output=out"],
     ["job.sql:4:53:", "no option 'fromat'", "did you mean 'format'"]),
    (SCRIPT.replace("INSERT INTO totals", "INSERT INTO total"), ["input=in", "output=out"],
     ["job.sql:6:13:", "no table total is declared", "CREATE TABLE total"]),
    (SCRIPT.replace("AS event_time -", "AS event_time +"), ["input=in", "output=out"],
     ["job.sql:3:17:", "column minus a fixed interval"]),
    (SCRIPT.replace("CREATE TABLE totals", "CREATE TABLE totals (a INT"),
     ["input=in", "output=out"], ["job.sql:5:", "syntax"]),
])
def test_script_mistakes_are_one_paragraph_with_line_and_column(
    tmp_path: Path, script: str, params: list[str], fragments: list[str]
) -> None:
    (tmp_path / "job.sql").write_text(script)
    args: list[str] = []
    for item in params:
        args += ["--param", item]
    result = cli("sql", "job.sql", "--checkpoint", tmp_path / "chk", *args, cwd=tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    message = " ".join(result.stderr.split())
    for fragment in fragments:
        assert fragment in message, message
    assert not (tmp_path / "chk").exists()  # refused before anything ran


def test_missing_script_file(tmp_path: Path) -> None:
    result = cli("sql", "nope.sql", "--checkpoint", tmp_path / "chk", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "cannot read the SQL script nope.sql" in " ".join(result.stderr.split())
