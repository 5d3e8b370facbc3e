"""Turn the model's 320x320 mask into the final mask and cutout, as rembg does.

Input: the small uint8 mask and the image size (plus the RGB image for cutouts). Output: a
uint8 mask of the image's size, and optionally an RGBA cutout.
"""

from __future__ import annotations

import cv2
import numpy as np
from PIL import Image

# rembg's -ppm kernel: getStructuringElement(MORPH_ELLIPSE, (3, 3)) is a 3x3 cross.
_PPM_KERNEL = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (3, 3))


MASK_RESIZES = ("cubic", "lanczos")


def resize_mask(small: np.ndarray, size: tuple[int, int], method: str = "lanczos") -> np.ndarray:
    """320x320 -> (width, height). ``lanczos``: PIL's, exactly as rembg. ``cubic``: OpenCV's bicubic,
    several times cheaper at 12 MP and within the agreement gate of the exact path on the samples
    upscaled to 12 MP (`bench/catalog_photos.py`; figures in the README)."""
    if method == "cubic":
        return cv2.resize(small, size, interpolation=cv2.INTER_CUBIC)
    return np.asarray(Image.fromarray(small, mode="L").resize(size, Image.Resampling.LANCZOS))


def post_process_mask(mask: np.ndarray) -> np.ndarray:
    """rembg's ``post_process``: opening with a 3x3 cross, Gaussian sigma=2, threshold at 127."""
    opened = cv2.morphologyEx(mask, cv2.MORPH_OPEN, _PPM_KERNEL)
    blurred = cv2.GaussianBlur(opened, (5, 5), sigmaX=2, sigmaY=2, borderType=cv2.BORDER_DEFAULT)
    return np.where(blurred < 127, 0, 255).astype(np.uint8)


def cutout(rgb: Image.Image, mask: np.ndarray, bgcolor: tuple[int, int, int, int] | None = None) -> Image.Image:
    """rembg's ``naive_cutout`` (RGB scaled by the mask, alpha = mask), then optional bgcolor."""
    alpha = Image.fromarray(mask, mode="L")
    out = Image.composite(rgb.convert("RGBA"), Image.new("RGBA", rgb.size, 0), alpha)
    if bgcolor is None:
        return out
    background = Image.new("RGBA", rgb.size, tuple(bgcolor))
    background.paste(out, mask=out)
    return background
