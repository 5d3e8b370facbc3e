"""``make bench-scale``: what the driver and storage pay as the catalog grows (not how fast masks are made).

For each synthetic catalog (hard links to one sample photo, 1000 per folder; locally at each size,
and tiny objects on the GCS emulator behind a counting, delaying proxy) it runs ``maskray run``
as a new process and prints:

* seconds from launch to the first mask file, with the run stopped (SIGINT) once masks flow;
* the driver's peak RSS (``VmHWM`` of the maskray process) over that run;
* on the emulator: storage requests per input (listing, reads, writes);
* a re-run over the fully done catalog: every input already has an ok row with this run's
  fingerprint (a synthetic manifest written beside the output, as a finished run leaves it),
  run to completion: skips per second, driver peak RSS, and requests per input on the emulator.

    .venv/bin/python bench/scale.py [--sizes 10000 100000 1000000] [--gcs-size 100000] [--delay-ms 0]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.latency_proxy import LatencyProxy  # noqa: E402
from maskray.pipeline.rows import MANIFEST_SCHEMA, TIME_COLUMNS  # noqa: E402
from maskray.pipeline.weights import default_model  # noqa: E402

PHOTO = ROOT / "samples" / "chelsea.jpg"
PER_FOLDER = 1000
MASKRAY = str(ROOT / ".venv" / "bin" / "maskray")


def link_source(root: Path, i: int) -> Path:
    """A copy of the photo per 50,000 links (ext4 allows ~65,000 hard links to one file)."""
    path = root / "src" / f"photo-{i // 50_000}.jpg"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(PHOTO.read_bytes())
    return path


def local_catalog(root: Path, n: int) -> tuple[Path, Path]:
    """``root/in/dNNNN/imgNNNNNNN.jpg`` hard links, and a .txt list of the same paths."""
    src, listing = root / "in", root / "list.txt"
    root.mkdir(parents=True, exist_ok=True)
    if listing.exists() and sum(1 for _ in open(listing)) == n:
        return src, listing
    with open(listing, "w") as fh:
        for i in range(n):
            folder = src / f"d{i // PER_FOLDER:04d}"
            if i % PER_FOLDER == 0:
                folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"img{i:07d}.jpg"
            if not path.exists():
                os.link(link_source(root, i), path)
            fh.write(f"{path}\n")
    return src, listing


@functools.cache
def default_fingerprint() -> str:
    """What a plain ``maskray run`` records on this machine (default settings, the engine ``auto``
    picks): the fingerprint a done catalog's rows must carry for the re-run to skip them."""
    from maskray.pipeline.config import RunConfig
    from maskray.pipeline.run import prepare, run_fingerprint

    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig(input=str(ROOT / "samples"), output=tmp)
        _, _, model, _, engine = prepare(cfg)
        return run_fingerprint(cfg, model, engine)


def done_manifest(output: str, sources: list[str] | None, listing: Path | None, fs=None) -> None:
    """Write a finished run's manifest for every source (ok rows with the default fingerprint)."""
    fp = default_fingerprint()
    names = sources if sources is not None else [line.rstrip("\n") for line in open(listing)]
    now = time.time()
    step = 100_000
    for i in range(0, len(names), step):
        chunk = names[i : i + step]
        k = len(chunk)
        cols = {
            "source": chunk,
            "output": [None] * k,
            "cutout": [None] * k,
            "status": ["ok"] * k,
            "error_kind": [None] * k,
            "error": [None] * k,
            "fingerprint": [fp] * k,
            "width": np.full(k, 451),
            "height": np.full(k, 300),
            "input_bytes": np.full(k, 1000),
            "node": ["n"] * k,
            "actor": ["a"] * k,
            **{c: np.ones(k, np.float32) for c in TIME_COLUMNS},
            "started_at": np.full(k, now - 10.0),
            "finished_at": np.full(k, now - 5.0),
        }
        table = pa.table(
            {f.name: pa.array(cols[f.name], f.type) if f.name in cols else pa.nulls(k, f.type) for f in MANIFEST_SCHEMA}
        )
        name = f"{output}/_manifest/done/part-synthetic-{i // step:06d}.parquet"
        if fs is None:
            Path(name).parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, name)
        else:
            with fs.open(name.split("://", 1)[1], "wb") as fh:
                pq.write_table(table, fh)


def vm_hwm_mb(pid: int) -> float:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def first_mask_exists(out: str, fs=None) -> bool:
    if fs is not None:
        try:
            return bool(fs.find(out.split("://", 1)[1] + "/masks", maxdepth=None, withdirs=False)[:1])
        except FileNotFoundError:
            return False
    for _dirpath, _dirs, files in os.walk(Path(out) / "masks"):
        if any(f.endswith(".png") and not f.startswith(".") for f in files):
            return True
    return False


def launch(
    args: list[str], env: dict[str, str], stop_at_first_mask: str | None, fs=None, timeout: float = 1800
) -> dict:
    """Run maskray; sample the driver's VmHWM; stop it with SIGINT once a mask exists (if asked)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [MASKRAY, *args, "--no-progress"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    hwm, first = 0.0, None
    while proc.poll() is None and time.monotonic() - t0 < timeout:
        hwm = max(hwm, vm_hwm_mb(proc.pid))
        if stop_at_first_mask and first_mask_exists(stop_at_first_mask, fs):
            first = time.monotonic() - t0
            time.sleep(1.0)  # let a few more masks flow, then stop the run and its local Ray
            hwm = max(hwm, vm_hwm_mb(proc.pid))
            break
        time.sleep(0.2)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    err = proc.stderr.read().decode(errors="replace")[-600:]
    return {
        "first_mask_s": first,
        "wall_s": time.monotonic() - t0,
        "driver_peak_rss_mb": hwm,
        "exit": proc.returncode,
        "stderr_tail": err,
    }


def summary_of(out: str, fs=None) -> dict:
    if fs is not None:
        return json.loads(fs.cat_file(out.split("://", 1)[1] + "/_summary.json"))
    return json.loads((Path(out) / "_summary.json").read_text())


def done_rerun_summary(out: str, n: int, fs=None) -> dict:
    """The summary of the re-run of a done catalog, which must have skipped every input (else the
    synthetic manifest is not what a run records, and the figures would time masking instead)."""
    s = summary_of(out, fs)
    if s["skipped"] != n:
        raise SystemExit(f"the done re-run skipped {s['skipped']} of {n} inputs: its figures would not be a re-run's")
    return s


def bench_local(work: Path, n: int, env: dict[str, str]) -> list[dict]:
    src, listing = local_catalog(work / f"cat{n}", n)
    rows = []
    for kind, input_uri in (("list", str(listing)), ("prefix", str(src))):
        out = work / f"out-{kind}-{n}"
        subprocess.run(["rm", "-rf", str(out)], check=True)
        first = launch(["run", "--input", input_uri, "--output", str(out)], env, str(out))
        # The fully done catalog: a finished run's manifest for every input, then the same command.
        subprocess.run(["rm", "-rf", str(out)], check=True)
        sources = None
        if kind == "prefix":
            sources = [str(src / f"d{i // PER_FOLDER:04d}" / f"img{i:07d}.jpg") for i in range(n)]
        done_manifest(str(out), sources, listing if kind == "list" else None)
        rerun = launch(["run", "--input", input_uri, "--output", str(out)], env, None)
        s = done_rerun_summary(str(out), n)
        rows.append(
            {
                "where": "local",
                "input": kind,
                "inputs": n,
                **{f"first_{k}": v for k, v in first.items()},
                "rerun_s": rerun["wall_s"],
                "rerun_exit": rerun["exit"],
                "rerun_skipped": s["skipped"],
                "rerun_skips_per_s": s["skipped"] / rerun["wall_s"],
                "rerun_driver_peak_rss_mb": rerun["driver_peak_rss_mb"],
                "rerun_plan_s": s["cluster"]["plan_s"],
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def tiny_png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.open(PHOTO).resize((48, 32)).save(buf, format="PNG")
    return buf.getvalue()


def bench_gcs(work: Path, n: int, env: dict[str, str], delay_ms: float) -> list[dict]:
    from tests.servers import GcsEmulator

    server = GcsEmulator(work)
    proxy = LatencyProxy(server.url, delay_s=delay_ms / 1000)
    try:
        os.environ["STORAGE_EMULATOR_HOST"] = server.url
        from maskray.operators import storage

        fs = storage.filesystem("gs://x", {"endpoint_url": server.url})  # this server's own client
        bucket = "scale-bench"
        fs.mkdir(bucket)
        data = tiny_png()
        names = [f"{bucket}/in/d{i // PER_FOLDER:04d}/img{i:07d}.png" for i in range(n)]
        for i in range(0, n, 2000):
            fs.pipe({p: data for p in names[i : i + 2000]})
        env = {**env, "STORAGE_EMULATOR_HOST": proxy.url}
        out = f"gs://{bucket}/out"
        proxy.reset()
        first = launch(["run", "--input", f"gs://{bucket}/in", "--output", out], env, out, fs)
        first_counts = dict(proxy.counts)
        done_manifest(out, [f"gs://{p}" for p in names], None, fs)
        proxy.reset()
        rerun = launch(["run", "--input", f"gs://{bucket}/in", "--output", out], env, None)
        s = done_rerun_summary(out, n, fs)
        row = {
            "where": f"gcs emulator (+{delay_ms:g} ms per request)",
            "input": "prefix",
            "inputs": n,
            **{f"first_{k}": v for k, v in first.items()},
            "first_requests": first_counts,
            "rerun_s": rerun["wall_s"],
            "rerun_exit": rerun["exit"],
            "rerun_skipped": s["skipped"],
            "rerun_skips_per_s": s["skipped"] / rerun["wall_s"],
            "rerun_driver_peak_rss_mb": rerun["driver_peak_rss_mb"],
            "rerun_requests": dict(proxy.counts),
            "rerun_requests_per_input": sum(proxy.counts.values()) / n,
            "rerun_plan_s": s["cluster"]["plan_s"],
        }
        print(json.dumps(row), flush=True)
        return [row]
    finally:
        proxy.stop()
        server.stop()


def pool_utilisation(summary: dict) -> float:
    """Share of the pool's time spent in inference, from the first image started to the last done."""
    span = (summary["last_row_finished_at"] or 0) - (summary["first_row_started_at"] or 0)
    busy = sum(summary["infer_seconds_by_actor"].values())
    pool = summary["cluster"]["pool_size"] or 1
    return busy / (pool * span) if span > 0 else 0.0


def latency_ab(work: Path, n: int, env: dict[str, str], delay_ms: float, rounds: int) -> list[dict]:
    """Masks from the emulator with ``delay_ms`` added per request: --io-threads 1 vs the default,
    interleaved, whole runs."""
    from tests.servers import GcsEmulator

    server = GcsEmulator(work)
    proxy = LatencyProxy(server.url, delay_s=delay_ms / 1000)
    rows = []
    try:
        os.environ["STORAGE_EMULATOR_HOST"] = server.url
        from maskray.operators import storage

        fs = storage.filesystem("gs://x", {"endpoint_url": server.url})  # this server's own client
        fs.mkdir("latency")
        fs.pipe({f"latency/in/{i:04d}.jpg": PHOTO.read_bytes() for i in range(n)})
        env = {**env, "STORAGE_EMULATOR_HOST": proxy.url}
        for r in range(rounds):
            for threads in ("1", "16"):
                out = f"gs://latency/out-{threads}-{r}"
                proxy.reset()
                res = launch(["run", "--input", "gs://latency/in", "--output", out, "--io-threads", threads], env, None)
                s = summary_of(out, fs)
                rows.append(
                    {
                        "io_threads": int(threads),
                        "round": r,
                        "images": s["ok"],
                        "wall_s": res["wall_s"],
                        "images_per_second": s["images_per_second"],
                        "pool_utilisation": pool_utilisation(s),
                        "peak_gets_in_flight": proxy.peak["get"],
                        "peak_writes_in_flight": proxy.peak["write"],
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    finally:
        proxy.stop()
        server.stop()
    return rows


def latency_table(rows: list[dict], delay_ms: float) -> str:
    lines = [
        f"| io threads (+{delay_ms:g} ms per request) | round | images | img/s | pool utilisation | "
        "peak GETs in flight | peak writes in flight |",
        "| " + " | ".join(["---"] * 7) + " |",
    ]
    for r in rows:
        lines.append(
            f"| {r['io_threads']} | {r['round']} | {r['images']} | {r['images_per_second']:.2f} | "
            f"{r['pool_utilisation']:.2f} | {r['peak_gets_in_flight']} | {r['peak_writes_in_flight']} |"
        )
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    head = (
        "| where | input | inputs | first mask s | driver peak RSS MB | re-run of the done catalog s | "
        "skips/s | re-run driver peak RSS MB | requests per input (re-run) |"
    )
    lines = [head, "| " + " | ".join(["---"] * 9) + " |"]
    for r in rows:
        req = f"{r['rerun_requests_per_input']:.4f}" if "rerun_requests_per_input" in r else "-"
        first = f"{r['first_first_mask_s']:.1f}" if r["first_first_mask_s"] else "none"
        lines.append(
            f"| {r['where']} | {r['input']} | {r['inputs']:,} | {first} | "
            f"{r['first_driver_peak_rss_mb']:.0f} | {r['rerun_s']:.1f} | {r['rerun_skips_per_s']:,.0f} | "
            f"{r['rerun_driver_peak_rss_mb']:.0f} | {req} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--gcs-size", type=int, default=100_000, help="0 skips the emulator")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="added to every emulator request")
    ap.add_argument("--work", default=None, help="where the catalogs go (default: a temp folder)")
    ap.add_argument(
        "--latency-images",
        type=int,
        default=96,
        help="images masked from the emulator at --latency-delay-ms, io threads 1 vs 16; 0 skips",
    )
    ap.add_argument("--latency-delay-ms", type=float, default=50.0)
    ap.add_argument("--latency-rounds", type=int, default=2)
    args = ap.parse_args()
    if not Path(default_model()).exists():
        print("models/u2netp.onnx missing: run make setup", file=sys.stderr)
        return 2
    work = Path(args.work or tempfile.mkdtemp(prefix="maskray-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "NO_GCE_CHECK": "true"}
    rows, latency = [], []
    if args.latency_images:
        latency = latency_ab(work, args.latency_images, env, args.latency_delay_ms, args.latency_rounds)
    for n in args.sizes:
        rows += bench_local(work, n, env)
    if args.gcs_size:
        rows += bench_gcs(work, args.gcs_size, env, args.delay_ms)
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / "scale.json").write_text(json.dumps({"catalogs": rows, "latency": latency}, indent=1))
    md = table(rows) + ("\n\n" + latency_table(latency, args.latency_delay_ms) if latency else "")
    (results / "scale.md").write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    threading.excepthook = lambda a: None
    sys.exit(main())
