"""Small real test artefacts made from the bundled photos: every format and every bad kind."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
PHOTOS = sorted(p for p in SAMPLES.iterdir() if p.suffix.lower() in (".jpg", ".png"))


def photo(name: str = "chelsea.jpg") -> Image.Image:
    return Image.open(SAMPLES / name)


def encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height, with a tiny body: a decompression bomb's header."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def exif_rotated_jpeg() -> bytes:
    """The cat stored sideways with EXIF orientation 6 (display rotated 90 degrees clockwise)."""
    img = photo().convert("RGB").transpose(Image.ROTATE_90)
    exif = Image.Exif()
    exif[0x0112] = 6
    return encode(img, "JPEG", quality=90, exif=exif.tobytes())


def sixteen_bit_grey_png() -> bytes:
    grey = np.asarray(photo("camera.png").convert("L"), dtype=np.uint16) * 257
    return encode(Image.fromarray(grey), "PNG")


def good_variants() -> dict[str, bytes]:
    """Valid inputs in every supported mode and container."""
    cat = photo().convert("RGB")
    rgba = cat.copy()
    rgba.putalpha(Image.new("L", cat.size, 200))
    return {
        "variants/cmyk.jpg": encode(cat.convert("CMYK"), "JPEG", quality=90),
        "variants/rgba.png": encode(rgba, "PNG"),
        "variants/palette.gif": encode(cat.convert("P", palette=Image.ADAPTIVE), "GIF"),
        "variants/grey16.png": sixteen_bit_grey_png(),
        "variants/photo.webp": encode(cat, "WEBP", quality=90),
        "variants/photo.bmp": encode(cat, "BMP"),
        "variants/photo.tiff": encode(cat, "TIFF"),
        "variants/rotated.jpg": exif_rotated_jpeg(),
        "variants/UPPER.JPEG": encode(cat, "JPEG", quality=85),
    }


def bad_inputs() -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, expected reason prefix)."""
    jpeg = (SAMPLES / "coffee.jpg").read_bytes()
    return {
        "bad/truncated.jpg": (jpeg[: len(jpeg) // 3], "decode: truncated"),
        "bad/empty.jpg": (b"", "empty"),
        "bad/not-an-image.png": (b"this is a text file, not a picture\n" * 10, "not_an_image"),
        "bad/huge.png": (png_header_only(30000, 30000), "too_large: 30000x30000"),
    }
