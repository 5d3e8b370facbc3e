"""Driver memory of a planned catalog by how its inputs are blocked (why ``pipeline.graph`` caps
the input blocks by the cluster's decode slots and re-blocks with a streaming repartition).

Plans a list file on a local 2-CPU Ray in this process, then re-blocks the same inputs three
ways, printing this process's RSS after each (it only grows: read the increments):

    .venv/bin/python bench/plan_memory.py LIST.txt [--blocks 2000]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("list_file")
    ap.add_argument("--blocks", type=int, default=2000)
    args = ap.parse_args()
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    from maskray.pipeline import execution, plan
    from maskray.pipeline.config import resolve_config
    from maskray.pipeline.graph import split_decisions

    cfg = resolve_config({"input": args.list_file, "output": "/tmp/maskray-plan-memory", "progress": False}, environ={})
    execution.configure_data_context(cfg)
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    spec = plan.check_input(cfg.input, cfg.output, {})
    resolved = execution.plan_run(cfg, spec, "fp", 2.0)
    n = resolved.count()
    todo = split_decisions(resolved)[0].materialize()
    print(f"planned {n} inputs in {resolved.num_blocks()} blocks: RSS {rss_mb():.0f} MB")
    before = rss_mb()
    streamed = todo.repartition(target_num_rows_per_block=-(-n // args.blocks)).materialize()
    print(f"streaming repartition to {streamed.num_blocks()} blocks: +{rss_mb() - before:.0f} MB")
    before = rss_mb()
    split = todo.repartition(args.blocks).materialize()
    print(f"split repartition to {split.num_blocks()} blocks: +{rss_mb() - before:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
