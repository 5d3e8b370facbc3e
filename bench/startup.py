"""Start-up: Ray Data and the graph imported while ``ray.init`` runs (``pipeline/ray_connect.py``)
against the order before it, the imports first and then ``ray.init``. Every run is a fresh
process; each round runs both orders, alternating which goes first, so that each pair shares the
host's load of the moment.

    .venv/bin/python bench/startup.py [--rounds 12] [--first-mask-rounds 8]

Two measures: "imports + connect" (``ray_connect.start`` and, in the old order, the imports
before it), and the summary's seconds to the first mask of ``maskray run`` on the samples.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from maskray.pipeline.manifest import read_summary  # noqa: E402

DURING = "imports during ray.init"
FIRST = "imports, then ray.init"
SAMPLES = ROOT / "samples"

# One run in a fresh process: argv = imports first ("1" | "0"), measure ("connect" |
# "first-mask"), input, output.
CHILD = """
import importlib, sys, time
from maskray.pipeline import ray_connect
if sys.argv[1] == "1":
    during = ray_connect.start
    def imports_first(cfg):
        for name in ray_connect.RUN_MODULES:
            importlib.import_module(name)
        return during(cfg)
    ray_connect.start = imports_first
if sys.argv[2] == "connect":
    from maskray.pipeline.config import RunConfig
    t0 = time.monotonic()
    ray_connect.start(RunConfig(input=sys.argv[3], output=sys.argv[4]))
    print("seconds", time.monotonic() - t0)
else:
    from maskray.pipeline.cli import main
    sys.exit(main(["run", "--input", sys.argv[3], "--output", sys.argv[4], "--no-progress"]))
"""


def run_once(order: str, measure: str, work: Path) -> float:
    out = work / "out"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(int(order == FIRST)), measure, str(SAMPLES), str(out)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{order} / {measure} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    if measure == "connect":
        line = next(line for line in proc.stdout.splitlines() if line.startswith("seconds "))
        return float(line.split()[1])
    return float(read_summary(str(out), {})["seconds_to_first_mask"])


def rounds(measure: str, n: int, work: Path) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {DURING: [], FIRST: []}
    for i in range(n):
        for order in (DURING, FIRST) if i % 2 else (FIRST, DURING):
            times[order].append(run_once(order, measure, work))
    return times


def report(measure: str, times: dict[str, list[float]]) -> None:
    gains = [old - new for old, new in zip(times[FIRST], times[DURING], strict=True)]
    print(f"\n{measure}, {len(gains)} pairs (seconds)")
    for order, values in times.items():
        listed = " ".join(f"{v:.2f}" for v in sorted(values))
        print(f"  {order:26s} median {statistics.median(values):.2f}  sorted {listed}")
    faster = sum(g > 0 for g in gains)
    print(
        f"  faster with the imports during ray.init in {faster} of {len(gains)} pairs; "
        f"median pair gain {statistics.median(gains):.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12, help="pairs of 'imports + connect'")
    ap.add_argument("--first-mask-rounds", type=int, default=8, help="pairs of `maskray run` on the samples")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.rounds:
            report("imports + connect", rounds("connect", args.rounds, work))
        if args.first_mask_rounds:
            report("first mask, maskray run on the samples", rounds("first-mask", args.first_mask_rounds, work))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
