"""Opt-in experiment: int8 static quantisation (ONNX Runtime QDQ) of U2Net-P, calibrated on
real photos. Reports the speed-up over fp32 (model alone, one single-threaded session per CPU,
interleaved rounds) and mask agreement with fp32 on photos not used for calibration.

    make bench-int8        # or: .venv/bin/pip install -e '.[bench]' && .venv/bin/python bench/int8.py

Two int8 variants:
- ``all``: every Conv/Relu/Resize/Concat quantised (ORT's defaults, per-channel weights).
- ``guided``: the same, but nodes that touch a tensor whose calibrated range exceeds
  ``--float-range`` stay fp32, and so does the 1-channel side-output head. Why: U2Net-P's folded
  batch-norm leaves a few decoder tensors with ranges up to ~230 (a conv bias reaches 1361), so
  one uint8 scale per tensor wipes out the small-valued channels next to them; and the logits
  feeding the final sigmoid set the mask boundary. Only ~25 of ~370 nodes stay float.

Photos: the bundled samples, half for calibration (3 augmentations each) and half held out
(``validation``: used while choosing the variant), plus ``test``: photos nothing was tuned on
(more of scikit-image's sample data, fetched from its PyPI wheel, and matplotlib's
grace_hopper.jpg). int8 only becomes a user-facing option if IoU >= 0.98 on every one of them.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.ort_options import measure  # noqa: E402
from maskray.operators import postprocess, preprocess, session  # noqa: E402
from maskray.operators.decode import decode_rgb  # noqa: E402
from maskray.pipeline.weights import default_model  # noqa: E402

SAMPLES = sorted(p for p in (ROOT / "samples").iterdir() if p.suffix.lower() in (".jpg", ".png"))
# Real photos in scikit-image's wheel that are not among the samples (licences in its _fetchers.py).
SKIMAGE_WHEEL = "scikit-image==0.26.0"
SKIMAGE_TEST = [
    "cell.png",
    "coins.png",
    "horse.png",
    "hubble_deep_field.jpg",
    "ihc.png",
    "moon.png",
    "motorcycle_left.png",
    "retina.jpg",
]
CACHE = ROOT / "bench" / "results" / "int8-photos"
THRESHOLD = 0.98


def test_photos() -> list[Path]:
    """Unseen photos: extracted once from the scikit-image wheel (downloaded, not installed)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    if not all((CACHE / n).exists() for n in SKIMAGE_TEST):
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, SKIMAGE_WHEEL], check=True
            )
            with zipfile.ZipFile(next(Path(tmp).glob("*.whl"))) as whl:
                for n in SKIMAGE_TEST:
                    (CACHE / n).write_bytes(whl.read(f"skimage/data/{n}"))
    import matplotlib

    hopper = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    return sorted([CACHE / n for n in SKIMAGE_TEST] + ([hopper] if hopper.exists() else []))


def tensors_of(paths: list[Path], augment: bool = False) -> list[np.ndarray]:
    out = []
    for p in paths:
        rgb = decode_rgb(p.read_bytes(), 10**9)
        variants = [rgb, rgb.transpose(Image.FLIP_LEFT_RIGHT), rgb.rotate(10, expand=True)] if augment else [rgb]
        out += [preprocess.normalise(preprocess.resize_for_model(v)) for v in variants]
    return out


def prepare(fp32: Path, dest: Path) -> Path:
    """Opset 11 -> 13 (per-channel DequantizeLinear needs its `axis`), then ORT's pre-processing."""
    import onnx
    from onnx import version_converter
    from onnxruntime.quantization.shape_inference import quant_pre_process

    opset13 = dest.with_suffix(".opset13.onnx")
    onnx.save(version_converter.convert_version(onnx.load(str(fp32)), 13), str(opset13))
    quant_pre_process(str(opset13), str(dest))
    return dest


def nodes_kept_float(model_path: Path, calibration: list[np.ndarray], float_range: float) -> list[str]:
    """Nodes touching a tensor whose max |value| over the calibration set exceeds float_range, or
    a 1-channel tensor (the side outputs and the fused head before the sigmoid)."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(model_path))
    names = [o for n in model.graph.node for o in n.output]
    del model.graph.output[:]
    model.graph.output.extend([onnx.ValueInfoProto(name=n) for n in names])
    probe = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    peak: dict[str, float] = {}
    one_channel: set[str] = set()
    for t in calibration:
        for name, value in zip(names, probe.run(None, {"input.1": t}), strict=True):
            peak[name] = max(peak.get(name, 0.0), float(np.abs(value).max()) if value.size else 0.0)
            if value.ndim == 4 and value.shape[1] == 1:
                one_channel.add(name)
    keep = {n for n, v in peak.items() if v > float_range} | one_channel
    return sorted(n.name for n in model.graph.node if keep & (set(n.input) | set(n.output)))


def quantise(pre: Path, dest: Path, calibration: list[np.ndarray], exclude: list[str]) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(calibration)

        def get_next(self):
            t = next(self.it, None)
            return None if t is None else {"input.1": t}

    quantize_static(
        str(pre),
        str(dest),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        nodes_to_exclude=exclude,
    )
    return dest


def mask(sess, path: Path) -> np.ndarray:
    rgb = decode_rgb(path.read_bytes(), 10**9)
    small = session.to_small_mask(session.run_model(sess, preprocess.normalise(preprocess.resize_for_model(rgb))))
    return postprocess.resize_mask(small, rgb.size)


def agreement(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(mean absolute difference in grey levels, IoU of the masks thresholded at 128)."""
    mad = float(np.abs(a.astype(int) - b.astype(int)).mean())
    union = np.logical_or(a >= 128, b >= 128).sum()
    return mad, float(np.logical_and(a >= 128, b >= 128).sum() / union) if union else 1.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--float-range", type=float, default=100.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--procs", type=int, default=2)
    args = ap.parse_args()
    calib_paths, validation = SAMPLES[::2], SAMPLES[1::2]
    photos = [("validation", p) for p in validation] + [("test", p) for p in test_photos()]
    calibration = tensors_of(calib_paths, augment=True)
    models = {"fp32": Path(default_model()).read_bytes()}
    with tempfile.TemporaryDirectory() as tmp:
        pre = prepare(Path(default_model()), Path(tmp) / "pre.onnx")
        exclude = nodes_kept_float(pre, calibration, args.float_range)
        for name, excl in (("int8 all", []), ("int8 guided", exclude)):
            models[name] = quantise(pre, Path(tmp) / f"{name.replace(' ', '_')}.onnx", calibration, excl).read_bytes()
    print(f"guided: {len(exclude)} nodes kept fp32 (range > {args.float_range:g} or 1-channel): {', '.join(exclude)}")
    sessions = {k: session.make_session(v) for k, v in models.items()}
    variants = [k for k in models if k != "fp32"]
    print("| photo | set | fg % | " + " | ".join(f"{v} MAD / IoU" for v in variants) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in variants) + " |")
    worst = {v: 1.0 for v in variants}
    for split, p in photos:
        ref = mask(sessions["fp32"], p)
        cells = []
        for v in variants:
            mad, iou = agreement(ref, mask(sessions[v], p))
            worst[v] = min(worst[v], iou)
            cells.append(f"{mad:.2f} / {iou:.4f}")
        print(f"| {p.name} | {split} | {100 * (ref >= 128).mean():.1f} | " + " | ".join(cells) + " |")
    tensors = tensors_of(SAMPLES) * 8
    speeds: dict[str, list[float]] = {k: [] for k in models}
    for _ in range(args.rounds):  # interleaved, so machine noise shows as spread, not as a ratio
        for k, m in models.items():
            speeds[k].append(measure(m, session.SessionOptions(), tensors, args.procs))
    base = statistics.median(speeds["fp32"])
    print(
        f"\n| model ({args.procs} procs x 1 thread, {len(tensors)} tensors, {args.rounds} rounds) "
        "| img/s min / median / max | vs fp32 | min IoU | user-facing option? |"
    )
    print("| --- | --- | --- | --- | --- |")
    for k, v in speeds.items():
        iou = worst.get(k, 1.0)
        verdict = "(reference)" if k == "fp32" else ("yes" if iou >= THRESHOLD else f"no: IoU < {THRESHOLD}")
        print(
            f"| {k} | {min(v):.2f} / {statistics.median(v):.2f} / {max(v):.2f} | "
            f"{statistics.median(v) / base:.2f}x | {iou:.4f} | {verdict} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
