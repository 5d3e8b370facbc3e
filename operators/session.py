"""One fp32 ONNX Runtime session per actor, and the U2Net-P forward pass.

Input: the model's bytes (so worker nodes need no shared disk) and thread settings. ``run_model``
then ``to_small_mask`` give the 320x320 uint8 mask rembg would build before resizing it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

# rembg's U2Net-P session: take output 0, channel 0.
_OUTPUT_INDEX = 0


@dataclass(frozen=True)
class SessionOptions:
    intra_op_threads: int = 1
    inter_op_threads: int = 1
    graph_optimization: str = "all"  # "disable" | "basic" | "extended" | "all"
    enable_mem_arena: bool = True
    allow_spinning: bool = True


_GRAPH_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def make_session(
    model: bytes,
    opts: SessionOptions = SessionOptions(),
    providers: Sequence[str | tuple[str, dict[str, object]]] | None = None,
) -> ort.InferenceSession:
    """A session with explicit threads (CPU unless ``providers`` say otherwise): one
    single-threaded copy per core scales best."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = opts.intra_op_threads
    so.inter_op_num_threads = opts.inter_op_threads
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = _GRAPH_LEVELS[opts.graph_optimization]
    so.enable_cpu_mem_arena = opts.enable_mem_arena
    # Spinning threads burn a core while idle; with one thread per actor it only matters >1.
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if opts.allow_spinning else "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "1" if opts.allow_spinning else "0")
    return ort.InferenceSession(model, sess_options=so, providers=list(providers or ["CPUExecutionProvider"]))


def input_precisions(session: ort.InferenceSession) -> set[str]:
    """Element types of the model's inputs and outputs, e.g. {"tensor(float)"}."""
    return {t.type for t in (*session.get_inputs(), *session.get_outputs())}


def run_model(session: ort.InferenceSession, tensor: np.ndarray) -> np.ndarray:
    """float32 1x3x320x320 -> the raw 320x320 saliency map (output 0, channel 0)."""
    name = session.get_inputs()[0].name
    out = session.run(None, {name: tensor})[_OUTPUT_INDEX]
    return np.asarray(out[0, 0])


def to_small_mask(pred: np.ndarray) -> np.ndarray:
    """rembg's per-image min-max normalisation, then ``(pred * 255).astype(uint8)`` (truncates)."""
    lo, hi = pred.min(), pred.max()  # numpy scalars of pred's dtype keep rembg's float32 math
    span = hi - lo
    scaled = (pred - lo) / span if span > 0 else np.zeros_like(pred)
    return (scaled * 255).astype(np.uint8)
