"""Resize to the model's input and normalise, exactly as rembg's U2Net-P session does.

Split in two so the expensive float tensor only exists inside the inference actor:
``resize_for_model`` (in decode tasks) yields a 320x320x3 uint8 array, a quarter of the
float32 size, and ``normalise`` (in the actor) turns it into the 1x3x320x320 float32 input.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

MODEL_SIZE = (320, 320)
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def resize_for_model(rgb: Image.Image, size: tuple[int, int] = MODEL_SIZE) -> np.ndarray:
    """PIL's antialiased Lanczos, as rembg; OpenCV's LANCZOS4 does not antialias on shrink."""
    return np.asarray(rgb.resize(size, Image.Resampling.LANCZOS), dtype=np.uint8)


def normalise(resized: np.ndarray) -> np.ndarray:
    """uint8 HxWx3 -> float32 1x3xHxW: divide by the image's max, then ImageNet mean/std.

    Computed in float64 and cast at the end, as rembg does, so the tensors are bit-identical.
    """
    peak = float(resized.max())
    scaled = resized / (peak if peak > 0 else 1.0)  # rembg divides by 0 on a black image
    chw = ((scaled - np.asarray(MEAN)) / np.asarray(STD)).transpose(2, 0, 1)
    return np.asarray(chw[np.newaxis], dtype=np.float32)
