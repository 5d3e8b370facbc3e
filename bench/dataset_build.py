"""What building the input dataset costs the driver, before any image is read: maskray's
``items_dataset`` (``from_blocks``, blocks built on the driver) against the earlier
``from_arrow`` on one table per batch (one Ray metadata task per table). Interleaved rounds on
one warm local Ray, so the only difference is the call itself.

    .venv/bin/python bench/dataset_build.py [--images 4000] [--rounds 3] [--batch-size 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import pyarrow as pa
import ray

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.graph import items_dataset  # noqa: E402


def from_arrow_per_batch(items: pa.Table, batch_size: int) -> ray.data.Dataset:
    """The replaced code, kept here only as the reference it is measured against."""
    return ray.data.from_arrow([items.slice(i, batch_size) for i in range(0, items.num_rows, batch_size)])


def timed(build, items: pa.Table, batch_size: int) -> float:
    t0 = time.perf_counter()
    ds = build(items, batch_size)
    ds.num_blocks()  # both are materialised datasets: this is metadata, not a read
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=4)
    args = ap.parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    items = pa.table({"source": [f"gs://shop/images/{i:07d}.jpg" for i in range(args.images)],
                      "key": [f"{i:07d}.jpg" for i in range(args.images)]})
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, configure_logging=False)
    try:
        timed(from_arrow_per_batch, items.slice(0, 64), args.batch_size)  # start the task workers first
        times: dict[str, list[float]] = {"from_arrow per batch": [], "items_dataset (from_blocks)": []}
        for _ in range(args.rounds):
            times["from_arrow per batch"].append(timed(from_arrow_per_batch, items, args.batch_size))
            times["items_dataset (from_blocks)"].append(timed(items_dataset, items, args.batch_size))
    finally:
        ray.shutdown()
    print(f"| building the dataset ({args.images} inputs, batch {args.batch_size}, {args.rounds} rounds) "
          "| seconds min / median / max |\n| --- | --- |")
    for name, ts in times.items():
        print(f"| {name} | {min(ts):.2f} / {statistics.median(ts):.2f} / {max(ts):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
