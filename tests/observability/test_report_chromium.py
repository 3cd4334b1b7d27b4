"""The report as a person sees it: rendered by real headless Chromium.

Needs the Debian package ``chromium`` (``make test`` installs it when run as
root). Without it the test fails under CI (``CI=true``) and is skipped,
loudly, elsewhere: it never installs anything itself.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from obs_helpers import report_checkpoint
from PIL import Image, ImageStat

from microbatch.observability.report import PLOTS, write_report

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Chromium with a throw-away profile, offline, bounded in time."""
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    return subprocess.run(
        [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )


def test_report_renders_in_headless_chromium(
    chk: Path, tmp_path: Path, t0: datetime, name: Callable[[], str]
) -> None:
    if not CHROMIUM.exists():
        message = (f"{CHROMIUM} is missing: the report cannot be rendered. Install the Debian "
                   "package (apt-get install chromium; `make test` does it as root).")
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(f"SKIPPED LOUDLY: {message}")
    report_checkpoint(chk, t0, name())
    page = write_report(chk, tmp_path / "report.html").html
    shot = tmp_path / "shot.png"

    taken = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,2000",
                     page.as_uri())
    dom = chromium(tmp_path, "--dump-dom", page.as_uri())

    assert taken.returncode == 0, taken.stderr[-2000:]
    assert shot.exists(), taken.stderr[-2000:]
    assert shot.stat().st_size > 20_000  # a blank 1200x2000 page compresses to ~10 kB
    with Image.open(shot) as image:
        assert image.size == (1200, 2000)
        spread = ImageStat.Stat(image.convert("L")).stddev[0]
    assert spread > 10, f"the screenshot looks blank (pixel std dev {spread:.1f})"
    assert dom.returncode == 0, dom.stderr[-2000:]
    for plot in PLOTS:
        assert f'<img id="img-{plot.name}"' in dom.stdout
        assert f'<section id="plot-{plot.name}">' in dom.stdout
    assert "microbatch report" in dom.stdout
