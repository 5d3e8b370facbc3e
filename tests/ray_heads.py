"""Ray heads for the cluster tests, started in their own process group and ended by pid.

Never `ray stop --force` (what AutoscalingCluster does): it kills every Ray process on the host.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.servers import free_port, wait_http_ok

BIN = Path(sys.executable).parent


# What cluster/gcp.yaml and the KubeRay configs set on every node (see cluster/README.md;
# tests/test_cluster_configs.py checks both match): without it Ray kills idle task workers beside
# the pool after a second, and most tasks start a new process. Only nodes read it (RayHead, and the
# cluster fixture's raylets), not the drivers and clients that join them.
NODE_ENV = {"RAY_num_workers_soft_limit": "1024"}


def ray_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"})
    env.update(extra or {})
    return env


class RayHead:
    """`ray start --head --block` with the job server; .address is the GCS, .dashboard the job API."""

    def __init__(
        self,
        log_dir: Path,
        num_cpus: int,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        self.port, self.dash_port = port or free_port(), free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.dashboard = f"http://127.0.0.1:{self.dash_port}"
        self.log = open(log_dir / f"ray-head-{self.port}.log", "wb")  # noqa: SIM115
        self.env = ray_env({**NODE_ENV, **(env or {})})
        # Unix socket paths are capped at 107 bytes: pytest's tmp paths are too long for Ray.
        self.temp_dir = tempfile.mkdtemp(prefix="rh-", dir="/tmp")
        self.proc = subprocess.Popen(
            [
                str(BIN / "ray"),
                "start",
                "--head",
                "--block",
                f"--port={self.port}",
                f"--num-cpus={num_cpus}",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self.dash_port}",
                "--include-dashboard=true",
                f"--temp-dir={self.temp_dir}",
                *(extra_args or []),
            ],
            stdout=self.log,
            stderr=self.log,
            env=self.env,
            start_new_session=True,
        )
        wait_http_ok(
            f"{self.dashboard}/api/version", 90.0, f"ray head (log: {self.log.name})", lambda: self.proc.poll() is None
        )

    # `ray start --block` answers SIGTERM by stopping its processes one by one, and after a job it
    # waits out its own 30 s timeout: the tests need none of that, so the group is killed after a
    # short grace.
    STOP_GRACE_S = 5

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=self.STOP_GRACE_S)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        self.log.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
