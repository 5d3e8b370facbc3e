"""Inference engines behind one small interface: a batch of normalised 320x320 tensors -> raw maps.

Input: the model's bytes and an ``EngineSpec`` (engine name, precision, device, threads). Output of
``Engine.infer``: float32 ``N x 320 x 320`` saliency maps (output 0, channel 0, as rembg reads it),
which ``operators.session.to_small_mask`` turns into masks.

- ``ort``: ONNX Runtime, the reference. On CPU one image per call: batching measured no faster
  (``bench/engines.py``); on CUDA the graph gets a dynamic batch and TF32 is off (it breaks masks).
- ``openvino``: OpenVINO's CPU runtime on the same .onnx, compiled for a static batch of one and
  called once per image: static shapes ran ~6% faster than a dynamic batch dimension at any batch
  size (``bench/engines.py``). Its CPU default precision is bf16 where the CPU has bf16 hardware,
  so f32 is always set explicitly.
- ``torch``: the ONNX graph run op by op with PyTorch on a CUDA device (``operators.torch_graph``),
  strict fp32 (TF32 off), for GPU nodes that have PyTorch but not onnxruntime-gpu.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from importlib import util
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np

from maskray.operators.preprocess import MODEL_SIZE

ENGINES = ("ort", "openvino", "torch")
PRECISIONS = ("fp32", "bf16")
DEVICES = ("cpu", "cuda")


class EngineError(RuntimeError):
    """An engine that cannot run here (not installed, no device, unsupported precision): one line."""


@dataclass(frozen=True)
class EngineSpec:
    name: str = "ort"
    precision: str = "fp32"
    device: str = "cpu"
    threads: int = 1  # intra-op threads: one single-threaded copy per core scales best
    inter_op_threads: int = 1
    graph_optimization: str = "all"  # ONNX Runtime only
    cache_dir: str | None = None  # OpenVINO's compiled-model cache

    @property
    def label(self) -> str:
        """What the manifest records, e.g. ``openvino/fp32/cpu``."""
        return f"{self.name}/{self.precision}/{self.device}"


class Engine(Protocol):
    spec: EngineSpec
    version: str

    def infer(self, batch: np.ndarray) -> np.ndarray:
        """float32 N x 3 x 320 x 320 -> float32 N x 320 x 320."""
        ...


def installed(name: str) -> bool:
    module = {"ort": "onnxruntime", "openvino": "openvino", "torch": "torch"}[name]
    return util.find_spec(module) is not None


def user_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "maskray"


def default_cache_dir() -> str:
    return str(user_cache_dir() / "openvino")


class OrtEngine:
    def __init__(self, model: bytes, spec: EngineSpec) -> None:
        import onnxruntime as ort

        from maskray.operators import session

        opts = session.SessionOptions(
            intra_op_threads=spec.threads,
            inter_op_threads=spec.inter_op_threads,
            graph_optimization=spec.graph_optimization,
        )
        if spec.precision != "fp32":
            raise EngineError(f"engine ort runs fp32 only (asked for {spec.precision})")
        if spec.device == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise EngineError(
                    "engine ort: this onnxruntime has no CUDAExecutionProvider "
                    "(install maskray[cuda], which brings onnxruntime-gpu)"
                )
            # TF32 (cuDNN's default on Ampere and later) gave min IoU 0.51 on this model: strict fp32.
            providers = [("CUDAExecutionProvider", {"use_tf32": 0, "cudnn_conv_algo_search": "EXHAUSTIVE"})]
            self.session = session.make_session(with_dynamic_batch(model), opts, providers=providers)
            self.batched = True
        else:
            self.session = session.make_session(model, opts)
            self.batched = False
        self.spec, self.version = spec, ort.__version__
        self.input_name = self.session.get_inputs()[0].name

    def infer(self, batch: np.ndarray) -> np.ndarray:
        if self.batched:
            return np.asarray(self.session.run(None, {self.input_name: batch})[0][:, 0])
        return np.stack([self.session.run(None, {self.input_name: x[np.newaxis]})[0][0, 0] for x in batch])


def import_openvino() -> Any:
    """OpenVINO, imported without its usage telemetry.

    ``import openvino`` reports each import to Google Analytics from a forked child process
    (``openvino-telemetry``, a dependency of the wheel) and writes a client id under ``~/intel``,
    unless a consent file there says no; off a terminal it asks nothing. An inference actor must
    not phone home from a user's cluster, nor fork itself while it starts. OpenVINO uses its own
    no-op stub when that package cannot be imported, which a ``None`` entry in ``sys.modules``
    makes happen: in this process only, and only if nothing has imported the package already.
    """
    if "openvino" not in sys.modules:
        sys.modules.setdefault("openvino_telemetry", cast(Any, None))  # Python's "cannot be imported" entry
    import openvino as ov

    return ov


def compile_openvino(model: bytes, spec: EngineSpec, batch: int | None = 1) -> Any:
    """OpenVINO's compiled model for ``spec`` with input batch ``batch`` (None: dynamic)."""
    ov = import_openvino()

    if spec.device != "cpu":
        raise EngineError(f"engine openvino runs on the CPU here (asked for {spec.device})")
    core = ov.Core()
    net = core.read_model(model)
    net.reshape({net.inputs[0]: ov.PartialShape([batch or -1, 3, MODEL_SIZE[1], MODEL_SIZE[0]])})
    config: dict[str, Any] = {
        "INFERENCE_NUM_THREADS": spec.threads,
        "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": "bf16" if spec.precision == "bf16" else "f32",
        # Several single-threaded actors share a node: pinning would put them all on one core.
        "ENABLE_CPU_PINNING": False,
    }
    if spec.cache_dir:
        Path(spec.cache_dir).mkdir(parents=True, exist_ok=True)
        config["CACHE_DIR"] = spec.cache_dir
    compiled = core.compile_model(net, "CPU", config)
    check_compiled_precision(spec, compiled.get_property("INFERENCE_PRECISION_HINT"))
    return compiled


def check_compiled_precision(spec: EngineSpec, compiled: Any) -> None:
    """Raise if OpenVINO compiled another precision than asked for.

    On a CPU without bf16 hardware OpenVINO takes the bf16 hint silently and compiles f32, so an
    engine labelled bf16 would run (and pass the agreement gate) as fp32.
    """
    ov = import_openvino()
    wanted = ov.Type.bf16 if spec.precision == "bf16" else ov.Type.f32
    if compiled != wanted:
        raise EngineError(
            f"engine openvino compiled {compiled.get_type_name()} when {spec.precision} was asked for "
            "(it falls back to f32 on CPUs without bf16 hardware)"
        )


class OpenVinoEngine:
    def __init__(self, model: bytes, spec: EngineSpec) -> None:
        ov = import_openvino()
        self.compiled = compile_openvino(model, spec)
        self.request = self.compiled.create_infer_request()
        self.output = self.compiled.outputs[0]
        self.spec, self.version = spec, ov.__version__.split("-")[0]

    def infer(self, batch: np.ndarray) -> np.ndarray:
        return np.stack([self.request.infer({0: x[np.newaxis]})[self.output][0, 0] for x in batch])


def with_dynamic_batch(model: bytes) -> bytes:
    """The graph with a symbolic batch dimension (the network is fully convolutional).

    Needs the ``onnx`` package (in the ``cuda`` extra); the stored intermediate shapes, all batch 1,
    are dropped so the runtime infers them again.
    """
    try:
        import onnx
    except ImportError:
        raise EngineError("batched inference needs the onnx package (install maskray[cuda])") from None
    proto = onnx.load_from_string(model)
    for value in (*proto.graph.input, *proto.graph.output):
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].ClearField("dim_value")
            dims[0].dim_param = "batch"
    del proto.graph.value_info[:]
    return bytes(proto.SerializeToString())


def open_engine(model: bytes, spec: EngineSpec) -> Engine:
    """Build the engine ``spec`` names; raises ``EngineError`` with one line if it cannot run here."""
    if spec.name not in ENGINES:
        raise EngineError(f"unknown engine {spec.name!r} (choose from {', '.join(ENGINES)})")
    if not installed(spec.name):
        extra = {"ort": "onnxruntime", "openvino": "maskray[openvino]", "torch": "torch"}[spec.name]
        raise EngineError(f"engine {spec.name} is not installed (install {extra})")
    if spec.name == "openvino":
        return OpenVinoEngine(model, spec)
    if spec.name == "torch":
        from maskray.operators.torch_graph import TorchEngine

        return TorchEngine(model, spec)
    return OrtEngine(model, spec)
