"""Opt-in experiment: int8 static quantisation (ONNX Runtime QDQ) of U2Net-P, calibrated on
real photos. Reports the speed-up over fp32 (model alone, one single-threaded session per CPU,
interleaved rounds) and mask agreement with fp32 on photos not used for calibration.

    .venv/bin/pip install onnx==1.23.2 && .venv/bin/python bench/int8.py

int8 only becomes a user-facing option if the agreement holds (IoU >= 0.98 on every photo).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.ort_options import measure  # noqa: E402
from operators import postprocess, preprocess, session  # noqa: E402
from operators.decode import decode_rgb  # noqa: E402
from pipeline.config import DEFAULT_MODEL  # noqa: E402

SAMPLES = sorted(p for p in (ROOT / "samples").iterdir() if p.suffix.lower() in (".jpg", ".png"))


def tensors_of(paths: list[Path], augment: bool = False) -> list[np.ndarray]:
    out = []
    for p in paths:
        rgb = decode_rgb(p.read_bytes(), 10**9)
        variants = [rgb, rgb.transpose(Image.FLIP_LEFT_RIGHT), rgb.rotate(10, expand=True)] if augment else [rgb]
        out += [preprocess.normalise(preprocess.resize_for_model(v)) for v in variants]
    return out


def quantise(fp32: Path, dest: Path, calibration: list[np.ndarray]) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(calibration)

        def get_next(self):
            t = next(self.it, None)
            return None if t is None else {"input.1": t}

    pre = dest.with_suffix(".pre.onnx")
    quant_pre_process(str(fp32), str(pre))
    quantize_static(str(pre), str(dest), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return dest


def mask(sess, path: Path) -> np.ndarray:
    rgb = decode_rgb(path.read_bytes(), 10**9)
    small = session.to_small_mask(session.run_model(sess, preprocess.normalise(preprocess.resize_for_model(rgb))))
    return postprocess.resize_mask(small, rgb.size)


def main() -> int:
    calib, held_out = SAMPLES[::2], SAMPLES[1::2]
    with tempfile.TemporaryDirectory() as tmp:
        int8_path = quantise(Path(DEFAULT_MODEL), Path(tmp) / "u2netp.int8.onnx", tensors_of(calib, augment=True))
        fp32_bytes, int8_bytes = Path(DEFAULT_MODEL).read_bytes(), int8_path.read_bytes()
    fp32, int8 = session.make_session(fp32_bytes), session.make_session(int8_bytes)
    print("| held-out photo | MAD (grey levels) | IoU@128 |")
    print("| --- | --- | --- |")
    ious = []
    for p in held_out:
        a, b = mask(fp32, p), mask(int8, p)
        mad = float(np.abs(a.astype(int) - b.astype(int)).mean())
        union = np.logical_or(a >= 128, b >= 128).sum()
        iou = float(np.logical_and(a >= 128, b >= 128).sum() / union) if union else 1.0
        ious.append(iou)
        print(f"| {p.name} | {mad:.2f} | {iou:.4f} |")
    tensors = tensors_of(SAMPLES) * 8
    speeds: dict[str, list[float]] = {"fp32": [], "int8": []}
    for _ in range(3):
        speeds["fp32"].append(measure(fp32_bytes, session.SessionOptions(), tensors, 2))
        speeds["int8"].append(measure(int8_bytes, session.SessionOptions(), tensors, 2))
    med = {k: statistics.median(v) for k, v in speeds.items()}
    for k, v in speeds.items():
        print(f"{k}: img/s min/median/max {min(v):.2f} / {med[k]:.2f} / {max(v):.2f}")
    print(f"int8 speed-up: {med['int8'] / med['fp32']:.2f}x; min IoU {min(ious):.4f} -> "
          f"{'agreement holds' if min(ious) >= 0.98 else 'agreement does NOT hold: not offered as an option'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
