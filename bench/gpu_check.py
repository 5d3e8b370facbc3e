"""One-GPU check: mask a few thousand catalog-size photos with ``--device cuda`` and report img/s,
GPU and CPU utilisation, and agreement with the CPU (ONNX Runtime fp32) masks.

    bench/gpu_check.sh                # sets up where needed, then runs this
    python bench/gpu_check.py --images 3000 --engine torch

Steps: the engine alone (batch 1 / 64 / 256, strict fp32) and its agreement on the check photos;
then ``maskray run --device cuda`` on ``--images`` 2 MP JPEGs (48 distinct ones made from the
samples, hard-linked) while nvidia-smi and /proc/stat are sampled; then the full-size masks of the
48 distinct photos compared with the CPU path's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from maskray.operators import agreement  # noqa: E402
from maskray.operators.decode import decode_rgb  # noqa: E402
from maskray.operators.engines import EngineSpec, open_engine  # noqa: E402
from maskray.operators.postprocess import resize_mask  # noqa: E402
from maskray.operators.preprocess import normalise, resize_for_model  # noqa: E402
from maskray.operators.session import to_small_mask  # noqa: E402

MODEL = ROOT / "models" / "u2netp.onnx"
SAMPLES = sorted(p for p in (ROOT / "samples").iterdir() if p.suffix.lower() in (".jpg", ".png"))


def make_photos(folder: Path, n: int, size: tuple[int, int] = (1600, 1200)) -> list[Path]:
    """48 distinct 2 MP JPEGs (crops, flips, orientations of the samples), hard-linked up to ``n``."""
    folder.mkdir(parents=True, exist_ok=True)
    distinct = []
    for i, sample in enumerate(SAMPLES * 8):
        img = Image.open(sample).convert("RGB")
        w, h = img.size
        k = i // len(SAMPLES)
        img = img.crop((k * w // 40, k * h // 40, w - (7 - k) * w // 60, h - (7 - k) * h // 60))
        img = ImageOps.mirror(img) if k % 2 else img
        target = size if k % 3 else size[::-1]
        path = folder / f"d{i:03d}.jpg"
        img.resize(target, Image.LANCZOS).save(path, quality=90)
        distinct.append(path)
    for j in range(len(distinct), n):
        link = folder / f"p{j:05d}.jpg"
        if not link.exists():
            os.link(distinct[j % len(distinct)], link)
    return distinct


def engine_ceiling(name: str, model: bytes) -> dict:
    spec = EngineSpec(name=name, device="cuda")
    engine = open_engine(model, spec)
    tensors = agreement.check_tensors()
    cpu = open_engine(model, EngineSpec())
    reference, _ = agreement.masks_of(cpu, tensors)
    found = agreement.compare(reference, *agreement.masks_of(engine, tensors))
    out = {"engine": f"{spec.label} {engine.version}", "check": found.describe(), "passes": found.passes("fp32")}
    for batch in (1, 64, 256):
        x = np.concatenate([tensors] * (batch // len(tensors) + 1))[:batch]
        engine.infer(x)
        reps = max(2, 256 // batch)
        t0 = time.perf_counter()
        for _ in range(reps):
            engine.infer(x)  # returns host arrays: every call is synchronised
        out[f"img_s_batch_{batch}"] = round(batch * reps / (time.perf_counter() - t0), 1)
    return out


class Sampler:
    """GPU utilisation (nvidia-smi) and whole-machine CPU utilisation (/proc/stat), every 0.5 s."""

    def __init__(self) -> None:
        self.gpu: list[tuple[float, float]] = []
        self.cpu: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "500"],
            stdout=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self.read_gpu, daemon=True).start()
        threading.Thread(target=self.read_cpu, daemon=True).start()

    def read_gpu(self) -> None:
        for line in self.proc.stdout:
            try:
                self.gpu.append((time.time(), float(line.strip().split(",")[0])))
            except ValueError:
                continue

    def read_cpu(self) -> None:
        def snap():
            with open("/proc/stat") as fh:
                v = [int(x) for x in fh.readline().split()[1:]]
            return sum(v), v[3] + v[4]

        last = snap()
        while not self.stop.wait(0.5):
            now = snap()
            total, idle = now[0] - last[0], now[1] - last[1]
            if total:
                self.cpu.append((time.time(), 100.0 * (1 - idle / total)))
            last = now

    def close(self) -> None:
        self.stop.set()
        self.proc.terminate()

    @staticmethod
    def mean(samples: list[tuple[float, float]], start: float, end: float) -> float | None:
        vals = [v for t, v in samples if start <= t <= end]
        return round(sum(vals) / len(vals), 1) if vals else None


def cpu_masks(model: bytes, photos: list[Path]) -> dict[str, np.ndarray]:
    engine = open_engine(model, EngineSpec(threads=4))
    out = {}
    for p in photos:
        rgb = decode_rgb(p.read_bytes(), 10**9)
        small = to_small_mask(engine.infer(normalise(resize_for_model(rgb)))[0])
        out[p.stem] = resize_mask(small, rgb.size)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--engine", default="auto")
    ap.add_argument("--work", default="/tmp/maskray-gpu-check")
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--gpus-per-actor", type=float, default=None)
    args = ap.parse_args()
    work = Path(args.work)
    model = MODEL.read_bytes()
    results: dict = {
        "gpu": subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip(),
        "cpus": os.cpu_count(),
    }
    from maskray.pipeline.engine_choice import cuda_engines

    engines = cuda_engines()
    results["cuda_engines"] = engines
    name = args.engine if args.engine != "auto" else (engines or ["none"])[0]
    try:
        results["ceiling"] = engine_ceiling(name, model)
    except Exception as exc:  # noqa: BLE001 - report it; the pipeline would fail the same way
        import traceback

        results["ceiling"] = f"failed: {type(exc).__name__}: {exc}"
        print(json.dumps(results, indent=1), traceback.format_exc(), flush=True)
        return 1
    print(json.dumps(results, indent=1), flush=True)

    photos = make_photos(work / "in", args.images)
    out = work / "out"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    cmd = [
        sys.executable,
        "-m",
        "maskray.pipeline.cli",
        "run",
        "--input",
        str(work / "in"),
        "--output",
        str(out),
        "--device",
        "cuda",
        "--engine",
        name,
        "--no-progress",
    ]
    cmd += ["--batch-size", str(args.batch_size)] if args.batch_size else []
    cmd += ["--gpus-per-actor", str(args.gpus_per_actor)] if args.gpus_per_actor else []
    sampler = Sampler()
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    sampler.close()
    results["exit_code"] = proc.returncode
    if proc.returncode not in (0, 3):
        results["stderr_tail"] = proc.stderr[-3000:]
        print(json.dumps(results, indent=1))
        return 1
    summary = json.loads((out / "_summary.json").read_text())
    first = t0 + (summary["seconds_to_first_mask"] or 0)
    last = summary["last_row_finished_at"] or time.time()
    steady = summary["ok"] / (last - first) if last > first else None
    results["run"] = {
        "ok": summary["ok"],
        "failed": summary["failed"],
        "seconds": summary["seconds"],
        "img_s_end_to_end": summary["images_per_second"],
        "img_s_after_first_mask": round(steady, 1) if steady else None,
        "seconds_to_first_mask": summary["seconds_to_first_mask"],
        "pool_size": summary["cluster"]["pool_size"],
        "engine": summary["cluster"].get("engine"),
        "gpu_util_pct_mean": Sampler.mean(sampler.gpu, first, last),
        "cpu_util_pct_mean": Sampler.mean(sampler.cpu, first, last),
        "stage_seconds_total": summary["stage_seconds_total"],
    }
    reference = cpu_masks(model, photos)
    mads, ious = [], []
    for stem, ref in reference.items():
        got = np.asarray(Image.open(out / "masks" / f"{stem}.jpg.png"))
        mads.append(agreement.mad(got, ref))
        ious.append(agreement.iou(got, ref))
    results["agreement_vs_cpu"] = {"photos": len(mads), "max_mad": round(max(mads), 4), "min_iou": round(min(ious), 5)}
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
