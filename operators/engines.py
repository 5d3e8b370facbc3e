"""Inference engines behind one small interface: a batch of normalised 320x320 tensors -> raw maps.

Input: the model's bytes and an ``EngineSpec`` (engine name, precision, device, threads). Output of
``Engine.infer``: float32 ``N x 320 x 320`` saliency maps (output 0, channel 0, as rembg reads it),
which ``operators.session.to_small_mask`` turns into masks.

- ``ort``: ONNX Runtime, the reference. On CPU one image per call: batching measured no faster
  (``bench/engines.py``); on CUDA the graph gets a dynamic batch and TF32 is off (it breaks masks).
- ``openvino``: OpenVINO's CPU runtime on the same .onnx, compiled for a static batch of one and
  called once per image: static shapes ran ~6% faster than a dynamic batch dimension at any batch
  size (``bench/engines.py``). Its CPU default precision is bf16 where the CPU has bf16 hardware,
  so f32 is always set explicitly; ``bf16`` runs only the heaviest convolutions in bf16.
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


# bf16 runs only the convolutions that each hold at least this share of the model's multiply-adds;
# every other op stays fp32. OpenVINO's whole-model bf16 missed the gate on U2Net-P (min IoU 0.90 on
# the AMX Xeon, 0.94 on the AMD EPYC), and neither its per-node fp32 attribute nor fp32 islands cut
# out of the graph fixed that at a useful speed: bf16 errors build up everywhere, and one 0.47-GMAC
# convolution alone (in the second decoder stage) broke masks in bf16 (IoU 0.43). The four that
# hold >= 5% each are 67% of U2Net-P's MACs (7.55 + 3 x 1.89 of 19.76 GMAC) and keep IoU >= 0.99
# on the samples and their crops, flips and turns (README, "Engines").
BF16_MIN_MAC_SHARE = 0.05


def compile_openvino(model: bytes, spec: EngineSpec, batch: int | None = 1) -> Any:
    """OpenVINO's compiled model for ``spec`` with input batch ``batch`` (None: dynamic).

    Always compiled with OpenVINO's f32 precision hint; ``bf16`` puts explicit bf16 conversions
    around the heaviest convolutions (``bf16_convolutions``), which the CPU plugin then runs on
    its bf16 kernels (AMX or AVX-512 BF16) while every other op stays fp32.
    """
    if spec.device != "cpu":
        raise EngineError(f"engine openvino runs on the CPU here (asked for {spec.device})")
    core, net = read_openvino(model, batch)
    islands = bf16_convolutions(net) if spec.precision == "bf16" else []
    for conv in islands:
        run_in_bf16(conv)
    config = openvino_config(spec)
    if spec.cache_dir:
        Path(spec.cache_dir).mkdir(parents=True, exist_ok=True)
        config["CACHE_DIR"] = spec.cache_dir
    compiled = core.compile_model(net, "CPU", config)
    check_compiled_precision(spec, runtime_precisions(compiled, {c.get_friendly_name() for c in islands}))
    return compiled


def read_openvino(model: bytes, batch: int | None = 1) -> tuple[Any, Any]:
    """(OpenVINO's core, the model with input batch ``batch``, None: dynamic, at the model's size)."""
    ov = import_openvino()
    core = ov.Core()
    net = core.read_model(model)
    net.reshape({net.inputs[0]: ov.PartialShape([batch or -1, 3, MODEL_SIZE[1], MODEL_SIZE[0]])})
    return core, net


def openvino_config(spec: EngineSpec) -> dict[str, Any]:
    """The CPU plugin's settings for ``spec`` (without the cache)."""
    return {
        "INFERENCE_NUM_THREADS": spec.threads,
        "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY",
        # OpenVINO's CPU default is bf16 on bf16 hardware, for every op; maskray's bf16 is placed
        # by hand (``run_in_bf16``).
        "INFERENCE_PRECISION_HINT": "f32",
        # Several single-threaded actors share a node: pinning would put them all on one core.
        "ENABLE_CPU_PINNING": False,
    }


def per_image_macs(conv: Any) -> int:
    """Multiply-adds of one convolution for one image: output elements x (input channels x kernel)."""
    out = [d.get_length() for d in list(conv.get_output_partial_shape(0))[1:]]
    weights = [d.get_length() for d in list(conv.input(1).get_partial_shape())[1:]]
    return int(np.prod(out)) * int(np.prod(weights))


def convolutions(net: Any) -> list[Any]:
    return [op for op in net.get_ordered_ops() if op.get_type_name() == "Convolution"]


def bf16_convolutions(net: Any) -> list[Any]:
    """The convolutions that each hold at least ``BF16_MIN_MAC_SHARE`` of the model's MACs."""
    convs = convolutions(net)
    macs = [per_image_macs(conv) for conv in convs]
    return [conv for conv, m in zip(convs, macs, strict=True) if m >= BF16_MIN_MAC_SHARE * sum(macs)]


def run_in_bf16(conv: Any) -> None:
    """Convert a convolution's input and weights to bf16 and its output back to f32 (the converts are
    named after it, ``<conv>/to_bf16_<port>`` and ``<conv>/to_f32``, so profiles show what they are)."""
    ov = import_openvino()
    name = conv.get_friendly_name()
    for port in conv.inputs():
        to_bf16 = ov.opset13.convert(port.get_source_output(), "bf16", name=f"{name}/to_bf16_{port.get_index()}")
        port.replace_source_output(to_bf16.output(0))
    users = list(conv.output(0).get_target_inputs())
    back = ov.opset13.convert(conv.output(0), "f32", name=f"{name}/to_f32")
    for user in users:
        user.replace_source_output(back.output(0))


def runtime_precisions(compiled: Any, islands: set[str]) -> dict[str, str]:
    """What the CPU plugin runs, each a comma-joined sorted set (e.g. ``"bf16"`` or ``"f32,i32"``):
    ``islands``, the bf16 convolutions (named in ``islands``); ``convolutions``, every other
    convolution; ``all``, every op (its fused converts make some ops read bf16 and write f32)."""
    found: dict[str, set[str]] = {"islands": set(), "convolutions": set(), "all": set()}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if "runtimePrecision" not in info:
            continue
        precision = str(info["runtimePrecision"].value)
        found["all"].add(precision)
        if info["layerType"].value == "Convolution":
            found["islands" if op.get_friendly_name() in islands else "convolutions"].add(precision)
    return {key: ",".join(sorted(value)) for key, value in found.items()}


def check_compiled_precision(spec: EngineSpec, precisions: dict[str, str]) -> None:
    """Raise unless the plugin runs the precision asked for (``precisions``: ``runtime_precisions``).

    fp32 must run no bf16 op anywhere, and bf16 no other convolution in bf16. bf16 must run its own
    convolutions on bf16 kernels: on a CPU without bf16 hardware the plugin quietly turns them back
    to f32, and an engine labelled bf16 would run (and pass the agreement gate) as fp32.
    """
    if spec.precision == "fp32" and "bf16" in precisions["all"].split(","):
        raise EngineError("engine openvino compiled bf16 when fp32 was asked for")
    if "bf16" in precisions["convolutions"].split(","):
        raise EngineError("engine openvino compiled bf16 beyond its bf16 convolutions")
    if spec.precision == "bf16" and precisions["islands"] != "bf16":
        raise EngineError(
            f"engine openvino compiled {precisions['islands'] or 'no convolution'} when bf16 was asked for "
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
