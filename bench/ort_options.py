"""ONNX Runtime session options, measured side by side on the model alone (one process per
CPU, preprocessed tensors, as the ceiling), interleaved over rounds: what each option does.

    .venv/bin/python bench/ort_options.py [--images 60] [--rounds 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench import make_inputs  # noqa: E402
from maskray.operators import preprocess, session  # noqa: E402
from maskray.operators.decode import decode_rgb  # noqa: E402
from maskray.pipeline.weights import default_model  # noqa: E402

VARIANTS = {
    "default (all opts, arena, spin)": session.SessionOptions(),
    "graph opt: basic": session.SessionOptions(graph_optimization="basic"),
    "graph opt: disabled": session.SessionOptions(graph_optimization="disable"),
    "no memory arena": session.SessionOptions(enable_mem_arena=False),
    "no thread spinning": session.SessionOptions(allow_spinning=False),
}


def worker(model: bytes, opts: dict, tensors: np.ndarray, barrier, queue) -> None:
    sess = session.make_session(model, session.SessionOptions(**opts))
    session.run_model(sess, tensors[0])
    barrier.wait()
    t0 = time.perf_counter()
    for t in tensors:
        session.run_model(sess, t)
    queue.put(time.perf_counter() - t0)


def measure(model: bytes, opts: session.SessionOptions, tensors: list[np.ndarray], procs: int) -> float:
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(procs + 1), ctx.Queue()
    shares = [np.stack(tensors[i::procs]) for i in range(procs)]
    ps = [ctx.Process(target=worker, args=(model, asdict(opts), s, barrier, queue)) for s in shares]
    for p in ps:
        p.start()
    barrier.wait()
    t0 = time.perf_counter()
    for _ in ps:
        queue.get()
    wall = time.perf_counter() - t0
    for p in ps:
        p.join()
    return len(tensors) / wall


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--procs", type=int, default=mp.cpu_count())
    args = ap.parse_args()
    files = make_inputs(args.images, ROOT / "bench" / "results" / "work-ort" / "in")
    tensors = [preprocess.normalise(preprocess.resize_for_model(decode_rgb(f.read_bytes(), 10**9))) for f in files]
    model = Path(default_model()).read_bytes()
    results: dict[str, list[float]] = {k: [] for k in VARIANTS}
    for _ in range(args.rounds):
        for name, opts in VARIANTS.items():
            results[name].append(measure(model, opts, tensors, args.procs))
    base = statistics.median(results["default (all opts, arena, spin)"])
    print(
        f"| ORT option ({args.procs} procs x 1 thread, {args.images} images, {args.rounds} rounds) "
        "| img/s min / median / max | vs default |"
    )
    print("| --- | --- | --- |")
    for name, vals in results.items():
        print(
            f"| {name} | {min(vals):.2f} / {statistics.median(vals):.2f} / {max(vals):.2f} "
            f"| {statistics.median(vals) / base:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
