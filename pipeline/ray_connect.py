"""Join or start Ray with only ``ray`` imported: Ray Data and the graph load meanwhile.

``ray.init`` of a local Ray mostly waits on the processes it starts (the GCS, the raylet, its
agents; the two CPUs of a laptop-sized machine are ~60% busy meanwhile), and importing Ray Data
and the graph costs ~1.3 s more on such a machine. Done in a thread during ``ray.init``, the
imports take little wall time before the first mask.
"""

from __future__ import annotations

import importlib
import os
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
        _system_config={
            "num_workers_soft_limit": sizing.worker_soft_limit(
                cfg.num_cpus or os.cpu_count() or 1, Reservations.of(cfg), cfg.pool_size
            )
        },
    )
    return True


def start(cfg: RunConfig) -> Connection:
    """``connect``, with ``RUN_MODULES`` imported in a thread meanwhile (``ray.init`` stays on the
    calling thread: Ray installs its signal handlers there)."""
    t0 = time.monotonic()
    loading = import_in_background(RUN_MODULES)
    started = connect(cfg, endpoint_env())
    seconds = time.monotonic() - t0
    loading.join()
    return Connection(started, seconds)


def import_in_background(modules: tuple[str, ...]) -> threading.Thread:
    """Import ``modules`` in a daemon thread. A module that fails to import is left for the
    caller's own import, which raises the error where it can be handled."""

    def load() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - re-raised by the caller's import, on its thread
                return

    thread = threading.Thread(target=load, name="maskray-imports", daemon=True)
    thread.start()
    return thread
