"""The README's examples run as written, in document order, in one directory.

Python blocks run as scripts; shell lines that call `.venv/bin/microbatch` run
as commands (paths under `jobs/` and `examples/` point at the repo). Lines that
need the Kafka broker are left to tests/kafka, which runs the same job.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def steps() -> list[tuple[str, str]]:
    """("python", code) and ("cli", command line) in document order."""
    out: list[tuple[str, str]] = []
    for lang, body in re.findall(r"```(python|bash)\n(.*?)```", README, flags=re.S):
        if lang == "python":
            out.append(("python", body))
            continue
        for raw in body.replace("\\\n", " ").splitlines():
            line = " ".join(raw.split("#")[0].split())
            if line.startswith(".venv/bin/microbatch") and "$BS" not in line:
                out.append(("cli", line))
    return out


def test_readme_walkthrough_runs(tmp_path: Path) -> None:
    walk = steps()
    assert sum(kind == "python" for kind, _ in walk) >= 3
    assert sum(kind == "cli" for kind, _ in walk) >= 5
    cli = str(Path(sys.executable).with_name("microbatch"))
    for kind, text in walk:
        if kind == "python":
            proc = subprocess.run(
                [sys.executable, "-c", text],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=300,
            )
        else:
            args = [cli] + [
                str(ROOT / a)
                if a.startswith(("jobs/", "examples/"))
                else a.replace("/tmp/", f"{tmp_path}/")
                for a in shlex.split(text)[1:]
            ]
            proc = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{text}\n{proc.stdout}\n{proc.stderr}"
