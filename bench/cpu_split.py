"""Where the CPU goes in steady state: run maskray once and split the machine's CPU time, over a
window after start-up, between the inference actors and everything else (driver, decode/write
workers, Ray Data's helper actors, Ray's own daemons). The gap between maskray's steady rate and
the model's ceiling is what the non-inference rows take from a small machine.

    .venv/bin/python bench/cpu_split.py [--images 120] [--skip-s 20] [--window-s 15]
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench import make_inputs  # noqa: E402

# First match wins; matched against the process's command line.
GROUPS = [
    ("inference actors", ("InferenceActor",)),
    ("maskray driver", ("bin/maskray",)),
    (
        "Ray Data helper actors",
        ("_StatsActor", "ActorLocationTracker", "AutoscalingCoordinator", "AutoscalingRequester"),
    ),
    ("decode/write workers (ray::IDLE between tasks)", ("ray::IDLE", "prepare_batch", "finish_batch", "MapBatches")),
    (
        "Ray daemons (raylet, GCS, agents, dashboard)",
        ("raylet", "gcs_server", "dashboard", "agent", "log_monitor", "monitor.py", "ray/_private"),
    ),
]


def group_of(cmdline: str) -> str:
    return next((g for g, keys in GROUPS if any(k in cmdline for k in keys)), "other (OS, this script)")


def snapshot() -> dict[int, tuple[str, float]]:
    out = {}
    for proc in psutil.process_iter(["pid", "cmdline", "name", "cpu_times"]):
        try:
            cpu = proc.info["cpu_times"]
            out[proc.info["pid"]] = (" ".join(proc.info["cmdline"] or []) or proc.info["name"], cpu.user + cpu.system)
        except (psutil.Error, TypeError):
            continue
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=120)
    ap.add_argument("--skip-s", type=float, default=20.0, help="seconds after launch before the window opens")
    ap.add_argument("--window-s", type=float, default=15.0)
    args = ap.parse_args()
    work = ROOT / "bench" / "results" / "work-cpu"
    files = make_inputs(args.images, work / "in")
    shutil.rmtree(work / "out", ignore_errors=True)
    cmd = [
        str(ROOT / ".venv" / "bin" / "maskray"),
        "run",
        "--input",
        str(files[0].parent),
        "--output",
        str(work / "out"),
        "--no-progress",
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", "disabled")),
    )
    time.sleep(args.skip_s)
    before, t0 = snapshot(), time.monotonic()
    time.sleep(args.window_s)
    after, window = snapshot(), time.monotonic() - t0
    still_running = proc.poll() is None
    proc.wait()
    if not still_running:
        print("the run ended inside the window: use more --images or a shorter --skip-s", file=sys.stderr)
        return 1
    spent: collections.Counter[str] = collections.Counter()
    for pid, (cmdline, cpu) in after.items():
        spent[group_of(cmdline)] += cpu - before.get(pid, (cmdline, 0.0))[1]
    cores = psutil.cpu_count()
    print(
        f"| where the CPU went ({window:.0f} s window, {args.skip_s:g} s after launch, {args.images} images) "
        f"| CPU s | share of {cores} CPUs |"
    )
    print("| --- | --- | --- |")
    for group, seconds in spent.most_common():
        print(f"| {group} | {seconds:.2f} | {seconds / (window * cores):.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
