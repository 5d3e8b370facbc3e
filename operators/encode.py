"""Encode masks and cutouts as PNG bytes. PNG is lossless: the encoder and its level change only
size and time, never pixels.

Masks and cutouts are written by a small PNG writer (8-bit grey or RGBA, the UP filter on every
row, deflate by ISA-L): libpng through OpenCV spends most of a catalog photo's encode in zlib, and
ISA-L's deflate is several times faster, for slightly larger masks and smaller cutouts
(`bench/catalog_photos.py`, figures in the README).
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
from isal import isal_zlib
from PIL import Image

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# ISA-L has levels 0-3 (all fast); above that, zlib's levels trade time for smaller files.
ISAL_MAX_LEVEL = 3
_FILTER_UP = 2  # PNG filter type: each byte minus the one above it (the first row: minus zero)


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(data, zlib.crc32(tag)))


def up_filtered(rows: np.ndarray) -> np.ndarray:
    """PNG scanlines with the UP filter from (h, row bytes) pixels: (h, 1 + row bytes).

    Masks are smooth from row to row and mostly runs of 0 or 255, and cutouts are mostly the
    transparent background, so the differences are mostly zero.
    """
    h, w = rows.shape
    lines = np.empty((h, w + 1), dtype=np.uint8)
    lines[:, 0] = _FILTER_UP
    lines[0, 1:] = rows[0]
    np.subtract(rows[1:], rows[:-1], out=lines[1:, 1:])  # uint8 arithmetic wraps modulo 256, as PNG's does
    return lines


def deflate(data: np.ndarray, level: int) -> bytes:
    """A zlib stream of ``data``'s bytes (its buffer is read in place, not copied)."""
    view = np.ascontiguousarray(data).data  # a memoryview: no copy
    if level <= ISAL_MAX_LEVEL:
        return isal_zlib.compress(view, level)
    return zlib.compress(view, level)


# PNG colour types by channels per pixel: grey, RGBA.
_COLOUR_TYPE = {1: 0, 4: 6}


def encode_png(pixels: np.ndarray, level: int) -> bytes:
    """An 8-bit PNG of a 2-D grey array or an HxWx4 RGBA array."""
    pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
    channels = 1 if pixels.ndim == 2 else pixels.shape[-1] if pixels.ndim == 3 else 0
    if channels not in _COLOUR_TYPE or 0 in pixels.shape:
        raise ValueError(f"encode: expected a non-empty grey (HxW) or RGBA (HxWx4) image, not shape {pixels.shape}")
    h, w = pixels.shape[:2]
    header = struct.pack(">IIBBBBB", w, h, 8, _COLOUR_TYPE[channels], 0, 0, 0)  # deflate, filters, no interlace
    return b"".join(
        (
            PNG_SIGNATURE,
            _chunk(b"IHDR", header),
            # UP works byte by byte against the byte above, whatever the pixel's size.
            _chunk(b"IDAT", deflate(up_filtered(pixels.reshape(h, w * channels)), level)),
            _chunk(b"IEND", b""),
        )
    )


def encode_mask_png(mask: np.ndarray, level: int) -> bytes:
    """8-bit single-channel PNG; ``level`` 0-3 is ISA-L's deflate level, 4-9 zlib's."""
    if np.ndim(mask) != 2:
        raise ValueError(f"encode: a mask must be a 2-D array, not shape {np.shape(mask)}")
    return encode_png(mask, level)


def encode_rgba_png(image: Image.Image, level: int) -> bytes:
    """RGBA PNG (cutouts)."""
    return encode_png(np.asarray(image.convert("RGBA")), level)
