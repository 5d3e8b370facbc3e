"""Facts about the machine that explain a run's speed: CPU model and flags."""

from __future__ import annotations

import os
import platform
from functools import lru_cache

BF16_FLAGS = ("avx512_bf16", "amx_bf16")
NO_BF16 = f"this CPU has neither {' nor '.join(BF16_FLAGS)}"  # how a refusal names the missing flags
# The flags that decide ONNX Runtime's CPU kernels; the summary records all flags too.
KEY_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", *BF16_FLAGS, "amx_tile", "amx_int8")


@lru_cache(maxsize=1)
def cpu_flags() -> tuple[str, ...]:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return tuple(sorted(set(line.split(":", 1)[1].split())))
    except OSError:
        pass
    return ()


def has_bf16_hardware(flags: tuple[str, ...] | None = None) -> bool:
    """Whether ``flags`` (default: this CPU's) include bf16 hardware."""
    have = cpu_flags() if flags is None else flags
    return any(f in have for f in BF16_FLAGS)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict:
    flags = cpu_flags()
    return {
        "cpu_model": cpu_model(),
        "arch": platform.machine(),
        "logical_cpus": os.cpu_count(),
        "bf16_hardware": has_bf16_hardware(),
        "key_flags": [f for f in KEY_FLAGS if f in flags],
        "cpu_flags": list(flags),
    }
