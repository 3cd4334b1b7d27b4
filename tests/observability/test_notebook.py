"""``examples/quickstart.ipynb`` runs end to end in a real Jupyter kernel.

The kernel is this interpreter (the venv's, with ipykernel), registered in a
temporary Jupyter path so that no other ``python3`` kernel on the machine is
picked up.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "quickstart.ipynb"


def test_quickstart_notebook_executes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before jupyter_core is imported: use platformdirs (its DeprecationWarning otherwise)
    # and look for kernels in our directory first.
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    kernels = tmp_path / "jupyter"
    spec = kernels / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (microbatch venv)",
        "language": "python",
    }))
    monkeypatch.setenv("JUPYTER_PATH", str(kernels))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    import nbformat
    from nbclient import NotebookClient

    temp = tmp_path / "temp"  # the notebook's tempfile.mkdtemp() goes here
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, kernel_name="python3", timeout=180, startup_timeout=180,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()

    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert any("microbatch Stream" in h for h in html)  # the stream's repr
    assert any('class="microbatch-query"' in h and "recent batches" in h for h in html)
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "state agg-0:" in printed  # query.explain()
    assert "watermark wm-0:" in printed
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the matplotlib plot
    assert not list(temp.glob("microbatch-quickstart-*"))  # the last cell removed its workdir
