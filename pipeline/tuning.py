"""Actor-pool tuning sweeps for the notebook: run the real pipeline on a sample per setting.

One factor at a time around the defaults (a full grid explodes): pool size, ONNX threads per
actor, CPU reservation per actor and batch size. Each trial is a real ``maskray run`` (same
code path as the CLI) on the same sample, with ``--overwrite`` into its own output folder.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import yaml

from maskray.operators import storage
from maskray.pipeline import sizing
from maskray.pipeline.config import RunConfig, resolve_config
from maskray.pipeline.manifest import read_manifest
from maskray.pipeline.plan import check_input, raw_inputs
from maskray.pipeline.sizing import Reservations

STAGES = ("read", "decode", "preprocess", "infer", "postprocess", "encode", "write")


@dataclass
class Trial:
    factor: str
    value: Any
    settings: dict[str, Any]


def sample_inputs(input_uri: str, sample_size: int, dest: Path, storage_options: dict | None = None) -> tuple[str, int]:
    """Copy the first ``sample_size`` images of the input into a local folder (a fixed sample).
    Returns the folder and how many it holds (the input may have fewer than ``sample_size``)."""
    opts = storage_options or {}
    spec = check_input(input_uri, str(dest.parent / "unused-output"), opts)
    # Planned on the cluster like a run's inputs, and only the first `sample_size` images taken.
    images = raw_inputs(spec).filter(expr="ignored == 0").limit(sample_size).take_all()
    dest.mkdir(parents=True, exist_ok=True)
    for i, source in enumerate(r["source"] for r in images):
        name = f"{i:05d}-{Path(storage.strip_protocol(source)).name}"
        (dest / name).write_bytes(storage.read_bytes(source, opts))
    return str(dest), len(images)


def plan(pool_sizes, threads_per_actor, cpus_per_actor, batch_sizes, cluster_cpus: float) -> list[Trial]:
    defaults = resolve_config({"input": "-", "output": "-"}, environ={})  # a run's own defaults
    base = {
        "pool_size": max(1, int(cluster_cpus)),
        "intra_op_threads": defaults.intra_op_threads,
        "cpus_per_actor": defaults.cpus_per_actor,
        "batch_size": defaults.batch_size,
    }
    trials = [Trial("pool_size", p, {**base, "pool_size": p}) for p in pool_sizes]
    # More threads per session means fewer sessions for the same cores.
    trials += [
        Trial("threads_per_actor", t, {**base, "intra_op_threads": t, "pool_size": max(1, int(cluster_cpus) // t)})
        for t in threads_per_actor
    ]
    trials += [Trial("cpus_per_actor", c, {**base, "cpus_per_actor": c}) for c in cpus_per_actor]
    trials += [Trial("batch_size", b, {**base, "batch_size": b}) for b in batch_sizes]
    return trials


def fits(trial: Trial, cluster_cpus: float, can_grow: bool) -> bool:
    """The run's own fit check on the trial's config (a cluster that can grow fits anything)."""
    cfg = resolve_config({"input": "-", "output": "-", **trial.settings}, environ={})
    return can_grow or sizing.fits(trial.settings["pool_size"], Reservations.of(cfg), cluster_cpus)


class _RayMemory:
    """Peak summed RSS of this machine's Ray worker processes during a trial."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            total = 0
            for p in psutil.process_iter(["name", "memory_info"]):
                name = p.info["name"] or ""
                if name.startswith("ray::") and p.info["memory_info"]:
                    total += p.info["memory_info"].rss
            self.peak = max(self.peak, total)

    def __enter__(self) -> _RayMemory:
        self._t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._t.join()


def run_trial(trial: Trial, sample_dir: str, out_root: Path, model: str | None = None) -> dict[str, Any]:
    from maskray.pipeline.run import execute

    out = out_root / f"{trial.factor}-{trial.value}"
    flags = {"input": sample_dir, "output": str(out), "overwrite": True, "progress": False, **trial.settings}
    if model:
        flags["model"] = model
    cfg = resolve_config(flags, environ={})
    with _RayMemory() as mem:
        result = execute(cfg)
    rows = read_manifest(str(out), result.summary, {}).to_pandas()
    ok = rows[rows.status == "ok"].sort_values("finished_at")
    k = min(2, max(len(ok) - 2, 0))
    span = float(ok.finished_at.iloc[-1] - ok.finished_at.iloc[k]) if len(ok) > 2 else 0.0
    record = {
        "factor": trial.factor,
        "value": trial.value,
        **trial.settings,
        "images": result.summary["inputs"],
        "seconds": result.summary["seconds"],
        "images_per_second": result.summary["images_per_second"],
        "hot_images_per_second": (len(ok) - 1 - k) / span if span > 0 else None,
        "peak_ray_rss_mb": mem.peak / 2**20,
        # maskray starts no more actors than inputs: what this trial really measured.
        "pool_started": result.summary["cluster"]["pool_size"],
    }
    record.update({f"{s}_ms": float(ok[f"{s}_ms"].mean()) if len(ok) else 0.0 for s in STAGES})
    return record


def sweep(
    input_uri: str,
    sample_size: int,
    pool_sizes,
    threads_per_actor,
    cpus_per_actor,
    batch_sizes,
    can_grow: bool = False,
    model: str | None = None,
    work_dir: str | None = None,
) -> pd.DataFrame:
    """Run every planned trial that fits (Ray must be initialised by the caller); one row each."""
    import ray

    cluster_cpus = float(ray.cluster_resources().get("CPU", 0))
    work = Path(work_dir or tempfile.mkdtemp(prefix="maskray-tune-"))
    sample_dir, sampled = sample_inputs(input_uri, sample_size, work / "sample")
    records = []
    for trial in plan(pool_sizes, threads_per_actor, cpus_per_actor, batch_sizes, cluster_cpus):
        if not fits(trial, cluster_cpus, can_grow):
            print(f"skip {trial.factor}={trial.value}: needs more CPUs than the cluster has")
            continue
        one_batch_each = trial.settings["pool_size"] * trial.settings["batch_size"]
        if sampled < one_batch_each:
            print(
                f"note {trial.factor}={trial.value}: {sampled} images < pool x batch ({one_batch_each}): "
                "maskray runs it with fewer actors or smaller batches; take a larger sample to measure it"
            )
        t0 = time.time()
        records.append(run_trial(trial, sample_dir, work / "out", model))
        print(f"{trial.factor}={trial.value}: {records[-1]['images_per_second']:.2f} img/s ({time.time() - t0:.0f}s)")
    shutil.rmtree(work / "out", ignore_errors=True)
    return pd.DataFrame.from_records(records)


def recommend(results: pd.DataFrame, input_uri: str, output_uri: str) -> RunConfig:
    """The fastest trial's settings as a validated run config."""
    metric = "hot_images_per_second" if results.hot_images_per_second.notna().all() else "images_per_second"
    best = results.sort_values(metric, ascending=False).iloc[0]
    return resolve_config(
        {
            "input": input_uri,
            "output": output_uri,
            "pool_size": int(best.pool_size),
            "intra_op_threads": int(best.intra_op_threads),
            "cpus_per_actor": float(best.cpus_per_actor),
            "batch_size": int(best.batch_size),
        },
        environ={},
    )


def write_config(cfg: RunConfig, path: str) -> str:
    keep = ("input", "output", "pool_size", "intra_op_threads", "cpus_per_actor", "batch_size")
    Path(path).write_text(yaml.safe_dump({k: getattr(cfg, k) for k in keep}, sort_keys=False))
    return path
