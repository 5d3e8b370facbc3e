"""``make bench``: maskray against the model's ceiling, rembg and a naive Ray Data version.

All contenders run on the same folder of real photos (the samples, repeated), interleaved
round by round so that a noisy machine shows up as spread (min/median/max), not as a false ratio.
The machine's speed also drifts within a round (a shared host: the ceiling measured 3.38 img/s
in one round and 1.63 in the next), so a short ceiling probe runs before and after every
contender and each run is divided by the probes on either side of it; "x ceiling" and "x rembg"
compare those normalised rates within a round: ratios measured side by side, not across minutes.

1. ceiling  - N single-threaded ONNX Runtime sessions in N processes on preprocessed tensors
   (ceiling-openvino, ceiling-openvino-bf16: the same with OpenVINO's engine, fp32 / maskray's bf16)
2. maskray  - the CLI with its default config, files to masks (engine auto, cubic mask upscale);
   maskray-ort-exact: ``--engine ort --mask-resize lanczos``, rembg's exact masks;
   maskray-bf16: ``--engine openvino --precision bf16`` (bf16 hardware only)
3. rembg    - ``rembg p -m u2netp`` in its own venv, model pointed at ours via U2NET_HOME
4. naive    - the same operators with Ray Data's defaults (autoscaling pool from 1, ORT default threads)
5. maskray-ray-up - maskray's command joining a Ray head started before the timer, as a job on a
   running cluster does: the local Ray start (and its shutdown) is the only difference from 2.
6. maskray-batch2 (only with --only) - 2 with ``--batch-size 2``: the first mask against throughput.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from maskray.operators import preprocess  # noqa: E402
from maskray.operators.decode import decode_rgb  # noqa: E402
from maskray.pipeline.report import PUBLISHED_PRICE_384  # noqa: E402
from maskray.pipeline.sysinfo import NO_BF16, has_bf16_hardware, machine_info  # noqa: E402
from maskray.pipeline.weights import default_model  # noqa: E402

RESULTS = ROOT / "bench" / "results"
REMBG_VENV = ROOT / ".venv-rembg"


# ------------------------------------------------------------------ measuring a run


def is_inference_actor(title: str) -> bool:
    return "InferenceActor" in title or "MapWorker" in title


# What a process's CPU time counts as: the inference actors, the workers of the decode and write
# tasks, and the rest (the driver, Ray's own processes and actors).
CPU_KINDS = ("inference", "image tasks", "ray and driver")
REST = CPU_KINDS[-1]


def cpu_kind(title: str, was: str = REST) -> str:
    """The first kind other than the rest that a process's title ever showed: a pool actor and a
    task worker both start as idle workers, and a task worker is idle between tasks."""
    if was != REST:
        return was
    if is_inference_actor(title):
        return "inference"
    return "image tasks" if "prepare_batch" in title or "finish_batch" in title else REST


class Sampler:
    """Samples machine CPU busy fraction, and the RSS and CPU time of a process tree, while a run goes.

    CPU time is split by ``CPU_KINDS``: the inference actors' processes and everything else in
    the tree (decode and write tasks, the driver, Ray's own processes): what the run spent around
    the model.
    Stage timers cannot give this: on 2 CPUs a decode task shares its core with an actor, so its
    wall-clock stage time counts the actor's slices too, and Ray's own work has no stage at all.
    A process's last < ``interval`` s before it exits is not seen.
    """

    def __init__(self, root_pid: int | None = None, interval: float = 0.25, extra_roots: tuple[int, ...] = ()) -> None:
        self.roots, self.interval = (root_pid or os.getpid(), *extra_roots), interval
        self.cpu: list[float] = []
        self.peak_rss = 0
        self.peak_rss_per_proc: dict[str, int] = {}
        self._cpu_by_pid: dict[int, tuple[str, float]] = {}  # pid -> (CPU kind, CPU s so far)
        # (wall-clock time, {CPU kind: CPU s so far}), one per sample
        self.cpu_series: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        psutil.cpu_percent(None)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _tree(self) -> list[psutil.Process]:
        procs = []
        for pid in self.roots:
            try:
                root = psutil.Process(pid)
                procs += [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
        return procs

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.cpu.append(psutil.cpu_percent(None) / 100)
            total = 0
            for proc in self._tree():
                try:  # a process may exit between any two reads (Ray ends workers all the time)
                    rss = proc.memory_info().rss
                    title = proc.name()
                    name = " ".join(proc.cmdline()[:1] + [title])[:80]
                    times = proc.cpu_times()
                except psutil.Error:
                    continue
                total += rss
                key = "actor" if is_inference_actor(title) else name
                self.peak_rss_per_proc[key] = max(self.peak_rss_per_proc.get(key, 0), rss)
                kind = cpu_kind(title, self._cpu_by_pid.get(proc.pid, (REST, 0.0))[0])
                self._cpu_by_pid[proc.pid] = (kind, times.user + times.system)
            self.peak_rss = max(self.peak_rss, total)
            by_kind = dict.fromkeys(CPU_KINDS, 0.0)
            for kind, cpu in self._cpu_by_pid.values():
                by_kind[kind] += cpu
            self.cpu_series.append((time.time(), by_kind))

    def cpu_shares(self, start: float = 0.0, end: float = math.inf) -> dict[str, float] | None:
        """Each kind's share of the tree's CPU time between two wall-clock times (by default the
        whole run; None if no inference actor ran in that window)."""
        window = [s for s in self.cpu_series if start <= s[0] <= end]
        if len(window) < 2:
            return None
        used = {k: window[-1][1][k] - window[0][1][k] for k in CPU_KINDS}
        total = sum(used.values())
        return {k: v / total for k, v in used.items()} if used["inference"] > 0 else None

    @property
    def cpu_utilisation(self) -> float:
        return float(np.mean(self.cpu)) if self.cpu else 0.0


def outside_inference(shares: dict[str, float] | None) -> float | None:
    return 1 - shares["inference"] if shares else None


def sample_photos() -> list[Path]:
    return sorted(p for p in (ROOT / "samples").iterdir() if p.suffix.lower() in (".jpg", ".png"))


def catalog_jpeg(photo: Path, megapixels: float) -> bytes:
    """A sample upscaled (Lanczos) to a JPEG of about ``megapixels`` (quality 90, its aspect ratio)."""
    import io

    from PIL import Image

    img = Image.open(photo).convert("RGB")
    k = (megapixels * 1e6 / (img.width * img.height)) ** 0.5
    buf = io.BytesIO()
    img.resize((round(img.width * k), round(img.height * k)), Image.LANCZOS).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def make_inputs(n: int, dest: Path, megapixels: float = 0.0) -> list[Path]:
    """The samples repeated; with ``megapixels``, each sample upscaled once to a JPEG of that size
    (``catalog_jpeg``): catalog-size photos."""
    photos = sample_photos()
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if megapixels:
        big_dir = dest.parent / f"big-{megapixels:g}mp"
        big_dir.mkdir(exist_ok=True)
        scaled = []
        for p in photos:
            target = big_dir / (p.stem + ".jpg")
            target.write_bytes(catalog_jpeg(p, megapixels))
            scaled.append(target)
        photos = scaled
    out = []
    for i in range(n):
        src = photos[i % len(photos)]
        out.append(dest / f"{i:05d}-{src.name}")
        shutil.copy(src, out[-1])
    return out


# ------------------------------------------------------------------ 1. ceiling


def _ceiling_worker(model: bytes, tensors: np.ndarray, barrier, queue, engine: dict[str, Any]) -> None:
    from maskray.operators.engines import EngineSpec, open_engine

    eng = open_engine(model, EngineSpec(**engine))
    eng.infer(tensors[0])  # warm-up: first run allocates
    barrier.wait()
    times = []
    t0 = time.perf_counter()
    for t in tensors:
        s = time.perf_counter()
        eng.infer(t)
        times.append(time.perf_counter() - s)
    queue.put((time.perf_counter() - t0, times, psutil.Process().memory_info().rss))


def run_ceiling(files: list[Path], cpus: int, engine: dict[str, Any] | None = None) -> dict[str, Any]:
    """The model alone: one single-threaded engine per CPU, one image per call, preprocessed tensors."""
    model = Path(default_model()).read_bytes()
    tensors = [preprocess.normalise(preprocess.resize_for_model(decode_rgb(f.read_bytes(), 10**9))) for f in files]
    shares = [np.stack(tensors[i::cpus]) for i in range(cpus)]
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(cpus + 1), ctx.Queue()
    procs = [ctx.Process(target=_ceiling_worker, args=(model, s, barrier, queue, engine or {})) for s in shares]
    for p in procs:
        p.start()
    with Sampler(interval=0.25) as sampler:
        barrier.wait()
        t0 = time.perf_counter()
        results = [queue.get() for _ in procs]
        wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    lat = [t for _, times, _ in results for t in times]
    return {
        "images": len(files),
        "seconds": wall,
        "images_per_second": len(files) / wall,
        "latency_p50_ms": 1000 * float(np.percentile(lat, 50)),
        "latency_p95_ms": 1000 * float(np.percentile(lat, 95)),
        "cpu_utilisation": sampler.cpu_utilisation,
        "peak_rss_total_mb": sum(r for *_, r in results) / 2**20,
        "peak_rss_per_actor_mb": max(r for *_, r in results) / 2**20,
        "cold_start_s": None,
    }


# ------------------------------------------------------------------ 2. maskray, 4. naive


def timed_subprocess(
    cmd: list[str], env: dict[str, str] | None = None, extra_roots: tuple[int, ...] = ()
) -> tuple[float, Sampler, str]:
    """Wall time of ``cmd``; memory is sampled over its process tree and ``extra_roots``' trees
    (a running Ray head's, whose workers host the actors of a job that joins it)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    with Sampler(proc.pid, extra_roots=extra_roots) as sampler:
        output, _ = proc.communicate()
    if proc.returncode not in (0,):
        raise RuntimeError(f"{cmd[0]} exited {proc.returncode}:\n{output[-3000:]}")
    return time.perf_counter() - t0, sampler, output


STEADY_MIN_MASKS = 30


def manifest_metrics(out: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq

    summary = json.loads((out / "_summary.json").read_text())
    rows = pq.read_table(out / "_manifest" / summary["run_id"]).to_pandas()
    rows = rows[rows.status == "ok"].sort_values("finished_at")
    # Per-image latency = the time spent working on it (sum of its stage times), comparable with the
    # ceiling's per-run time. Wall time from decode start to write is kept too, but it is mostly
    # queueing: decoding runs ahead of inference by design.
    stage_cols = [c for c in rows.columns if c.endswith("_ms")]
    latency = rows[stage_cols].sum(axis=1)
    queued = (rows.finished_at - rows.started_at) * 1000
    # Steady state: throughput from the k-th to the last mask, once start-up is done. Masks finish
    # a batch at a time, so a window of a few masks measures batch timing, not throughput: below
    # STEADY_MIN_MASKS in the window there is no steady figure (the table shows "-").
    k = max(10, len(rows) // 5)
    steady = None
    if len(rows) - 1 - k >= STEADY_MIN_MASKS:
        span = rows.finished_at.iloc[-1] - rows.finished_at.iloc[k]
        steady = (len(rows) - 1 - k) / span if span > 0 else None
    stages = {c[:-3]: float(rows[c].mean()) for c in stage_cols}
    # Work around the model: every stage but inference, as a share of all stage time. Stage times
    # are wall-clock, so on a busy machine they overstate the decode and write stages (see
    # ``Sampler``); the CPU-time share is ``cpu_outside_infer_share``.
    total = sum(stages.values())
    outside = (total - stages.get("infer", 0.0)) / total if total else None
    return {
        "outside_infer_share": outside,
        "steady_images_per_second": steady,
        "latency_p50_ms": float(latency.quantile(0.5)),
        "latency_p95_ms": float(latency.quantile(0.95)),
        "queued_latency_p50_ms": float(queued.quantile(0.5)),
        "queued_latency_p95_ms": float(queued.quantile(0.95)),
        "cold_start_s": summary["seconds_to_first_mask"],
        "stage_ms_mean": stages,
        "summary_seconds": summary["seconds"],
        "first_mask_at": float(rows.finished_at.iloc[0]) if len(rows) else 0.0,
        "last_mask_at": float(rows.finished_at.iloc[-1]) if len(rows) else 0.0,
    }


def run_pipeline(
    files: list[Path], work: Path, name: str, cmd: list[str], extra_roots: tuple[int, ...] = ()
) -> dict[str, Any]:
    """A contender that writes maskray's manifest and summary (maskray itself, the naive graph)."""
    out = work / f"out-{name}"
    shutil.rmtree(out, ignore_errors=True)
    wall, sampler, _ = timed_subprocess(
        [*cmd, str(out)], env={**os.environ, "RAY_AUTH_MODE": "disabled"}, extra_roots=extra_roots
    )
    metrics = manifest_metrics(out)
    steady = sampler.cpu_shares(metrics.pop("first_mask_at"), metrics.pop("last_mask_at"))
    return {
        "images": len(files),
        "seconds": wall,
        "images_per_second": len(files) / wall,
        "cpu_utilisation": sampler.cpu_utilisation,
        "peak_rss_total_mb": sampler.peak_rss / 2**20,
        "peak_rss_per_actor_mb": sampler.peak_rss_per_proc.get("actor", 0) / 2**20,
        # The whole run's CPU (start-up and shutdown included), and from the first mask to the last.
        "cpu_outside_infer_share": outside_inference(sampler.cpu_shares()),
        "steady_cpu_outside_infer_share": outside_inference(steady),
        "steady_cpu_shares": steady,
        **metrics,
    }


def run_maskray(files: list[Path], work: Path, name: str = "maskray", flags: tuple[str, ...] = ()) -> dict[str, Any]:
    cli = str(ROOT / ".venv" / "bin" / "maskray")
    return run_pipeline(
        files, work, name, [cli, "run", "--no-progress", *flags, "--input", str(files[0].parent), "--output"]
    )


def run_maskray_ray_up(files: list[Path], work: Path, cpus: int) -> dict[str, Any]:
    """maskray joining a running Ray: a fresh head per round, started (and settled) before the timer."""
    from tests.ray_heads import RayHead

    log_dir = work / "ray-head"
    log_dir.mkdir(parents=True, exist_ok=True)
    # The same soft limit the cluster configs set on every node (see cluster/README.md).
    head = RayHead(log_dir, cpus, env={"RAY_num_workers_soft_limit": "1024"})
    try:
        time.sleep(HEAD_SETTLE_S)
        cli = str(ROOT / ".venv" / "bin" / "maskray")
        cmd = [cli, "run", "--no-progress", "--address", head.address, "--input", str(files[0].parent), "--output"]
        return run_pipeline(files, work, "maskray-ray-up", cmd, extra_roots=(head.proc.pid,))
    finally:
        head.stop()


# A head's own start-up (agents, dashboard) keeps the CPUs busy for a few seconds after it answers.
HEAD_SETTLE_S = 5.0


def run_naive(files: list[Path], work: Path) -> dict[str, Any]:
    return run_pipeline(files, work, "naive", [sys.executable, str(ROOT / "bench" / "naive.py"), str(files[0].parent)])


# ------------------------------------------------------------------ 3. rembg


def ensure_rembg() -> Path:
    rembg = REMBG_VENV / "bin" / "rembg"
    if not rembg.exists():
        subprocess.run([sys.executable, "-m", "venv", str(REMBG_VENV)], check=True)
        subprocess.run(
            [str(REMBG_VENV / "bin" / "pip"), "install", "-q", "rembg[cli]==2.0.86", "onnxruntime==1.32.0"], check=True
        )
        # The first import compiles and caches pymatting's numba kernels: a one-time cost of the
        # install, not of a run, so it is paid here and not inside round 1.
        subprocess.run([str(REMBG_VENV / "bin" / "python"), "-c", "import rembg"], check=True)
    return rembg


def run_rembg(files: list[Path], work: Path) -> dict[str, Any]:
    out = work / "out-rembg"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {**os.environ, "U2NET_HOME": str(Path(default_model()).parent)}
    cmd = [str(ensure_rembg()), "p", "-m", "u2netp", str(files[0].parent), str(out)]
    wall, sampler, _ = timed_subprocess(cmd, env=env)
    made = len(list(out.glob("*.png")))
    if made != len(files):
        raise RuntimeError(f"rembg wrote {made} of {len(files)} outputs")
    return {
        "images": len(files),
        "seconds": wall,
        "images_per_second": len(files) / wall,
        "cpu_utilisation": sampler.cpu_utilisation,
        "peak_rss_total_mb": sampler.peak_rss / 2**20,
        "peak_rss_per_actor_mb": sampler.peak_rss / 2**20,
        "cold_start_s": None,
        "latency_p50_ms": None,
        "latency_p95_ms": None,
    }


# ------------------------------------------------------------------ report


def spread(values: list[float | None]) -> dict[str, float | None]:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"min": None, "median": None, "max": None}
    return {"min": min(vals), "median": statistics.median(vals), "max": max(vals)}


def speed(r: dict[str, Any], key: str = "images_per_second") -> float | None:
    """A run's rate over the ceiling probes taken just before and after it."""
    return r[key] / r["ceiling_nearby"] if r.get(key) else None


def versus(rs: list[dict], ref: list[dict], key: str = "images_per_second") -> dict[str, float | None]:
    """Round by round, ``speed(run) / speed(reference run)``: both divided by their own probes, so
    the host's drift between the two runs cancels, and so does any bias of the short probe
    against the full-length ceiling when the reference is the ceiling."""
    ratios = []
    for r, b in zip(rs, ref, strict=True):
        run, base = speed(r, key), speed(b)
        ratios.append(run / base if run is not None and base else None)
    return spread(ratios)


def summarise(runs: dict[str, list[dict]], cpus: int, price_per_hour: float) -> dict[str, Any]:
    table = {}
    for name, rs in runs.items():
        ips = spread([r["images_per_second"] for r in rs])
        table[name] = {
            "images_per_second": ips,
            "steady_images_per_second": spread([r.get("steady_images_per_second") for r in rs]),
            "per_cpu": ips["median"] / cpus,
            "fraction_of_ceiling": versus(rs, runs["ceiling"]),
            "steady_fraction_of_ceiling": versus(rs, runs["ceiling"], "steady_images_per_second"),
            "versus_rembg": versus(rs, runs["rembg"]) if "rembg" in runs else None,
            "latency_p50_ms": spread([r.get("latency_p50_ms") for r in rs])["median"],
            "latency_p95_ms": spread([r.get("latency_p95_ms") for r in rs])["median"],
            "cpu_utilisation": spread([r["cpu_utilisation"] for r in rs])["median"],
            "peak_rss_total_mb": spread([r["peak_rss_total_mb"] for r in rs])["median"],
            "peak_rss_per_actor_mb": spread([r["peak_rss_per_actor_mb"] for r in rs])["median"],
            "cold_start_s": spread([r.get("cold_start_s") for r in rs])["median"],
            "outside_infer_share": spread([r.get("outside_infer_share") for r in rs])["median"],
            "cpu_outside_infer_share": spread([r.get("cpu_outside_infer_share") for r in rs])["median"],
            "steady_cpu_outside_infer_share": spread([r.get("steady_cpu_outside_infer_share") for r in rs])["median"],
            "cost_per_million_usd": price_per_hour / (ips["median"] * 3600) * 1e6,
        }
    return table


def fmt(v: Any, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def markdown(table: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        f"`{meta['command']}` on {meta['machine']['cpu_model']} ({meta['cpus']} CPUs), {meta['images']} images, "
        f"{meta['rounds']} interleaved rounds, {meta['date']}",
        "",
        "| contender | img/s min / median / max | steady img/s | img/s per CPU | × ceiling min / median / max "
        "| steady × ceiling | × rembg | p50 / p95 ms per image "
        "| CPU util | peak RSS total / per actor MB | cold start s | stage time outside inference "
        "| CPU outside inference: run / steady | $ per 1M |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in table.items():
        ips, frac = r["images_per_second"], r["fraction_of_ceiling"]
        lines.append(
            f"| {name} | {fmt(ips['min'])} / {fmt(ips['median'])} / {fmt(ips['max'])} "
            f"| {fmt(r['steady_images_per_second']['median'])} | {fmt(r['per_cpu'])} "
            f"| {fmt(frac['min'])} / {fmt(frac['median'])} / {fmt(frac['max'])} "
            f"| {fmt(r['steady_fraction_of_ceiling']['median'])} "
            f"| {fmt((r['versus_rembg'] or {}).get('median'))} "
            f"| {fmt(r['latency_p50_ms'], '.0f')} / {fmt(r['latency_p95_ms'], '.0f')} | {fmt(r['cpu_utilisation'])} "
            f"| {fmt(r['peak_rss_total_mb'], '.0f')} / {fmt(r['peak_rss_per_actor_mb'], '.0f')} "
            f"| {fmt(r['cold_start_s'], '.1f')} | {fmt(r['outside_infer_share'])} "
            f"| {fmt(r.get('cpu_outside_infer_share'))} / {fmt(r.get('steady_cpu_outside_infer_share'))} "
            f"| {fmt(r['cost_per_million_usd'])} |"
        )
    return "\n".join(lines) + "\n"


PALETTE = ["#999", "#2a7", "#c63", "#36c", "#7c5", "#b5b", "#5bb", "#bb5"]


def chart(table: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(table)
    med = [table[n]["images_per_second"]["median"] for n in names]
    lo = [m - table[n]["images_per_second"]["min"] for n, m in zip(names, med, strict=True)]
    hi = [table[n]["images_per_second"]["max"] - m for n, m in zip(names, med, strict=True)]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(names, med, yerr=[lo, hi], capsize=6, color=(PALETTE * 3)[: len(names)])
    ax.set_ylabel("images / s (end to end)")
    ax.set_title("maskray vs ceiling, rembg and naive Ray Data (min/median/max)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


CONTENDERS: dict[str, Callable[..., dict[str, Any]]] = {
    "ceiling": lambda files, work, cpus: run_ceiling(files, cpus),
    "ceiling-openvino": lambda files, work, cpus: run_ceiling(files, cpus, {"name": "openvino"}),
    "ceiling-openvino-bf16": lambda files, work, cpus: run_ceiling(
        files, cpus, {"name": "openvino", "precision": "bf16"}
    ),
    "maskray": lambda files, work, cpus: run_maskray(files, work),
    "maskray-bf16": lambda files, work, cpus: run_maskray(
        files, work, "maskray-bf16", ("--engine", "openvino", "--precision", "bf16")
    ),
    "maskray-ort-exact": lambda files, work, cpus: run_maskray(
        files, work, "maskray-ort-exact", ("--engine", "ort", "--mask-resize", "lanczos")
    ),
    # The first mask against throughput: half the default CPU batch (README, "Start-up").
    "maskray-batch2": lambda files, work, cpus: run_maskray(files, work, "maskray-batch2", ("--batch-size", "2")),
    "rembg": lambda files, work, cpus: run_rembg(files, work),
    "naive": lambda files, work, cpus: run_naive(files, work),
    "maskray-ray-up": run_maskray_ray_up,
}


# Run only when named in --only: settings comparisons, not contenders of the default table.
OPTIONAL = ("maskray-batch2",)


# Contenders that measure bf16: on a CPU without bf16 hardware OpenVINO's CPU plugin turns bf16
# back to f32 (maskray's engine then refuses to start), so they could not measure bf16 there.
NEEDS_BF16 = ("ceiling-openvino-bf16", "maskray-bf16")


def refused_contenders(names: list[str], bf16_hardware: bool) -> list[str]:
    """The named contenders this CPU cannot measure honestly."""
    return [] if bf16_hardware else [n for n in names if n in NEEDS_BF16]


def default_contenders(bf16_hardware: bool) -> list[str]:
    wanted = [n for n in CONTENDERS if n not in OPTIONAL]
    refused = refused_contenders(wanted, bf16_hardware)
    return [n for n in wanted if n not in refused]


PROBE_IMAGES_PER_CPU = 8  # ~3 s of model time per CPU: short beside a contender, long beside timer noise


def probe(files: list[Path], cpus: int) -> float:
    """The ceiling right now, on a few of the same photos."""
    return run_ceiling(files[: PROBE_IMAGES_PER_CPU * cpus], cpus)["images_per_second"]


def run_rounds(names: list[str], files: list[Path], work: Path, cpus: int, rounds: int) -> dict[str, list[dict]]:
    """probe, contender, probe, contender, ..., probe: each run keeps the mean of its two probes."""
    runs: dict[str, list[dict]] = {n: [] for n in names}
    before = probe(files, cpus)
    for rnd in range(rounds):
        for name in names:
            result = CONTENDERS[name](files, work, cpus)
            after = probe(files, cpus)
            result["ceiling_nearby"] = (before + after) / 2
            runs[name].append(result)
            shares = result.get("steady_cpu_shares")
            split = ", ".join(f"{k} {v:.3f}" for k, v in shares.items()) if shares else ""
            print(
                f"round {rnd + 1} {name}: {result['images_per_second']:.3f} img/s "
                f"({speed(result):.2f} x the ceiling probes "
                f"{before:.2f} / {after:.2f})" + (f"; CPU from the first mask to the last: {split}" if split else ""),
                flush=True,
            )
            before = after
    return runs


def main(argv: list[str] | None = None) -> int:
    bf16_hardware = has_bf16_hardware()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--megapixels",
        type=float,
        default=0.0,
        help="upscale the samples to JPEGs of this size (catalog photos: 2, 12); 0 = as they are",
    )
    ap.add_argument("--only", nargs="*", choices=list(CONTENDERS), default=default_contenders(bf16_hardware))
    ap.add_argument("--cpus", type=int, default=os.cpu_count())
    ap.add_argument(
        "--price-per-hour",
        type=float,
        default=None,
        help="machine $/h (default: the published $5.20/h per 384 vCPUs, scaled to --cpus)",
    )
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    refused = refused_contenders(args.only, bf16_hardware)
    if refused:
        ap.error(f"{', '.join(refused)}: {NO_BF16} (OpenVINO would run fp32)")
    price = args.price_per_hour if args.price_per_hour is not None else PUBLISHED_PRICE_384 / 384 * args.cpus
    work = args.results / "work"
    files = make_inputs(args.images, work / "in", args.megapixels)
    names = ["ceiling", *(n for n in args.only if n != "ceiling")]
    runs = run_rounds(names, files, work, args.cpus, args.rounds)
    table = summarise(runs, args.cpus, price)
    meta = {
        "command": " ".join(["make bench", *(argv or sys.argv[1:])]),
        "cpus": args.cpus,
        "images": args.images,
        "megapixels": args.megapixels,
        "rounds": args.rounds,
        "price_per_hour": price,
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine_info(),
    }
    args.results.mkdir(parents=True, exist_ok=True)
    md = markdown(table, meta)
    stem = f"bench-{args.megapixels:g}mp" if args.megapixels else "bench"
    (args.results / f"{stem}.md").write_text(md)
    (args.results / f"{stem}.json").write_text(json.dumps({"meta": meta, "table": table, "runs": runs}, indent=2))
    chart(table, args.results / f"{stem}.png")
    shutil.rmtree(work, ignore_errors=True)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
