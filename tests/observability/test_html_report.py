"""``microbatch report``: a self-contained HTML page with every plot, and PNGs next to it."""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import polars as pl
from obs_helpers import report_checkpoint, run_cli

import microbatch as mb
from microbatch.observability.report import PLOTS, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def embedded_images(page: str) -> dict[str, bytes]:
    """``img id -> PNG bytes`` of every ``data:`` image in the page."""
    found = re.findall(r'<img id="img-([a-z_]+)"[^>]*src="data:image/png;base64,([^"]+)"', page)
    return {name: base64.b64decode(data) for name, data in found}


def test_report_embeds_every_plot_and_writes_pngs_next_to_it(
    chk: Path, tmp_path: Path, t0: datetime, name: Callable[[], str]
) -> None:
    report_checkpoint(chk, t0, name())
    out = tmp_path / "site" / "report.html"

    written = write_report(chk, out)

    assert written.html == out
    assert written.batches == len(list((chk / "progress").iterdir()))
    page = out.read_text()
    assert page.startswith("<!doctype html>")
    assert "<script" not in page
    assert "http://" not in page
    assert "https://" not in page  # self-contained: nothing to fetch
    images = embedded_images(page)
    assert set(images) == {p.name for p in PLOTS} == {
        "rows_per_second", "batch_duration", "watermark_lag", "source_lag", "state_size",
        "late_and_dead_letter_rows", "latency",
    }
    for plot in PLOTS:
        png = images[plot.name]
        assert png.startswith(PNG_MAGIC)
        assert len(png) > 5_000
        beside = out.with_name(f"report-{plot.name}.png")
        assert beside.read_bytes() == png  # the same image, next to the page
        assert f'<section id="plot-{plot.name}">' in page
    assert "late rows (all recorded batches)</td><td>1<" in page
    assert page.count('<tr><td>') >= written.batches  # the batch table


def test_report_cli_writes_the_page_and_refuses_a_non_checkpoint(
    chk: Path, tmp_path: Path, name: Callable[[], str]
) -> None:
    src = mb.read_memory(schema={"x": pl.Int64}, max_records_per_batch=1)
    src.add({"x": [1, 2]})
    src.write_memory(name()).start(chk, trigger="available-now").await_termination(30)

    done = run_cli("report", chk, "-o", tmp_path / "r.html", cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    assert "report written" in done.stderr
    assert "(2 batches, 7 plots)" in " ".join(done.stderr.split())
    assert len(embedded_images((tmp_path / "r.html").read_text())) == len(PLOTS)
    refused = run_cli("report", tmp_path / "nope", "-o", tmp_path / "x.html", cwd=tmp_path)
    assert refused.returncode == 2
    assert "does not exist" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_report_of_a_query_without_batches_still_has_every_plot(
    chk: Path, tmp_path: Path, name: Callable[[], str]
) -> None:
    src = mb.read_memory(schema={"x": pl.Int64})
    query = src.write_memory(name()).start(chk)
    time.sleep(0.1)
    query.stop()

    written = write_report(chk, tmp_path)  # a directory: report.html inside it

    assert written.html == tmp_path / "report.html"
    assert written.batches == 0
    assert len(embedded_images(written.html.read_text())) == len(PLOTS)
