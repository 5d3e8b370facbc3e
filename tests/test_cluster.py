"""maskray on real multi-node Ray clusters on this one machine: several raylets, the job
server, Ray's fake multi-node autoscaler, and faults injected mid-run."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from PIL import Image

from maskray.pipeline.cli import main
from tests import images
from tests.ray_heads import BIN, NODE_ENV, RayHead, ray_env
from tests.servers import restore_env, set_env

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def photo_folder(root: Path, copies: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(copies):
        for p in images.PHOTOS:
            (root / f"{i:03d}-{p.name}").write_bytes(p.read_bytes())
    return root


def rows_of(out: Path) -> tuple[dict, list[dict]]:
    summary = json.loads((out / "_summary.json").read_text())
    return summary, pq.read_table(out / "_manifest" / summary["run_id"]).to_pylist()


def mask_digests(out: Path) -> dict[str, str]:
    """Each mask's digest of its decoded pixels and size, not of its file: masks are a contract on
    pixels, and ISA-L's deflate does not promise the same stream for the same input (intel/isa-l#140;
    once, in a Ray worker here, one mask of 18 came out 1 byte longer with identical pixels)."""
    digests = {}
    for p in (out / "masks").rglob("*.png"):
        with Image.open(p) as im:
            digests[p.name] = hashlib.md5(f"{im.mode}{im.size}".encode() + im.tobytes()).hexdigest()
    return digests


HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}


@pytest.fixture()
def local_cluster():
    """Head with 1 CPU + two 1-CPU worker raylets (ray.cluster_utils, from the main thread)."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    # The raylets read NODE_ENV when they start, as a real cluster's nodes do; only they need it.
    saved = set_env(NODE_ENV)
    try:
        # A killed raylet is declared dead after 3 missed health checks 1 s apart, not Ray's default
        # of several times that: the node-loss test then waits seconds, not tens of them, to recover.
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": HEALTH_CHECKS})
        workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
        cluster.wait_for_nodes()
    finally:
        restore_env(saved)
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster, workers
    ray.shutdown()
    cluster.shutdown()


def check_exactly_once(out: Path, inputs: int, reference: dict[str, str] | None = None) -> tuple[dict, list[dict]]:
    summary, rows = rows_of(out)
    assert len(rows) == inputs and len({r["source"] for r in rows}) == inputs
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows if r["status"] != "ok"]
    digests = mask_digests(out)
    assert len(digests) == inputs
    if reference:
        assert digests == reference  # retried writes rewrote identical masks
    return summary, rows


@pytest.fixture(scope="module")
def reference_masks(tmp_path_factory):
    """Masks of 3 copies of the samples from a plain local run (the expected pixels)."""
    import ray

    src = photo_folder(tmp_path_factory.mktemp("ref") / "in", 3)
    out = src.parent / "out"
    if ray.is_initialized():
        ray.shutdown()
    assert main(["run", "--input", str(src), "--output", str(out), "--no-progress", "--num-cpus", "2"]) == 0
    ray.shutdown()
    return src, mask_digests(out)


def test_multi_node_actors_on_several_nodes(local_cluster, reference_masks, tmp_path):
    src, ref = reference_masks
    out = tmp_path / "out"
    t0 = time.monotonic()
    assert main(["run", "--input", str(src), "--output", str(out), "--no-progress"]) == 0
    summary, rows = check_exactly_once(out, len(ref), ref)
    nodes = {r["node"] for r in rows}
    print(
        f"multi-node: {time.monotonic() - t0:.1f}s, pool {summary['cluster']['pool_size']}, "
        f"masks per node {[sum(r['node'] == n for r in rows) for n in nodes]}"
    )
    assert summary["cluster"]["nodes"] == 3 and summary["cluster"]["pool_size"] == 3
    assert len(nodes) >= 2


def run_in_thread(argv: list[str]) -> tuple[threading.Thread, dict]:
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("code", main(argv)), daemon=True)
    thread.start()
    return thread, result


def wait_for_masks(out: Path, n: int, timeout: float = 120) -> int:
    """Wait until at least ``n`` masks exist; returns how many there are then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = len(list((out / "masks").glob("*.png"))) if (out / "masks").exists() else 0
        if found >= n:
            return found
        time.sleep(0.2)
    raise AssertionError("run made no progress")


def assert_struck_mid_run(rows: list[dict], masks_before: int, struck_at: float, total: int) -> None:
    """The fault came while masks were still being produced: masks were missing when it struck,
    and rows finished after it."""
    assert masks_before < total, f"the fault came after all {total} masks were written"
    after = [r for r in rows if r["status"] == "ok" and r["finished_at"] > struck_at]
    assert after, "no mask was finished after the fault"
    print(f"fault after {masks_before}/{total} masks; {len(after)} rows finished after it")


def test_inference_actor_killed_mid_run(local_cluster, reference_masks, tmp_path):
    from ray.util.state import list_actors

    src, ref = reference_masks
    out = tmp_path / "out"
    thread, result = run_in_thread(["run", "--input", str(src), "--output", str(out), "--no-progress"])
    wait_for_masks(out, 2)
    victims = [a for a in list_actors(filters=[("state", "=", "ALIVE")]) if "InferenceActor" in a.class_name]
    assert victims
    masks_before, struck_at = wait_for_masks(out, 0), time.time()
    os.kill(victims[0].pid, 9)  # a real crash of the worker process
    thread.join(timeout=300)
    assert result.get("code") == 0
    summary, rows = check_exactly_once(out, len(ref), ref)
    assert_struck_mid_run(rows, masks_before, struck_at, len(ref))
    with pytest.raises(ProcessLookupError):
        os.kill(victims[0].pid, 0)  # the process is gone; its batches were retried elsewhere
    # Ray restarts the killed actor; the restarted process shows in the manifest only if a batch
    # was left for it, which on a busy host it may not be.
    print(
        f"actor kill: actor processes used {summary['cluster']['actor_processes']}, "
        f"restarted actors in the manifest {summary['cluster']['actor_restarts']}"
    )


def test_worker_node_removed_mid_run(local_cluster, reference_masks, tmp_path):
    cluster, workers = local_cluster
    src, ref = reference_masks
    out = tmp_path / "out"
    thread, result = run_in_thread(["run", "--input", str(src), "--output", str(out), "--no-progress"])
    wait_for_masks(out, 2)
    masks_before, struck_at = wait_for_masks(out, 0), time.time()
    cluster.remove_node(workers[0], allow_graceful=False)  # main thread, as cluster_utils requires
    thread.join(timeout=300)
    assert result.get("code") == 0
    summary, rows = check_exactly_once(out, len(ref), ref)
    assert_struck_mid_run(rows, masks_before, struck_at, len(ref))
    print(f"node removal: nodes seen in rows {len({r['node'] for r in rows})}")


def test_job_submission_against_emulated_bucket(tmp_path, gcs_server, bucket_name):
    from maskray.operators import storage

    fs = storage.filesystem("gs://x")
    fs.mkdir(bucket_name)
    for p in images.PHOTOS:
        fs.pipe_file(f"{bucket_name}/in/{p.name}", p.read_bytes())
    head = RayHead(tmp_path, num_cpus=2, env={"STORAGE_EMULATOR_HOST": gcs_server.url})
    try:
        t0 = time.monotonic()
        proc = subprocess.run(
            [
                str(BIN / "maskray"),
                "submit",
                "--address",
                head.dashboard,
                "--input",
                f"gs://{bucket_name}/in",
                "--output",
                f"gs://{bucket_name}/out",
                "--no-progress",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=ray_env(),
            cwd=tmp_path,
        )
        print(f"job submission: {time.monotonic() - t0:.1f}s")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "SUCCEEDED" in proc.stderr
        summary = json.loads(fs.cat_file(f"{bucket_name}/out/_summary.json"))
        assert summary["ok"] == len(images.PHOTOS)
        assert len(fs.find(f"{bucket_name}/out/masks")) == len(images.PHOTOS)
    finally:
        head.stop()


def test_submit_without_address_fails_fast(monkeypatch, capsys):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(["submit", "--input", "a", "--output", "b"]) == 2
    assert "no cluster address" in capsys.readouterr().err


FAKE_AUTOSCALER = """
cluster_name: fake-maskray
max_workers: 2
idle_timeout_minutes: 0.1
provider:
  type: fake_multinode
  use_node_id_as_ip: true
  disable_node_updaters: true
  disable_launch_config_check: true
available_node_types:
  ray.head.default:
    resources: {CPU: 0}
    node_config: {}
    max_workers: 0
  ray.worker.cpu:
    resources: {CPU: 1}
    node_config: {}
    min_workers: 0
    max_workers: 2
head_node_type: ray.head.default
auth: {ssh_user: ubuntu}
upscaling_speed: 1.0
file_mounts: {}
cluster_synced_files: []
file_mounts_sync_continuously: false
rsync_exclude: []
rsync_filter: []
initialization_commands: []
setup_commands: []
head_setup_commands: []
worker_setup_commands: []
head_start_ray_commands: []
worker_start_ray_commands: []
"""


class WorkerWatch:
    """Worker nodes alive over time, sampled every second by one driver process (a fresh
    ``ray.init`` per sample cost more CPU than the run under test)."""

    CODE = (
        "import ray, sys, time\n"
        "ray.init(address=sys.argv[1], log_to_driver=False)\n"
        "while True:\n"
        "    print(sum(1 for n in ray.nodes() if n['Alive'] and n['Resources'].get('CPU', 0) > 0), flush=True)\n"
        "    time.sleep(1)\n"
    )

    def __init__(self, address: str) -> None:
        self.t0 = time.monotonic()
        self.timeline: list[tuple[float, int]] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-c", self.CODE, address],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=ray_env(),
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.strip().isdigit():
                self.timeline.append((time.monotonic() - self.t0, int(line)))

    def wait_for(self, n: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.timeline and self.timeline[-1][1] == n:
                return True
            time.sleep(0.5)
        return False

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def test_autoscaler_adds_workers_for_the_pool_and_removes_them_when_idle(tmp_path):
    config = tmp_path / "autoscaler.yaml"
    config.write_text(FAKE_AUTOSCALER)
    src = photo_folder(tmp_path / "in", 1)
    # The fake provider's nodes join the GCS on the default port 6379, so the head must use it.
    head = RayHead(
        tmp_path, num_cpus=0, extra_args=[f"--autoscaling-config={config}"], env={"RAY_FAKE_CLUSTER": "1"}, port=6379
    )
    watch = WorkerWatch(head.address)
    try:
        assert watch.wait_for(0, 60)  # the watcher is up, and no worker node yet
        # Pool of 2 x 0.75 CPU on a head with 0 CPUs: pending actors are demand; maskray also asks.
        proc = subprocess.Popen(
            [
                str(BIN / "maskray"),
                "run",
                "--input",
                str(src),
                "--output",
                str(tmp_path / "out"),
                "--address",
                head.address,
                "--pool-size",
                "2",
                "--no-progress",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=ray_env(),
        )

        output, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, output[-4000:]
        summary, rows = rows_of(tmp_path / "out")
        assert summary["ok"] == len(images.PHOTOS)
        assert len({r["node"] for r in rows}) >= 1
        idle = watch.wait_for(0, 180)
        timeline = watch.timeline
        print("autoscaler timeline (s, worker nodes):", [(round(t, 1), n) for t, n in timeline[::5]])
        assert timeline[0][1] == 0 and max(n for _, n in timeline) >= 1 and idle
    finally:
        watch.stop()
        head.stop()
