"""Encode masks and cutouts as PNG bytes. PNG is lossless: the encoder and its level change only
size and time, never pixels.

Masks are written by a small PNG writer (8-bit grey, the UP filter on every row, deflate by
ISA-L): libpng through OpenCV spends most of a catalog photo's encode in zlib, and ISA-L's
deflate is ~5x faster at a similar ratio (2 MP masks of the samples: 1.7 vs 8.7 ms, 96 vs 85 KiB;
12 MP: 19 vs 39 ms). Cutouts (RGBA) go through OpenCV, several times faster than PIL's encoder.
"""

from __future__ import annotations

import struct
import zlib

import cv2
import numpy as np
from isal import isal_zlib
from PIL import Image

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# ISA-L has levels 0-3 (all fast); above that, zlib's levels trade time for smaller files.
ISAL_MAX_LEVEL = 3
_FILTER_UP = 2  # PNG filter type: each byte minus the one above it (the first row: minus zero)


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(data, zlib.crc32(tag)))


def up_filtered(mask: np.ndarray) -> np.ndarray:
    """PNG scanlines of an 8-bit grey image with the UP filter: (h, 1 + w) bytes.

    Masks are smooth from row to row and mostly runs of 0 or 255, so the differences are mostly zero.
    """
    h, w = mask.shape
    lines = np.empty((h, w + 1), dtype=np.uint8)
    lines[:, 0] = _FILTER_UP
    lines[0, 1:] = mask[0]
    np.subtract(mask[1:], mask[:-1], out=lines[1:, 1:])  # uint8 arithmetic wraps modulo 256, as PNG's does
    return lines


def deflate(data: np.ndarray, level: int) -> bytes:
    """A zlib stream of ``data``'s bytes (its buffer is read in place, not copied)."""
    view = np.ascontiguousarray(data).data  # a memoryview: no copy
    if level <= ISAL_MAX_LEVEL:
        return bytes(isal_zlib.compress(view, level))
    return zlib.compress(view, level)


def encode_mask_png(mask: np.ndarray, level: int) -> bytes:
    """8-bit single-channel PNG; ``level`` 0-3 is ISA-L's deflate level, 4-9 zlib's."""
    mask = np.ascontiguousarray(mask, dtype=np.uint8)
    if mask.ndim != 2 or 0 in mask.shape:
        raise ValueError(f"encode: a mask must be a non-empty 2-D array, not shape {mask.shape}")
    h, w = mask.shape
    header = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)  # 8 bits, grey, deflate, adaptive filters, no interlace
    return b"".join(
        (
            PNG_SIGNATURE,
            _chunk(b"IHDR", header),
            _chunk(b"IDAT", deflate(up_filtered(mask), level)),
            _chunk(b"IEND", b""),
        )
    )


def encode_rgba_png(image: Image.Image, level: int) -> bytes:
    """RGBA PNG; OpenCV wants BGRA channel order."""
    bgra = cv2.cvtColor(np.asarray(image.convert("RGBA")), cv2.COLOR_RGBA2BGRA)
    ok, buf = cv2.imencode(".png", bgra, [cv2.IMWRITE_PNG_COMPRESSION, level])
    if not ok:
        raise ValueError("encode: OpenCV could not encode the cutout")
    return buf.tobytes()
