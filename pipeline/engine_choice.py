"""Which engine a run uses: checked on the driver before any image is read.

``--engine auto`` (the default) runs every installed CPU engine on the bundled check photos, keeps
those whose masks agree with ONNX Runtime's (the reference), and picks the fastest. A named engine
must pass the same check. ``--precision bf16`` needs bf16 hardware (emulated bf16 is ~20x slower)
and must keep IoU >= 0.98 on every check photo. ``--device cuda`` needs a CUDA engine here (local
run) or GPUs in the cluster; its actors run the agreement check themselves, on their GPU.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
from dataclasses import asdict, dataclass, field

import numpy as np

from maskray.operators import agreement
from maskray.operators.engines import (
    ENGINES,
    EngineError,
    EngineSpec,
    default_cache_dir,
    installed,
    open_engine,
    user_cache_dir,
)
from maskray.operators.errors import one_line
from maskray.pipeline.config import ConfigError, RunConfig
from maskray.pipeline.sysinfo import NO_BF16, cpu_flags, cpu_model, has_bf16_hardware

log = logging.getLogger("maskray")

# auto tries these on the CPU, the reference last (it always agrees with itself).
CPU_CANDIDATES = ("openvino", "ort")
DISTRIBUTIONS = {"ort": "onnxruntime", "openvino": "openvino", "torch": "torch"}
# Bump when the check photos or thresholds change: cached choices are then made again.
CHECK_VERSION = 1


@dataclass(frozen=True)
class EngineChoice:
    spec: EngineSpec
    version: str
    reference: np.ndarray  # the reference masks of the check photos, for checks made elsewhere (GPUs)
    checks: dict[str, str] = field(default_factory=dict)  # engine -> its check result, or why not

    @property
    def label(self) -> str:
        return f"{self.spec.label} {self.version}".strip()


def base_spec(cfg: RunConfig, name: str) -> EngineSpec:
    return EngineSpec(
        name=name,
        precision=cfg.precision,
        device=cfg.device,
        threads=cfg.intra_op_threads,
        inter_op_threads=cfg.inter_op_threads,
        graph_optimization=cfg.graph_optimization,
        cache_dir=default_cache_dir(),
    )


def check_precision(cfg: RunConfig, flags: tuple[str, ...] | None = None) -> None:
    """bf16 only where the CPU has it: refused with one line naming the missing flags."""
    if cfg.precision != "bf16":
        return
    if cfg.device != "cpu":
        raise ConfigError("precision bf16: only on the CPU (GPU inference runs strict fp32)")
    if not has_bf16_hardware(cpu_flags() if flags is None else flags):
        raise ConfigError(f"precision bf16: {NO_BF16} (emulated bf16 runs ~20x slower than fp32); use --precision fp32")
    if cfg.engine == "ort":
        raise ConfigError("precision bf16: engine ort runs fp32 only; use --engine openvino or auto")


def cuda_engines() -> list[str]:
    """Installed engines that can run on a CUDA device in this process."""
    found = []
    if installed("ort"):
        import onnxruntime as ort

        if "CUDAExecutionProvider" in ort.get_available_providers():
            found.append("ort")
    if installed("torch"):
        import torch

        if torch.cuda.is_available():
            found.append("torch")
    return found


def check_local_cuda(cfg: RunConfig) -> None:
    """A local ``--device cuda`` run needs a CUDA engine on this machine: one line, before any read."""
    found = cuda_engines()
    if cfg.engine != "auto" and cfg.engine not in found:
        found = []
    if not found:
        which = "" if cfg.engine == "auto" else f" for engine {cfg.engine}"
        raise ConfigError(
            f"device cuda: no CUDA device usable{which} on this machine (onnxruntime-gpu's "
            "CUDAExecutionProvider or PyTorch with CUDA); use --device cpu"
        )


def describe(checks: dict[str, str]) -> str:
    return "; ".join(f"{name}: {result}" for name, result in checks.items())


def choice_key(cfg: RunConfig, model_md5: str) -> str:
    """What decides the choice: the model, the engines' versions, this CPU and the settings."""
    versions = {n: _version(DISTRIBUTIONS[n]) for n in ENGINES}
    parts = [
        model_md5,
        cfg.engine,
        cfg.precision,
        cfg.device,
        cfg.intra_op_threads,
        cfg.inter_op_threads,
        cfg.graph_optimization,
        sorted(versions.items()),
        cpu_model(),
        sorted(cpu_flags()),
        CHECK_VERSION,
    ]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:20]


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def cached_choice(cfg: RunConfig, model: bytes, model_md5: str) -> EngineChoice:
    """``choose_engine``, remembered in the user cache: the check costs a few seconds of start-up
    and its answer only changes with the model, an engine's version, the CPU or the settings."""
    path = user_cache_dir() / "engine-choice" / f"{choice_key(cfg, model_md5)}.npz"
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            choice = EngineChoice(EngineSpec(**meta["spec"]), meta["version"], data["reference"], meta["checks"])
        log.debug("engine %s (checked earlier: %s)", choice.label, describe(choice.checks))
        return choice
    except (OSError, KeyError, ValueError, TypeError):
        pass
    choice = choose_engine(cfg, model)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial.npz")
        meta = {"spec": asdict(choice.spec), "version": choice.version, "checks": choice.checks}
        np.savez(partial, meta=np.asarray(json.dumps(meta)), reference=choice.reference)
        partial.replace(path)
    except OSError as exc:  # a read-only home only costs the check next time
        log.debug("engine choice not cached: %s", exc)
    return choice


def choose_engine(cfg: RunConfig, model: bytes) -> EngineChoice:
    """The engine for this run, checked against the reference; raises ConfigError with one line."""
    check_precision(cfg)
    tensors = agreement.check_tensors()
    ref_engine = open_engine(model, EngineSpec(threads=cfg.intra_op_threads))
    reference, ref_seconds = agreement.masks_of(ref_engine, tensors)
    if cfg.device == "cuda":
        name = cfg.engine if cfg.engine != "auto" else (cuda_engines() or ["ort"])[0]
        return EngineChoice(base_spec(cfg, name), "", reference)
    names = [cfg.engine] if cfg.engine != "auto" else [n for n in CPU_CANDIDATES if installed(n)]
    if cfg.precision == "bf16":
        names = [n for n in names if n != "ort"]
    checks: dict[str, str] = {}
    passed: list[tuple[float, EngineSpec, str]] = []
    for name in names:
        spec = base_spec(cfg, name)
        if name == "ort":  # the reference itself (bf16 candidates exclude it)
            checks[name] = f"reference, {ref_seconds * 1000:.0f} ms/image"
            passed.append((ref_seconds, spec, ref_engine.version))
            continue
        try:
            engine = open_engine(model, spec)
            found = agreement.compare(reference, *agreement.masks_of(engine, tensors))
        except EngineError as exc:
            checks[name] = str(exc)
            continue
        except Exception as exc:  # noqa: BLE001 - an engine that breaks is not chosen, and says why
            checks[name] = f"failed to run ({one_line(exc, with_type=False, limit=160)})"
            continue
        verdict = "agrees" if found.passes(cfg.precision) else "disagrees"
        checks[name] = f"{verdict}: {found.describe()}"
        if found.passes(cfg.precision):
            passed.append((found.seconds_per_image, spec, engine.version))
    if not passed:
        detail = describe(checks) or "no engine installed"
        raise ConfigError(
            f"engine {cfg.engine} ({cfg.precision}): no engine passed the agreement check "
            f"with ONNX Runtime fp32 ({detail})"
        )
    _, spec, version = min(passed, key=lambda p: p[0])
    log.info("engine %s %s chosen (%s)", spec.label, version, describe(checks))
    return EngineChoice(spec, version, reference, checks)
