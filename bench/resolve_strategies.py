"""Resolve time by shuffle strategy and plan size (why ``pipeline.plan.SMALL_PLAN_ROWS`` exists).

For each size, writes a list of that many URIs and resolves it on a local 2-CPU Ray in this
process, interleaving round by round: Ray Data's default shuffle (``shuffle_v2``) on the streamed
rows (the plan before the size switch), and the materialize-then-count plan with each strategy.
Prints seconds per round; read each size's columns side by side:

    .venv/bin/python bench/resolve_strategies.py --sizes 2 1000 5000 20000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

STRATEGIES = ("shuffle_v2", "sort_shuffle_pull_based")


def resolve_seconds(spec, strategy: str, streamed: bool) -> float:
    from ray.data.context import ShuffleStrategy

    from maskray.pipeline import plan

    t = time.perf_counter()
    ds = plan.raw_inputs(spec)
    if not streamed:
        ds = ds.materialize()
        ds.count()
    ds.context.shuffle_strategy = ShuffleStrategy(strategy)  # a dataset runs with its own context
    plan.decided_by_source(ds, spec, 4).materialize()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[2, 1000, 5000, 20000])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    from maskray.pipeline import execution, plan
    from maskray.pipeline.config import RunConfig

    contenders = [("shuffle_v2", True)] + [(s, False) for s in STRATEGIES]
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            listing = Path(tmp) / f"list{n}.txt"
            listing.write_text("\n".join(f"gs://shop/images/c{i % 97}/img{i:07d}.jpg" for i in range(n)) + "\n")
            out = str(Path(tmp) / "out")
            execution.configure_data_context(RunConfig(input=str(listing), output=out))
            spec = plan.check_input(str(listing), out, {})
            times: dict[str, list[float]] = {}
            for _ in range(args.rounds):
                for strategy, streamed in contenders:
                    name = strategy + (" (streamed)" if streamed else " (materialized, counted)")
                    times.setdefault(name, []).append(round(resolve_seconds(spec, strategy, streamed), 2))
            for name, secs in times.items():
                print(f"{n:>9} rows  {name:<45} s: {secs}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
