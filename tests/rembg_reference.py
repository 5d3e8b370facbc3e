"""rembg's U2Net-P math written out independently (numpy + PIL), the reference masks are
compared against. Mirrors rembg's ``SimpleSession.predict`` and ``BaseSession.normalize``:
convert RGB, Lanczos to 320x320, /max, mean/std, output 0, min-max, ``astype(uint8)``,
Lanczos back to the image size; EXIF orientation applied first, as ``rembg.remove`` does.
"""

from __future__ import annotations

import io

import numpy as np
import onnxruntime as ort
from PIL import Image, ImageOps


def reference_mask(data: bytes, session: ort.InferenceSession) -> np.ndarray:
    img = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    im = img.convert("RGB").resize((320, 320), Image.LANCZOS)
    im_ary = np.array(im)
    im_ary = im_ary / np.max(im_ary)
    tmp = np.zeros((im_ary.shape[0], im_ary.shape[1], 3))
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    for c in range(3):
        tmp[:, :, c] = (im_ary[:, :, c] - mean[c]) / std[c]
    tensor = np.expand_dims(tmp.transpose((2, 0, 1)), 0).astype(np.float32)
    pred = session.run(None, {session.get_inputs()[0].name: tensor})[0][:, 0, :, :]
    ma, mi = np.max(pred), np.min(pred)
    pred = np.squeeze((pred - mi) / (ma - mi))
    mask = Image.fromarray((pred * 255).astype("uint8"), mode="L")
    return np.asarray(mask.resize(img.size, Image.LANCZOS))


def agreement(ours: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(mean absolute difference in grey levels, IoU of the masks thresholded at 128)."""
    mad = float(np.abs(ours.astype(np.int16) - ref.astype(np.int16)).mean())
    a, b = ours >= 128, ref >= 128
    union = np.logical_or(a, b).sum()
    iou = float(np.logical_and(a, b).sum() / union) if union else 1.0
    return mad, iou
