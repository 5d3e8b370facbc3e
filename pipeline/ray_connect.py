"""Join or start Ray with only ``ray`` imported: Ray Data and the graph load meanwhile.

``ray.init`` of a local Ray mostly waits on the processes it starts (the GCS, the raylet, its
agents; the two CPUs of a laptop-sized machine are ~60% busy meanwhile), and importing Ray Data
and the graph costs ~1.3 s more on such a machine. Done in a thread during ``ray.init``, the
imports take little wall time before the first mask.

A local Ray this process started also gets one more task worker while the plan runs
(``warm_task_worker``).
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from dataclasses import dataclass

import ray

from maskray.pipeline import sizing
from maskray.pipeline.config import RunConfig
from maskray.pipeline.sizing import Reservations

# Env vars that tell storage clients where an emulator or custom endpoint is; workers on a
# remote cluster need them too (a local Ray's workers inherit the driver's environment).
ENDPOINT_ENV_VARS = (
    "STORAGE_EMULATOR_HOST",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",
)

# What the run imports after connecting: Ray Data, the graph, the manifest sink.
RUN_MODULES = ("maskray.pipeline.execution", "maskray.pipeline.sink")
# What the image graph's decode and write tasks import first: Ray Data's task wrapper, the stages.
TASK_MODULES = ("ray.data", "maskray.pipeline.stages")


@dataclass(frozen=True)
class Connection:
    started_locally: bool  # this process started a local Ray (its size is checked, not grown)
    seconds: float  # joining or starting it


def endpoint_env() -> dict[str, str]:
    return {k: os.environ[k] for k in ENDPOINT_ENV_VARS if k in os.environ}


def connect(cfg: RunConfig, env_vars: dict[str, str]) -> bool:
    """Join ``--address``/``RAY_ADDRESS``, or start a local Ray. Returns True if we started it."""
    if ray.is_initialized():
        return False
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    runtime_env = {"env_vars": env_vars} if env_vars else None
    if address:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=True)
        return False
    # address="local": never attach to a stale cluster recorded by an earlier `ray start`.
    ray.init(
        address="local",
        num_cpus=cfg.num_cpus,
        runtime_env=runtime_env,
        include_dashboard=False,
        configure_logging=False,
        _system_config=local_system_config(cfg),
    )
    return True


def local_system_config(cfg: RunConfig) -> dict[str, int]:
    """Ray's settings for a local Ray that runs ``cfg``: enough idle workers kept alive for the
    pool and every task slot (``sizing.worker_soft_limit``). The tests start their shared Ray
    with these too, so they run on the Ray the CLI would start."""
    cpus = cfg.num_cpus or os.cpu_count() or 1
    return {"num_workers_soft_limit": sizing.worker_soft_limit(cpus, Reservations.of(cfg), cfg.pool_size)}


def start(cfg: RunConfig) -> Connection:
    """``connect``, with ``RUN_MODULES`` imported in a thread meanwhile (``ray.init`` stays on the
    calling thread: Ray installs its signal handlers there)."""
    t0 = time.monotonic()
    loading = import_in_background(RUN_MODULES)
    started = connect(cfg, endpoint_env())
    seconds = time.monotonic() - t0
    if started:
        warm_task_worker()
    loading.join()
    return Connection(started, seconds)


def import_in_order(modules: tuple[str, ...]) -> None:
    """Import ``modules`` in order, up to the first that fails: that one, and the rest, are left
    to the code that needs them, whose own import raises the error where it is handled."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - raised again by the importer that needs the module
            return


@ray.remote(num_cpus=0)  # no reservation: it must never wait behind the plan's tasks
def _import_in_worker(modules: tuple[str, ...]) -> tuple[int, list[str]]:
    """This worker's pid and the ``modules`` it holds (``import_in_order``)."""
    import_in_order(modules)
    return os.getpid(), [name for name in modules if name in sys.modules]


def warm_task_worker() -> ray.ObjectRef:
    """One more worker process for the image graph's tasks, started (and its imports done) while
    the plan runs.

    A local Ray prestarts one worker per CPU; Ray Data's helper actors take them, and the plan's
    tasks run in one more. On 600 images and 2 CPUs (``ray.timeline()``), the image graph's decode
    tasks then ran back to back in that worker, and the first write task waited 1.5-2 s for a new
    worker process to start while the first masks were already inferred. ``bench/startup.py``
    measures the gain, and the cost on a run too small to need it.
    """
    return _import_in_worker.remote(TASK_MODULES)


def import_in_background(modules: tuple[str, ...]) -> threading.Thread:
    """``import_in_order`` in a daemon thread: a failing module is left to the caller's own
    import, on its thread."""
    thread = threading.Thread(target=import_in_order, args=(modules,), name="maskray-imports", daemon=True)
    thread.start()
    return thread
