"""Engine shapes and batch sizes, measured side by side on the model alone: one process per CPU
(as the ceiling), each holding every variant and running them in turn on the same four
preprocessed images, step after step, so that each step pairs the variants under the same load.
A variant's speed is the median over steps of ONNX Runtime's time over its time.

    .venv/bin/python bench/engines.py [--images 64]

What it decides: how ``operators.engines`` calls OpenVINO (a static batch of one, looped) and
that ONNX Runtime on the CPU gets one image per call.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench import make_inputs  # noqa: E402
from maskray.operators import engines, preprocess  # noqa: E402
from maskray.operators.decode import decode_rgb  # noqa: E402
from maskray.pipeline.weights import default_model  # noqa: E402

REFERENCE = "ort, batch 1 (the ceiling)"
# name -> (engine, compiled batch: None = dynamic, images per call, precision)
Variant = tuple[str, int | None, int, str]
VARIANTS: dict[str, Variant] = {
    REFERENCE: ("ort", 1, 1, "fp32"),
    "openvino, dynamic batch, 1 per call": ("openvino", None, 1, "fp32"),
    "openvino, dynamic batch, 4 per call": ("openvino", None, 4, "fp32"),
    "openvino, static batch 1 (maskray)": ("openvino", 1, 1, "fp32"),
    "openvino, static batch 4": ("openvino", 4, 4, "fp32"),
}


def compile_whole_model_bf16(model: bytes) -> Any:
    """OpenVINO's own bf16: every op, by its precision hint (what maskray's bf16 does not do)."""
    core, net = engines.read_openvino(model)
    config = engines.openvino_config(engines.EngineSpec(name="openvino"))
    return core.compile_model(net, "CPU", {**config, "INFERENCE_PRECISION_HINT": "bf16"})


def runner(model: bytes, engine: str, batch: int | None, precision: str = "fp32"):
    """A function from an N x 3 x 320 x 320 batch to N maps, for one variant (``precision``
    ``bf16-whole``: OpenVINO's own whole-model bf16)."""
    if engine == "ort":
        return engines.open_engine(model, engines.EngineSpec(name=engine)).infer
    if precision == "bf16-whole":
        compiled = compile_whole_model_bf16(model)
    else:
        compiled = engines.compile_openvino(model, engines.EngineSpec(name=engine, precision=precision), batch)
    request = compiled.create_infer_request()
    return lambda x: request.infer({0: x})[0]


STEP = 4  # images per step: every variant runs the same four


def worker(model: bytes, tensors: np.ndarray, variants: dict[str, Variant], barrier, queue) -> None:
    runners = {
        name: (runner(model, engine, batch, precision), per_call)
        for name, (engine, batch, per_call, precision) in variants.items()
    }
    for infer, per_call in runners.values():
        infer(tensors[:per_call])  # first runs allocate
    barrier.wait()
    times: dict[str, list[float]] = {name: [] for name in runners}
    names = list(runners)
    for step, i in enumerate(range(0, len(tensors) - STEP + 1, STEP)):
        for name in names[step % len(names) :] + names[: step % len(names)]:  # rotate: no variant always first
            infer, per_call = runners[name]
            t0 = time.perf_counter()
            for j in range(i, i + STEP, per_call):
                infer(tensors[j : j + per_call])
            times[name].append((time.perf_counter() - t0) / STEP)
    queue.put(times)


def measure(
    model: bytes, tensors: list[np.ndarray], procs: int, variants: dict[str, Variant] = VARIANTS
) -> dict[str, list[float]]:
    """Seconds per image, per variant and step, from every process."""
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(procs + 1), ctx.Queue()
    shares = [np.stack(tensors[i::procs]) for i in range(procs)]
    ps = [ctx.Process(target=worker, args=(model, s, variants, barrier, queue)) for s in shares]
    for p in ps:
        p.start()
    barrier.wait()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in ps:
        for name, ts in queue.get().items():
            times[name] += ts
    for p in ps:
        p.join()
    return times


def speed_inputs(images: int) -> list[np.ndarray]:
    """``images`` real photos (the samples, repeated) as 3 x 320 x 320 model inputs."""
    files = make_inputs(images, ROOT / "bench" / "results" / "work-engines" / "in")
    return [preprocess.normalise(preprocess.resize_for_model(decode_rgb(f.read_bytes(), 10**9)))[0] for f in files]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=64, help="per process: images / processes, a multiple of 4")
    ap.add_argument("--procs", type=int, default=mp.cpu_count())
    args = ap.parse_args()
    if not engines.installed("openvino"):
        print("bench/engines.py: openvino is not installed (make setup installs it)", file=sys.stderr)
        return 2
    times = measure(Path(default_model()).read_bytes(), speed_inputs(args.images), args.procs)
    print_table(times, args.procs, args.images)
    return 0


def print_table(times: dict[str, list[float]], procs: int, images: int) -> None:
    steps = len(times[REFERENCE])
    print(
        f"| engine ({procs} procs x 1 thread, {images} images, {steps} paired steps of {STEP}) "
        "| ms per image, median | x ORT per step: q1 / median / q3 |"
    )
    print("| --- | --- | --- |")
    for name, ts in times.items():
        q1, med, q3 = statistics.quantiles([r / t for r, t in zip(times[REFERENCE], ts, strict=True)], n=4)
        print(f"| {name} | {1000 * statistics.median(ts):.0f} | {q1:.2f} / {med:.2f} / {q3:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
