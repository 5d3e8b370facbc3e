"""Start-up, two changes against the code without them (``pipeline/ray_connect.py``):

1. Ray Data and the graph imported while ``ray.init`` runs, against the order before it (the
   imports first, then ``ray.init``). Measured as "imports + connect", and as the summary's
   seconds to the first mask of ``maskray run`` on the samples.
2. One more task worker started while the plan runs (``warm_task_worker``), against none.
   Measured as the seconds to the first mask on the samples (where it can only cost), and on
   ``--images`` catalog inputs (the samples repeated), where the run is stopped (SIGTERM, its
   documented stop) as soon as the first mask file appears: that time counts from the process's
   start, so it includes the CLI's imports (~0.5 s) that the summary's figure leaves out.

Every run is a fresh process; each round runs both variants, alternating which goes first, so
that each pair shares the host's load of the moment.

    .venv/bin/python bench/startup.py [--rounds 12] [--first-mask-rounds 8] [--warm-rounds 6]
        [--images 600]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from maskray.pipeline.manifest import read_summary  # noqa: E402

DURING = "imports during ray.init"
FIRST = "imports, then ray.init"
WARM = "warm task worker"
COLD = "no warm task worker"
SAMPLES = ROOT / "samples"

# One run in a fresh process: argv = variant, measure ("connect" | "first-mask"), input, output.
CHILD = f"""
import importlib, sys, time
from maskray.pipeline import ray_connect
variant = sys.argv[1]
if variant == {FIRST!r}:
    during = ray_connect.start
    def imports_first(cfg):
        for name in ray_connect.RUN_MODULES:
            importlib.import_module(name)
        return during(cfg)
    ray_connect.start = imports_first
elif variant == {COLD!r}:
    ray_connect.warm_task_worker = lambda: None
if sys.argv[2] == "connect":
    from maskray.pipeline.config import RunConfig
    t0 = time.monotonic()
    ray_connect.start(RunConfig(input=sys.argv[3], output=sys.argv[4]))
    print("seconds", time.monotonic() - t0)
else:
    from maskray.pipeline.cli import main
    sys.exit(main(["run", "--input", sys.argv[3], "--output", sys.argv[4], "--no-progress"]))
"""

# A run stopped at its first mask: how long it may take to drain and exit before it is killed.
STOP_WAIT_S = 60


@dataclass(frozen=True)
class Comparison:
    new: str
    old: str
    measure: str  # "connect", "first-mask" (the summary's) or "first-mask-file" (stopped there)
    title: str


def child(variant: str, measure: str, inputs: Path, out: Path) -> list[str]:
    return [sys.executable, "-c", CHILD, variant, measure, str(inputs), str(out)]


def run_once(variant: str, measure: str, inputs: Path, work: Path) -> float:
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    if measure == "first-mask-file":
        return first_mask_file(variant, inputs, out)
    proc = subprocess.run(child(variant, measure, inputs, out), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{variant} / {measure} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    if measure == "connect":
        line = next(line for line in proc.stdout.splitlines() if line.startswith("seconds "))
        return float(line.split()[1])
    return float(read_summary(str(out), {})["seconds_to_first_mask"])


def first_mask_file(variant: str, inputs: Path, out: Path) -> float:
    """Seconds from the process's start to its first mask file; then the run is stopped."""
    masks = out / "masks"
    log = out.parent / "first-mask-run.log"
    with log.open("w") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            child(variant, "first-mask", inputs, out), stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
        )
        while not (masks.is_dir() and any(p.suffix == ".png" for p in masks.iterdir())):
            if proc.poll() is not None:
                raise RuntimeError(f"{variant}: exited {proc.returncode} before any mask:\n{log.read_text()[-3000:]}")
            time.sleep(0.02)
        seconds = time.monotonic() - t0
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return seconds


def rounds(c: Comparison, n: int, inputs: Path, work: Path) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {c.new: [], c.old: []}
    for i in range(n):
        for variant in (c.new, c.old) if i % 2 else (c.old, c.new):
            times[variant].append(run_once(variant, c.measure, inputs, work))
    return times


def report(c: Comparison, times: dict[str, list[float]]) -> None:
    gains = [old - new for old, new in zip(times[c.old], times[c.new], strict=True)]
    print(f"\n{c.title}, {len(gains)} pairs (seconds)")
    for variant, values in times.items():
        listed = " ".join(f"{v:.2f}" for v in sorted(values))
        print(f"  {variant:26s} median {statistics.median(values):.2f}  sorted {listed}")
    faster = sum(g > 0 for g in gains)
    gain = statistics.median(gains)
    print(f"  faster with the {c.new} in {faster} of {len(gains)} pairs; median pair gain {gain:.2f}")


def catalog(n: int, work: Path) -> Path:
    from bench.bench import make_inputs

    dest = work / f"catalog-{n}"
    make_inputs(n, dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12, help="pairs of 'imports + connect'")
    ap.add_argument("--first-mask-rounds", type=int, default=8, help="pairs of import orders, first mask, samples")
    ap.add_argument("--warm-rounds", type=int, default=6, help="pairs of warm task worker or not, on each input")
    ap.add_argument("--images", type=int, default=600, help="catalog inputs for the warm worker's pairs")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        todo = [
            (args.rounds, Comparison(DURING, FIRST, "connect", "imports + connect"), SAMPLES),
            (
                args.first_mask_rounds,
                Comparison(DURING, FIRST, "first-mask", "first mask, maskray run on the samples"),
                SAMPLES,
            ),
            (args.warm_rounds, Comparison(WARM, COLD, "first-mask", "first mask, maskray run on the samples"), SAMPLES),
        ]
        for n, comparison, inputs in todo:
            if n:
                report(comparison, rounds(comparison, n, inputs, work))
        if args.warm_rounds and args.images:
            warm = Comparison(
                WARM, COLD, "first-mask-file", f"first mask file from the process's start, {args.images} images"
            )
            report(warm, rounds(warm, args.warm_rounds, catalog(args.images, work), work))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
