"""Do two engines make the same masks? The check photos, the metrics and the gate.

Input: an engine and the reference masks (ONNX Runtime fp32 on the CPU). Output: per-photo mean
absolute difference in grey levels and IoU of the masks thresholded at 128, and whether they pass
the thresholds (fp32 engines must agree almost exactly; reduced precision has its own gate).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from maskray.operators.engines import Engine
from maskray.operators.preprocess import normalise
from maskray.operators.session import to_small_mask

CHECK_PHOTOS = Path(__file__).resolve().parent / "check_photos"
# An fp32 engine must give the reference's masks up to rounding: <= 0.05 grey levels on average.
FP32_MAX_MAD, FP32_MIN_IOU = 0.05, 0.999
# Reduced precision (bf16) is offered only where every photo with a foreground keeps IoU >= 0.98.
REDUCED_MIN_IOU = 0.98
# A cheaper step around the model (mask upscale, scaled decode) is a default only within this of
# the exact path's full-size masks, on real photos upscaled to 12 MP.
CHEAP_PATH_MAX_MAD, CHEAP_PATH_MIN_IOU = 0.5, 0.995


def check_tensors() -> np.ndarray:
    """The bundled photos as one float32 N x 3 x 320 x 320 batch (already at the model's size)."""
    photos = sorted(CHECK_PHOTOS.glob("*.jpg"))
    return np.concatenate([normalise(np.asarray(Image.open(p).convert("RGB"))) for p in photos])


def masks_of(engine: Engine, tensors: np.ndarray) -> tuple[np.ndarray, float]:
    """(N x 320 x 320 uint8 masks, seconds per image), timed after a warm-up call of the same
    shape (a dynamic-shape engine prepares each new shape on first use)."""
    engine.infer(tensors)
    t0 = time.perf_counter()
    maps = engine.infer(tensors)
    seconds = (time.perf_counter() - t0) / len(tensors)
    return np.stack([to_small_mask(m) for m in maps]), seconds


def mad(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference of two 8-bit masks, in grey levels."""
    return float(np.abs(a.astype(np.int16) - b).mean())


def iou(a: np.ndarray, b: np.ndarray) -> float:
    fa, fb = a >= 128, b >= 128
    union = np.logical_or(fa, fb).sum()
    return 1.0 if union == 0 else float(np.logical_and(fa, fb).sum() / union)


@dataclass(frozen=True)
class Agreement:
    mad: tuple[float, ...]
    iou: tuple[float, ...]
    seconds_per_image: float

    @property
    def max_mad(self) -> float:
        return max(self.mad)

    @property
    def min_iou(self) -> float:
        return min(self.iou)

    def passes(self, precision: str) -> bool:
        if precision == "fp32":
            return self.max_mad <= FP32_MAX_MAD and self.min_iou >= FP32_MIN_IOU
        return self.min_iou >= REDUCED_MIN_IOU

    def describe(self) -> str:
        return f"max MAD {self.max_mad:.3f}, min IoU {self.min_iou:.4f}, {self.seconds_per_image * 1000:.0f} ms/image"


def compare(reference: np.ndarray, masks: np.ndarray, seconds_per_image: float) -> Agreement:
    pairs = list(zip(reference, masks, strict=True))
    return Agreement(tuple(mad(r, m) for r, m in pairs), tuple(iou(r, m) for r, m in pairs), seconds_per_image)
