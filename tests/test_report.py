"""`maskray report` on a real run's manifest, and the page looked at in headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from maskray.pipeline.cli import main
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
    assert "<img" in page and 'src="http' not in page  # images inlined
    assert len(re.findall(r'src="data:image/png;base64,', page)) == 2
    for section in (
        "Throughput over time",
        "Where the time goes",
        "Actor utilisation",
        "Masks per node",
        "Failures by reason",
        "bottleneck stage",
        "cost per 1M images",
        "seconds to first mask",
    ):
        assert section in page
    assert re.search(r"<td>bottleneck stage</td><td>infer</td>", page)
    for kind in ("decode", "empty", "not_an_image", "too_large"):
        assert f"<td>{kind}</td>" in page
    assert page.count("@") >= 2  # two actors listed in utilisation


def test_report_without_a_run_exits_2(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no _summary.json" in capsys.readouterr().err


def test_report_renders_in_headless_chromium(report, tmp_path):
    if shutil.which("chromium") is None:
        # CI installs Chromium (.ci/run) and sets this: a failed install must not pass silently.
        if os.environ.get("MASKRAY_REQUIRE_CHROMIUM"):
            pytest.fail("chromium is not installed but MASKRAY_REQUIRE_CHROMIUM is set")
        pytest.skip("Debian chromium not installed (set MASKRAY_REQUIRE_CHROMIUM=1 to make this a failure)")
    shot = tmp_path / "report.png"
    subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1000,2400",
            report.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert shot.stat().st_size > 20_000  # a rendered page with charts, not a blank one


def test_report_of_a_million_row_run_is_built_from_aggregates_in_bounded_memory(tmp_path):
    """A synthetic 1M-row manifest (10 parts) and its summary: the report reads one part at a time
    (its peak RSS stays far below the ~1 GB that loading every row into pandas would take) and
    shows the right totals, per-node counts, percentiles and error examples."""
    import json
    import sys

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from maskray.pipeline.rows import MANIFEST_SCHEMA, TIME_COLUMNS

    out = tmp_path / "out"
    run_dir = out / "_manifest" / "big"
    run_dir.mkdir(parents=True)
    rng = np.random.default_rng(0)
    t0, per_part = 1_700_000_000.0, 100_000
    for p in range(10):
        k = per_part
        status = np.where(np.arange(k) % 1000 == 0, "error", "ok")
        cols = {
            "source": [f"gs://b/{p}/{i}.jpg" for i in range(k)],
            "output": [None] * k,
            "cutout": [None] * k,
            "status": status,
            "error_kind": np.where(status == "error", "decode", None),
            "error": np.where(status == "error", "decode: truncated image", None),
            "fingerprint": ["f"] * k,
            "width": np.full(k, 4000),
            "height": np.full(k, 3000),
            "input_bytes": np.full(k, 2_000_000),
            "node": np.where(np.arange(k) % 2 == 0, "node-a", "node-b"),
            "actor": [f"actor{i % 8}@1" for i in range(k)],
            "actor_restarted": np.zeros(k, dtype=bool),
            "engine": ["openvino/fp32/cpu 2026.4.1"] * k,
            **{c: rng.gamma(2.0, 10.0, k).astype(np.float32) for c in TIME_COLUMNS},
            "started_at": t0 + p * 100 + np.arange(k) / 1000,
            "finished_at": t0 + p * 100 + np.arange(k) / 1000 + 1,
        }
        cols["infer_ms"] = np.full(k, 250.0, np.float32)
        pq.write_table(
            pa.table({f.name: pa.array(cols[f.name], f.type) for f in MANIFEST_SCHEMA}),
            run_dir / f"part-att-{p:06d}.parquet",
        )
    summary = {
        "run_id": "big",
        "attempt": "att",
        "inputs": 1_000_000,
        "ok": 999_000,
        "failed": 1000,
        "skipped": 0,
        "seconds": 1101.0,
        "images_per_second": 907.4,
        "first_row_started_at": t0,
        "last_row_finished_at": t0 + 1001.0,
        "cluster": {"pool_size": 8, "cluster_cpus": 8},
        "config": {},
    }
    (out / "_summary.json").write_text(json.dumps(summary))
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forking parent (this test process).
    script = (
        "import sys; from maskray.pipeline.report import write_report; write_report(sys.argv[1]); "
        "print(next(int(l.split()[1]) // 1024 for l in open('/proc/self/status') if l.startswith('VmHWM')))"
    )
    done = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    peak_mb = int(done.stdout.strip().splitlines()[-1])
    page = (out / "_report.html").read_text()
    assert peak_mb < 450, f"report peak RSS {peak_mb} MB"
    # Errors fall on every 1000th row, all on node-a's (even) rows: 100 per part.
    assert "<td>node-a</td><td>499000</td>" in page and "<td>node-b</td><td>500000</td>" in page
    assert "<td>decode</td><td>1000</td>" in page and "gs://b/0/0.jpg (decode: truncated image)" in page
    assert re.search(r"<td>infer</td><td>2\d\d\.\d / 2\d\d\.\d / 2\d\d\.\d</td>", page)  # p50 / p95 / p99
    assert page.count("actor") >= 8
