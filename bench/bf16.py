"""bf16 on CPUs with bf16 hardware: maskray's (the heaviest convolutions only) against OpenVINO's
whole-model bf16, for mask agreement per photo and for speed beside ONNX Runtime fp32.

    .venv/bin/python bench/bf16.py [--images 96]

Agreement: each photo's 320x320 mask (what the agreement gate compares) against ONNX Runtime
fp32's, as MAD in grey levels and IoU at 128, for the photo and four variants of it (mirrored,
turned 10 degrees, cropped to its left and top three quarters); a row shows its worst variant.
Photos: the samples (the gate's three check photos are among them) and ``test``: photos nothing
was tuned on (bench/int8.py's scikit-image photos and matplotlib's grace_hopper.jpg). bf16 is a
user option only at IoU >= 0.98 on every photo with a foreground. Each row names its worst variant
and that mask's foreground in pixels (of 102,400): on a near-empty mask one pixel moves IoU by
whole percents.

Speed: bench/engines.py's method (one process per CPU, every variant on the same four images in
turn, step after step; x ORT is ONNX Runtime's time over the variant's, per step).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import engines as engine_bench  # noqa: E402
from bench.int8 import SAMPLES, test_photos  # noqa: E402
from maskray.operators import agreement, engines, preprocess  # noqa: E402
from maskray.operators.decode import decode_rgb  # noqa: E402
from maskray.operators.session import to_small_mask  # noqa: E402
from maskray.pipeline.sysinfo import NO_BF16, has_bf16_hardware  # noqa: E402
from maskray.pipeline.weights import default_model  # noqa: E402

MASKRAY_BF16 = "openvino bf16, heaviest convolutions (maskray --precision bf16)"
WHOLE_BF16 = "openvino bf16, whole model (OpenVINO's hint)"
SPEED_VARIANTS: dict[str, engine_bench.Variant] = {
    engine_bench.REFERENCE: ("ort", 1, 1, "fp32"),
    "openvino fp32 (maskray's default)": ("openvino", 1, 1, "fp32"),
    MASKRAY_BF16: ("openvino", 1, 1, "bf16"),
    WHOLE_BF16: ("openvino", 1, 1, "bf16-whole"),
}


def variants(rgb: Image.Image) -> dict[str, Image.Image]:
    w, h = rgb.size
    return {
        "photo": rgb,
        "mirrored": rgb.transpose(Image.Transpose.FLIP_LEFT_RIGHT),
        "turned": rgb.rotate(10, expand=True, fillcolor=(255, 255, 255)),
        "left": rgb.crop((0, 0, w * 3 // 4, h)),
        "top": rgb.crop((0, 0, w, h * 3 // 4)),
    }


@dataclass
class Worst:
    """A photo's worst variant for one contender, and that variant's foreground in pixels: IoU over a
    near-empty mask moves by whole percents for one pixel."""

    mad: float = 0.0
    iou: float = 1.0
    variant: str = ""
    foreground: int = 0

    def add(self, variant: str, mad: float, iou: float, foreground: int) -> None:
        self.mad = max(self.mad, mad)
        if iou < self.iou:
            self.iou, self.variant, self.foreground = iou, variant, foreground

    def cell(self) -> str:
        where = f"{self.variant}, {self.foreground} px" if self.variant else "all equal"
        return f"{self.mad:.2f} / {self.iou:.4f} ({where})"


def agreement_rows(model: bytes) -> list[tuple[str, str, float, dict[str, Worst]]]:
    """(photo, set, foreground % of the photo's reference mask, {contender: its worst variant})."""
    ref = engines.open_engine(model, engines.EngineSpec(name="ort")).infer
    contenders = {
        MASKRAY_BF16: engines.open_engine(model, engines.EngineSpec(name="openvino", precision="bf16")).infer,
        WHOLE_BF16: engine_bench.runner(model, "openvino", 1, "bf16-whole"),
    }
    rows = []
    photos = [(p, "sample") for p in SAMPLES] + [(p, "test") for p in test_photos()]
    for path, split in photos:
        rgb = decode_rgb(path.read_bytes(), 10**9)
        views = {k: preprocess.normalise(preprocess.resize_for_model(v)) for k, v in variants(rgb).items()}
        reference = {k: to_small_mask(ref(t)[0]) for k, t in views.items()}
        foreground = {k: int((mask >= 128).sum()) for k, mask in reference.items()}
        cells = {name: Worst() for name in contenders}
        for name, infer in contenders.items():
            for k, t in views.items():
                out = np.asarray(infer(t))  # N x 320 x 320 from an engine, N x 1 x 320 x 320 from a request
                got = to_small_mask(out.reshape(-1, *out.shape[-2:])[0])
                cells[name].add(k, agreement.mad(reference[k], got), agreement.iou(reference[k], got), foreground[k])
        rows.append((path.name, split, 100 * foreground["photo"] / reference["photo"].size, cells))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=96, help="for the speed table: a multiple of 4 x processes")
    ap.add_argument("--procs", type=int, default=mp.cpu_count())
    args = ap.parse_args()
    if not has_bf16_hardware():
        print(f"bench/bf16.py: {NO_BF16}; bf16 would be emulated (~20x slower)", file=sys.stderr)
        return 2
    model = Path(default_model()).read_bytes()
    rows = agreement_rows(model)
    names = [MASKRAY_BF16, WHOLE_BF16]
    print(
        "| photo | set | fg % | "
        + " | ".join(f"{n}: worst MAD / IoU (variant, its foreground pixels)" for n in names)
        + " |"
    )
    print("| --- | --- | --- | " + " | ".join("---" for _ in names) + " |")
    for photo, split, fg, cells in rows:
        print(f"| {photo} | {split} | {fg:.1f} | " + " | ".join(cells[n].cell() for n in names) + " |")
    for n in names:
        for label, subset in (("the samples", "sample"), ("every photo", None)):
            worst = min(c[n].iou for _, split, _, c in rows if subset in (None, split))
            verdict = "passes" if worst >= agreement.REDUCED_MIN_IOU else "fails"
            print(f"{n}: min IoU {worst:.4f} over {label} and their variants: {verdict} the bf16 gate")
    print()
    times = engine_bench.measure(model, engine_bench.speed_inputs(args.images), args.procs, SPEED_VARIANTS)
    engine_bench.print_table(times, args.procs, args.images)
    return 0


if __name__ == "__main__":
    sys.exit(main())
