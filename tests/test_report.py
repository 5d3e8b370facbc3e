"""`maskray report` on a real run's manifest, and the page looked at in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from pipeline.cli import main
from tests.conftest import write_catalog

pytestmark = pytest.mark.usefixtures("ray_local")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("rep")
    write_catalog(root / "in")  # with the variants: enough good images that both actors mask some
    assert main(["run", "--input", str(root / "in"), "--output", str(root / "out"), "--no-progress"]) == 3
    assert main(["report", str(root / "out"), "--price-per-hour", "0.027"]) == 0
    return root / "out" / "_report.html"


def test_report_is_self_contained_and_says_where_time_goes(report):
    page = report.read_text()
    assert "<img" in page and "src=\"http" not in page  # images inlined
    assert len(re.findall(r'src="data:image/png;base64,', page)) == 2
    for section in ("Throughput over time", "Where the time goes", "Actor utilisation", "Masks per node",
                    "Failures by reason", "bottleneck stage", "cost per 1M images", "seconds to first mask"):
        assert section in page
    assert re.search(r"<td>bottleneck stage</td><td>infer</td>", page)
    for kind in ("decode", "empty", "not_an_image", "too_large"):
        assert f"<td>{kind}</td>" in page
    assert page.count("@") >= 2  # two actors listed in utilisation


def test_report_without_a_run_exits_2(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no _summary.json" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian chromium not installed")
def test_report_renders_in_headless_chromium(report, tmp_path):
    shot = tmp_path / "report.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1000,2400",
                    report.as_uri()], check=True, capture_output=True, timeout=120)
    assert shot.stat().st_size > 20_000  # a rendered page with charts, not a blank one
