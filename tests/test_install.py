"""maskray as a user installs it: the wheel in a fresh venv outside the checkout, and a CLI whose
``--help`` needs neither Ray nor ONNX Runtime."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import images

ROOT = Path(__file__).resolve().parent.parent


def test_help_imports_neither_ray_nor_onnxruntime(tmp_path):
    probe = (
        "import json, sys\n"
        "from maskray.pipeline.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'onnxruntime', 'openvino', 'cv2', 'torch'})\n"
        "print(json.dumps(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert "usage: maskray" in out.stdout
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize(
    ("blocked", "args", "scheme", "extra"),
    [
        ("gcsfs", ["--input", "gs://shop/images/", "--output", "out"], "gs", "gcs"),
        ("s3fs", ["--input", str(ROOT / "samples"), "--output", "s3://shop/masks/"], "s3", "s3"),
    ],
)
def test_a_bucket_without_its_extra_is_one_line_naming_the_extra(blocked, args, scheme, extra, tmp_path):
    """What a core install (no gcs/s3 extra) prints for a bucket URI: exit 2 and the pip command."""
    probe = (
        "import sys\n"
        f"sys.modules[{blocked!r}] = None  # as if the extra were not installed\n"
        "from maskray.pipeline.cli import main\n"
        f"sys.exit(main(['run', *{args!r}]))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"maskray: {scheme}:// needs maskray's {extra} extra: pip install 'maskray[{extra}]'"
    ]
    assert not (tmp_path / "out").exists()


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: nothing pointing back at this checkout or its venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if str(ROOT) not in p)
    return {**env, "RAY_USAGE_STATS_ENABLED": "0", **extra}


UV = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")


@pytest.fixture(scope="module")
def range_resolutions(tmp_path_factory):
    """``uv pip compile`` of pyproject's ranges (not the lock) for the oldest and newest Python we
    claim, started in the background: they mostly wait on the package index, so they run while
    the wheel test installs (it asks for this fixture first) and are read by the ranges test."""
    assert UV, "uv is part of the test extra (requirements-dev.lock)"
    tmp = tmp_path_factory.mktemp("ranges")
    procs = {}
    for python in ("3.10", "3.13"):
        out = tmp / f"resolved-{python}.txt"
        cmd = [
            UV,
            "pip",
            "compile",
            str(ROOT / "pyproject.toml"),
            "--extra",
            "gcs",
            "--extra",
            "s3",
            "--python-version",
            python,
            "--python-platform",
            "x86_64-manylinux_2_28",
            "--no-header",
            "--quiet",
            "-o",
            str(out),
        ]
        procs[python] = (subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=clean_env()), out)
    yield procs
    for proc, _ in procs.values():
        proc.kill()
        proc.wait()


@pytest.mark.slow
@pytest.mark.usefixtures("range_resolutions")
def test_the_wheel_installs_into_a_fresh_venv_and_masks_the_samples(tmp_path):
    """Build the wheel, install it with the runtime lock into a new venv (uv), and run it from a
    folder outside the checkout with an empty model cache: the model is fetched on first use."""
    assert UV, "uv is part of the test extra (requirements-dev.lock)"
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
    )
    wheel = next(dist.glob("maskray-*.whl"))
    venv = tmp_path / "venv"
    env = clean_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    subprocess.run([UV, "venv", "--quiet", "--seed", "--python", sys.executable, str(venv)], check=True, env=env)
    py = venv / "bin" / "python"
    subprocess.run(
        [
            UV,
            "pip",
            "install",
            "--quiet",
            # As pip does by default (and every node's install: `make setup-node`, the Dockerfile).
            # Without it, where PYTHONDONTWRITEBYTECODE is set, as on this project's machines, every
            # process compiled Ray and OpenVINO from source (a run timed by hand: 31 s instead of 18 s).
            "--compile-bytecode",
            "--python",
            str(py),
            "-r",
            str(ROOT / "maskray" / "requirements.lock"),
            str(wheel),
        ],
        check=True,
        env=env,
        timeout=600,
    )

    where = subprocess.run(
        [str(py), "-c", "import maskray.pipeline as p, maskray.operators as o; print(p.__file__); print(o.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=tmp_path,
    )
    assert all(str(venv) in line for line in where.stdout.split()), where.stdout  # the installed copy, not ours

    work = tmp_path / "user"
    work.mkdir()
    run = subprocess.run(
        [
            str(venv / "bin" / "maskray"),
            "run",
            "--input",
            str(images.SAMPLES),
            "--output",
            "out",
            "--no-progress",
            "--num-cpus",
            "2",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=work,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "cache" / "maskray" / "u2netp.onnx").is_file()
    summary = json.loads((work / "out" / "_summary.json").read_text())
    assert summary["ok"] == len(images.PHOTOS) and summary["failed"] == 0
    assert len(list((work / "out" / "masks").glob("*.png"))) == len(images.PHOTOS)


@pytest.mark.slow
def test_the_ranges_resolve_on_the_oldest_and_newest_supported_python(range_resolutions):
    """pyproject's ranges (not the lock) resolve to published wheels on Linux x86-64 at both ends
    of the Pythons we claim; 3.11 is installed and run by the wheel test above."""
    for python, (proc, out) in range_resolutions.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"python {python}: {err[-2000:]}"
        pins = dict(
            line.split("==", 1) for line in out.read_text().splitlines() if "==" in line and not line.startswith("#")
        )
        assert {"ray", "onnxruntime", "numpy", "pyarrow", "gcsfs", "s3fs"} <= set(pins), python
