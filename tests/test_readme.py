"""The README's examples run as written."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)
CLI_LINES = [
    " ".join(line.replace("\\\n", " ").split())
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S)
    for line in block.replace("\\\n", " ").splitlines()
    if line.startswith(".venv/bin/microbatch")
]


@pytest.mark.parametrize(
    "code", PYTHON_BLOCKS, ids=[f"block{i}" for i in range(len(PYTHON_BLOCKS))]
)
def test_python_examples_run(code: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr


def test_cli_examples_run(tmp_path: Path) -> None:
    assert CLI_LINES, "the README shows CLI commands"
    for line in CLI_LINES:
        args = shlex.split(line.split("#")[0])
        args[0] = str(Path(sys.executable).with_name("microbatch"))
        args = [
            str(ROOT / a) if a.startswith("jobs/") else a.replace("/tmp/", f"{tmp_path}/")
            for a in args
        ]
        proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{line}\n{proc.stderr}"
