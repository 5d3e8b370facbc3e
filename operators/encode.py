"""Encode masks and cutouts as PNG bytes.

OpenCV's encoder is used because it is several times faster than PIL's at the same
compression level; PNG is lossless, so the level changes only size and time, never pixels.
"""

from __future__ import annotations

import cv2
import numpy as np
from PIL import Image

# Masks are smooth top to bottom and mostly runs of 0 or 255: the UP filter with zlib's RLE strategy
# encodes them several times faster than libpng's adaptive filters, and smaller (measured by
# `bench/catalog_photos.py`, figures in the README). Lossless either way: the pixels are the same.
MASK_PNG_PARAMS = [
    cv2.IMWRITE_PNG_FILTER,
    cv2.IMWRITE_PNG_FILTER_UP,
    cv2.IMWRITE_PNG_STRATEGY,
    cv2.IMWRITE_PNG_STRATEGY_RLE,
]


def encode_mask_png(mask: np.ndarray, level: int) -> bytes:
    """8-bit single-channel PNG."""
    ok, buf = cv2.imencode(
        ".png", np.ascontiguousarray(mask, dtype=np.uint8), [cv2.IMWRITE_PNG_COMPRESSION, level, *MASK_PNG_PARAMS]
    )
    if not ok:
        raise ValueError("encode: OpenCV could not encode the mask")
    return buf.tobytes()


def encode_rgba_png(image: Image.Image, level: int) -> bytes:
    """RGBA PNG; OpenCV wants BGRA channel order."""
    bgra = cv2.cvtColor(np.asarray(image.convert("RGBA")), cv2.COLOR_RGBA2BGRA)
    ok, buf = cv2.imencode(".png", bgra, [cv2.IMWRITE_PNG_COMPRESSION, level])
    if not ok:
        raise ValueError("encode: OpenCV could not encode the cutout")
    return buf.tobytes()
