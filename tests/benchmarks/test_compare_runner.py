"""The peer-comparison runner works end to end without any peer installed.

Runs ``python -m benchmarks.compare q4 --quick`` for this engine and the one-shot
limit only (the peers are optional extras, never needed by ``make test``) and
checks the report: the at-a-glance matrix with cold and warm figures, each
process's cold and warm run, our (warm) output checked row for row against the
one-shot result and against our cold output, and a clear reason for every peer
left out.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_compare_runs_this_engine_against_the_one_shot_limit(tmp_path: Path) -> None:
    out = tmp_path / "compare"
    engines = ["polars-oneshot", "microbatch"]
    missing_peer = importlib.util.find_spec("pyspark") is None  # the dev venv: no extras
    if missing_peer:
        engines.append("spark")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.compare", "q4", "--quick",
         "--engines", *engines, "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = (out / "compare.md").read_text()
    assert "## At a glance" in report
    doc = json.loads((out / "compare.json").read_text())
    ours = doc["cells"]["q4"]["microbatch"]
    assert len(ours["runs"]) == 1
    run = ours["runs"][0]  # one process: a cold run, then the same again warm
    assert run["cold"]["input_rows"] == run["warm"]["input_rows"] == 100_000
    assert ours["check"].startswith("vs one-shot: agrees"), ours["check"]
    assert "cold output = warm output" in ours["check"], ours["check"]
    assert "cold · " in report
    assert "/s warm" in report
    if missing_peer:  # said clearly, not a crash
        assert "pyspark" in doc["cells"]["q4"]["spark"]["skipped"]
        assert "## Skipped peers" in report
