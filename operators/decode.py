"""Decode encoded image bytes into an orientation-corrected RGB PIL image.

Input: the raw bytes of one file. Output: ``PIL.Image`` in mode ``RGB`` or an ``ImageError``
whose message is the one-line reason that goes into the manifest. Every guard runs on the
header, before any pixel is decoded, so a decompression bomb can never reach the decoder (Ray
would otherwise retry a worker-killing input forever).
"""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from maskray.operators.errors import one_line

# We enforce our own pixel cap from the header; PIL's own check would raise a different,
# less informative error at 2x its built-in limit.
Image.MAX_IMAGE_PIXELS = None

# Header-readable formats we accept; anything else PIL might identify (e.g. PDF/EPS) is refused.
SUPPORTED_FORMATS = frozenset({"JPEG", "PNG", "WEBP", "BMP", "TIFF", "GIF", "MPO"})


class ImageError(ValueError):
    """A per-image problem: ``kind`` is the manifest's ``error_kind`` (``decode``, ``too_large``, ...),
    and ``str(err)`` its one-line reason, e.g. ``decode: truncated image (...)``."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


def open_header(data: bytes, max_pixels: int) -> Image.Image:
    """Open lazily (header only) and refuse empty, unknown and oversized inputs."""
    if not data:
        raise ImageError("empty", "zero-byte file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            img = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise ImageError("not_an_image", "unrecognised image format") from None
    except Exception as exc:  # noqa: BLE001 - any header failure is this input's problem
        raise ImageError("decode", f"bad header ({one_line(exc, with_type=False)})") from None
    if img.format not in SUPPORTED_FORMATS:
        raise ImageError("unsupported_format", str(img.format))
    width, height = img.size
    if width <= 0 or height <= 0:
        raise ImageError("decode", f"invalid size {width}x{height}")
    if width * height > max_pixels:
        raise ImageError("too_large", f"{width}x{height} > max_pixels ({max_pixels})")
    return img


# EXIF orientations that swap width and height (transpose, rotations by 90 and 270 degrees).
_SWAPS_AXES = frozenset({5, 6, 7, 8})


def decode_for_model(
    data: bytes, max_pixels: int, reduce_to: tuple[int, int] | None = None
) -> tuple[Image.Image, tuple[int, int]]:
    """(RGB image, its full upright size). With ``reduce_to``, a JPEG is decoded at the smallest
    DCT scale (1/2, 1/4, 1/8) that keeps both sides at least that large (the README's "Catalog-size
    photos" gives what it saves)."""
    if reduce_to is None:
        rgb = decode_rgb(data, max_pixels)
        return rgb, rgb.size
    img = open_header(data, max_pixels)
    width, height = img.size
    try:
        if img.format == "JPEG":
            img.draft("RGB", reduce_to)
        img.load()
        if img.getexif().get(0x0112) in _SWAPS_AXES:
            width, height = height, width
        upright(img)
    except Exception as exc:  # noqa: BLE001
        raise ImageError("decode", _decode_reason(exc)) from None
    return to_rgb(img), (width, height)


def upright(img: Image.Image) -> None:
    """Apply the EXIF orientation in place: the default returns a whole-image copy even when there
    is nothing to turn, a cost that grows with the photo."""
    ImageOps.exif_transpose(img, in_place=True)


def to_rgb(img: Image.Image) -> Image.Image:
    """Convert any mode to RGB the way rembg does (``convert("RGB")``), except 16-bit grey.

    rembg's ``convert("RGB")`` clips 16-bit grey to 255 (an all-white picture); we scale it
    to 8 bits instead so such scans still get a real mask.
    """
    if img.mode.startswith("I") or img.mode == "F":
        grey = np.asarray(img, dtype=np.float64)
        if img.mode.startswith("I;16") or grey.max(initial=0) > 255:
            grey = grey / 257.0  # 65535 -> 255
        img = Image.fromarray(np.clip(np.rint(grey), 0, 255).astype(np.uint8), mode="L")
    return img if img.mode == "RGB" else img.convert("RGB")


def decode_rgb(data: bytes, max_pixels: int) -> Image.Image:
    """Bytes -> orientation-corrected RGB image (first frame for GIF/TIFF/WebP animations)."""
    img = open_header(data, max_pixels)
    try:
        img.seek(0)
        img.load()
        upright(img)
    except Exception as exc:  # noqa: BLE001
        raise ImageError("decode", _decode_reason(exc)) from None
    return to_rgb(img)


def _decode_reason(exc: Exception) -> str:
    text = one_line(exc, with_type=False)
    if "truncated" in text.lower() or isinstance(exc, EOFError):
        return f"truncated image ({text})"
    return text
