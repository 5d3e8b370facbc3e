"""``maskray submit``: run ``maskray run ...`` as a Ray job on a cluster and follow it.

Works from an installed maskray as from a checkout. The job's runtime_env ships the ``maskray``
package as this machine imports it (staged as one folder: ``maskray/`` with ``pipeline/`` and
``operators/`` inside), the model when it is the default one (from the user cache), the
``--config`` file, and, unless ``--no-pip``, the tested requirements from the package's
``requirements.lock`` (Ray itself excepted: the job runs on the cluster's Ray). The entrypoint
runs on the head and joins the cluster by itself; maskray's exit status is passed back as ours.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import maskray
import maskray.operators
import maskray.pipeline
from maskray.operators.errors import one_line
from maskray.pipeline.config import ConfigError
from maskray.pipeline.weights import MODEL_FILE, default_model, fetch_model

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
LOCK = Path(maskray.__path__[0]).resolve() / "requirements.lock"


def locked_requirements(lock: Path = LOCK) -> list[str]:
    """``name==version`` lines of the runtime lock, minus Ray (the cluster's own)."""
    lines = [line.split("#", 1)[0].strip() for line in lock.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith(("-", "ray=", "ray["))]


def stage_package(stage: Path) -> None:
    """``stage/maskray`` laid out as the installed package, wherever its parts live (an editable
    install maps ``maskray.pipeline`` to the checkout's ``pipeline/``)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(Path(maskray.__path__[0]).resolve(), stage / "maskray", ignore=ignore)
    for sub in (maskray.pipeline, maskray.operators):
        dest = stage / "maskray" / sub.__name__.rsplit(".", 1)[-1]
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(Path(sub.__path__[0]).resolve(), dest, ignore=ignore)


def stage_working_dir(config_file: str | None, ship_default_model: bool) -> tuple[Path, dict[str, str], list[str]]:
    """Copy what the job needs into a temp dir; returns it, path rewrites and added arguments."""
    stage = Path(tempfile.mkdtemp(prefix="maskray-job-"))
    stage_package(stage)
    rewrites: dict[str, str] = {}
    extra: list[str] = []
    if ship_default_model:  # the default model travels with the job: the cluster may not reach PyPI
        shutil.copy2(fetch_model(default_model()), stage / MODEL_FILE)
        extra = ["--model", MODEL_FILE]
    if config_file:
        shutil.copy2(config_file, stage / "job.yaml")
        rewrites["--config"] = "job.yaml"
    return stage, rewrites, extra


def entrypoint(run_argv: list[str], rewrites: dict[str, str], extra: Sequence[str] = ()) -> str:
    argv = list(run_argv)
    for i, arg in enumerate(argv[:-1]):
        if arg in rewrites:
            argv[i + 1] = rewrites[arg]
    return shlex.join(["python", "-m", "maskray.pipeline.cli", "run", *argv, *extra])


def job_client(address: str):
    """A client that works whether or not this machine has ~/.ray/auth_token.

    Ray 2.60 turns token auth on when that file exists; against a cluster that has auth off
    (or on) we simply try the other mode once.
    """
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address)
    except Exception as exc:  # noqa: BLE001 - retried once with the other auth mode
        if "auth" not in f"{type(exc).__name__} {exc}".lower():
            raise
        os.environ["RAY_AUTH_MODE"] = "disabled" if os.environ.get("RAY_AUTH_MODE") == "token" else "token"
        return JobSubmissionClient(address)


def submit(
    address: str,
    run_argv: list[str],
    config_file: str | None,
    ship_default_model: bool,
    pip: bool = True,
    wait: bool = True,
    entrypoint_cpus: float = 0.0,
) -> int:
    stage, rewrites, extra = stage_working_dir(config_file, ship_default_model)
    runtime_env: dict[str, Any] = {"working_dir": str(stage)}
    if pip:
        runtime_env["pip"] = locked_requirements()
    try:
        client = job_client(address)
        job_id = client.submit_job(
            entrypoint=entrypoint(run_argv, rewrites, extra),
            runtime_env=runtime_env,
            entrypoint_num_cpus=entrypoint_cpus,
        )
    except Exception as exc:  # noqa: BLE001 - cannot reach or use the job server: a setup problem
        raise ConfigError(f"submit to {address}: {one_line(exc)}") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    print(f"maskray: submitted job {job_id} to {address}", file=sys.stderr)
    if not wait:
        return 0
    return follow(client, job_id)


def follow(client, job_id: str, poll_s: float = 1.0) -> int:
    """Stream the job's logs until it ends; map its end to maskray's exit status."""
    printed = 0
    while True:
        status = str(client.get_job_status(job_id)).split(".")[-1]
        logs = client.get_job_logs(job_id)
        sys.stdout.write(logs[printed:])
        sys.stdout.flush()
        printed = len(logs)
        if status in TERMINAL:
            break
        time.sleep(poll_s)
    info = client.get_job_info(job_id)
    print(f"maskray: job {job_id} {status}", file=sys.stderr)
    if status == "SUCCEEDED":
        return 0
    message = info.message or ""
    for code in (3, 2):
        if f"exit code {code}" in message or f"exited with code {code}" in message:
            return code
    return 1
