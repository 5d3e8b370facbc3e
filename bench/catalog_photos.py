"""Catalog-size photos: what each step around the model costs, the exact path against the cheap
one, and how far the cheap one moves the masks.

    .venv/bin/python bench/catalog_photos.py --megapixels 2 12

The bundled samples are upscaled (PIL Lanczos) to JPEGs (q90) of each size. Per photo, one
thread, best of ``--repeats`` (milliseconds):

- decode: ``decode_rgb`` (full pixels) vs ``--fast-decode``'s DCT-scaled decode;
- resize to 320x320 (PIL Lanczos, as rembg) from each decode;
- mask upscale: PIL Lanczos (rembg) vs OpenCV bicubic (the default);
- mask PNG: libpng through OpenCV (UP filter, zlib RLE, as maskray wrote masks before) vs
  maskray's writer (``operators/encode.py``); both lossless, so only time and size differ;
- cutout PNG (RGBA, full size): libpng through OpenCV at level 1 (as before) vs maskray's writer.

Agreement (the gate for a default: MAD <= 0.5 grey levels, IoU >= 0.995 at 128) of the full-size
masks against the exact path (full decode, Lanczos both ways), with ONNX Runtime fp32.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench import catalog_jpeg, sample_photos  # noqa: E402
from maskray.operators import agreement, decode, encode, postprocess, preprocess  # noqa: E402
from maskray.operators.engines import EngineSpec, open_engine  # noqa: E402
from maskray.pipeline.weights import default_model  # noqa: E402

LIBPNG_PARAMS = [
    cv2.IMWRITE_PNG_COMPRESSION,
    1,
    cv2.IMWRITE_PNG_FILTER,
    cv2.IMWRITE_PNG_FILTER_UP,
    cv2.IMWRITE_PNG_STRATEGY,
    cv2.IMWRITE_PNG_STRATEGY_RLE,
]


def best_ms(fn: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1000


def libpng(mask: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".png", mask, LIBPNG_PARAMS)
    assert ok
    return buf.tobytes()


def libpng_rgba(image: Image.Image) -> bytes:
    bgra = cv2.cvtColor(np.asarray(image), cv2.COLOR_RGBA2BGRA)
    ok, buf = cv2.imencode(".png", bgra, [cv2.IMWRITE_PNG_COMPRESSION, 1])
    assert ok
    return buf.tobytes()


def measure_photo(data: bytes, engine: Any, repeats: int) -> dict[str, float]:
    def small_mask(rgb: Image.Image) -> np.ndarray:
        return agreement.masks_of(engine, preprocess.normalise(preprocess.resize_for_model(rgb)))[0][0]

    full = decode.decode_rgb(data, 10**9)
    reduced, size = decode.decode_for_model(data, 10**9, reduce_to=preprocess.MODEL_SIZE)
    small_exact, small_fast = small_mask(full), small_mask(reduced)
    exact = postprocess.resize_mask(small_exact, size, "lanczos")
    cubic = postprocess.resize_mask(small_exact, size, "cubic")
    fast = postprocess.resize_mask(small_fast, size, "lanczos")
    png_before, png_now = libpng(cubic), encode.encode_mask_png(cubic, 1)
    for png in (png_before, png_now):
        assert np.array_equal(cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_UNCHANGED), cubic)
    cut = postprocess.cutout(full, cubic)
    cut_before, cut_now = libpng_rgba(cut), encode.encode_rgba_png(cut, 1)
    for png in (cut_before, cut_now):
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(png))), np.asarray(cut))

    return {
        "decode_ms": best_ms(lambda: decode.decode_rgb(data, 10**9), repeats),
        "decode_fast_ms": best_ms(
            lambda: decode.decode_for_model(data, 10**9, reduce_to=preprocess.MODEL_SIZE), repeats
        ),
        "resize_ms": best_ms(lambda: preprocess.resize_for_model(full), repeats),
        "resize_fast_ms": best_ms(lambda: preprocess.resize_for_model(reduced), repeats),
        "upscale_lanczos_ms": best_ms(lambda: postprocess.resize_mask(small_exact, size, "lanczos"), repeats),
        "upscale_cubic_ms": best_ms(lambda: postprocess.resize_mask(small_exact, size, "cubic"), repeats),
        "png_libpng_ms": best_ms(lambda: libpng(cubic), repeats),
        "png_maskray_ms": best_ms(lambda: encode.encode_mask_png(cubic, 1), repeats),
        "png_libpng_kib": len(png_before) / 1024,
        "png_maskray_kib": len(png_now) / 1024,
        "cutout_libpng_ms": best_ms(lambda: libpng_rgba(cut), repeats),
        "cutout_maskray_ms": best_ms(lambda: encode.encode_rgba_png(cut, 1), repeats),
        "cutout_libpng_kib": len(cut_before) / 1024,
        "cutout_maskray_kib": len(cut_now) / 1024,
        "cubic_mad": agreement.mad(exact, cubic),
        "cubic_iou": agreement.iou(exact, cubic),
        "fast_decode_mad": agreement.mad(exact, fast),
        "fast_decode_iou": agreement.iou(exact, fast),
    }


COLUMNS = [
    ("decode ms full / DCT-scaled", "decode_ms", "decode_fast_ms", ".1f"),
    ("resize to 320 ms from full / scaled", "resize_ms", "resize_fast_ms", ".1f"),
    ("mask upscale ms Lanczos / cubic", "upscale_lanczos_ms", "upscale_cubic_ms", ".1f"),
    ("mask PNG ms libpng / maskray", "png_libpng_ms", "png_maskray_ms", ".1f"),
    ("mask PNG KiB libpng / maskray", "png_libpng_kib", "png_maskray_kib", ".0f"),
    ("cutout PNG ms libpng / maskray", "cutout_libpng_ms", "cutout_maskray_ms", ".1f"),
    ("cutout PNG KiB libpng / maskray", "cutout_libpng_kib", "cutout_maskray_kib", ".0f"),
    ("cubic upscale MAD / IoU", "cubic_mad", "cubic_iou", ".3f"),
    ("fast decode MAD / IoU", "fast_decode_mad", "fast_decode_iou", ".3f"),
]


def table(results: dict[float, dict[str, dict[str, float]]]) -> str:
    lines = ["| photo | MP | " + " | ".join(c[0] for c in COLUMNS) + " |", "|---" * (len(COLUMNS) + 2) + "|"]
    for mp, photos in results.items():
        for name, r in photos.items():
            cells = [f"{r[a]:{f}} / {r[b]:{f}}" for _, a, b, f in COLUMNS]
            lines.append(f"| {name} | {mp:g} | " + " | ".join(cells) + " |")
        mean = {k: float(np.mean([r[k] for r in photos.values()])) for k in next(iter(photos.values()))}
        worst_iou = {k: min(r[k] for r in photos.values()) for k in ("cubic_iou", "fast_decode_iou")}
        worst_mad = {k: max(r[k] for r in photos.values()) for k in ("cubic_mad", "fast_decode_mad")}
        summary = {**mean, **worst_iou, **worst_mad}
        cells = [f"{summary[a]:{f}} / {summary[b]:{f}}" for _, a, b, f in COLUMNS]
        lines.append(f"| **mean (agreement: worst)** | {mp:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--megapixels", type=float, nargs="+", default=[2.0, 12.0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    cv2.setNumThreads(1)  # one thread, as in a decode or write task
    engine = open_engine(Path(default_model()).read_bytes(), EngineSpec())
    photos = sample_photos()
    results: dict[float, dict[str, dict[str, float]]] = {}
    for mp in args.megapixels:
        results[mp] = {p.name: measure_photo(catalog_jpeg(p, mp), engine, args.repeats) for p in photos}
    print(table(results))
    for mp, photos_ in results.items():
        for what in ("cubic", "fast_decode"):
            worst_mad = max(r[f"{what}_mad"] for r in photos_.values())
            worst_iou = min(r[f"{what}_iou"] for r in photos_.values())
            inside = worst_mad <= agreement.CHEAP_PATH_MAX_MAD and worst_iou >= agreement.CHEAP_PATH_MIN_IOU
            verdict = "inside" if inside else "OUTSIDE"
            print(f"{mp:g} MP {what}: worst MAD {worst_mad:.3f}, worst IoU {worst_iou:.4f}: {verdict} the gate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
