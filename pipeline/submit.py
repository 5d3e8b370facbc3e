"""``maskray submit``: run ``maskray run ...`` as a Ray job on a cluster and follow it.

The job's runtime_env ships the project (a staged working_dir: the two packages, pyproject,
the model when it is the default local file, and the --config file) and, unless ``--no-pip``,
the pinned requirements from pyproject.toml. The entrypoint runs on the head and joins the
cluster by itself; maskray's exit status (0 / 3 / 2 / 1) is passed back as ours.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from operators.engines import installed
from pipeline.config import DEFAULT_MODEL, PROJECT_ROOT, ConfigError

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
STAGED = ("pipeline", "operators", "pyproject.toml")


def pinned_requirements() -> list[str]:
    """The core pins, plus the openvino extra when it is installed here (so that ``--engine auto``
    can choose the same engine on the cluster as it did in the check on this machine)."""
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    return list(project["dependencies"]) + (list(extras.get("openvino", [])) if installed("openvino") else [])


def stage_working_dir(config_file: str | None, model: str | None) -> tuple[Path, dict[str, str]]:
    """Copy what the job needs into a temp dir; returns it and path rewrites for the entrypoint."""
    stage = Path(tempfile.mkdtemp(prefix="maskray-job-"))
    for name in STAGED:
        src = PROJECT_ROOT / name
        if src.is_dir():
            shutil.copytree(src, stage / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, stage / name)
    rewrites: dict[str, str] = {}
    if model is None and Path(DEFAULT_MODEL).exists():
        (stage / "models").mkdir()
        shutil.copy2(DEFAULT_MODEL, stage / "models" / "u2netp.onnx")
    if config_file:
        shutil.copy2(config_file, stage / "job.yaml")
        rewrites["--config"] = "job.yaml"
    return stage, rewrites


def entrypoint(run_argv: list[str], rewrites: dict[str, str]) -> str:
    argv = list(run_argv)
    for i, arg in enumerate(argv[:-1]):
        if arg in rewrites:
            argv[i + 1] = rewrites[arg]
    return shlex.join(["python", "-m", "pipeline.cli", "run", *argv])


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


def submit(address: str, run_argv: list[str], config_file: str | None, model: str | None,
           pip: bool = True, wait: bool = True, entrypoint_cpus: float = 0.0) -> int:
    stage, rewrites = stage_working_dir(config_file, model)
    runtime_env: dict[str, Any] = {"working_dir": str(stage)}
    if pip:
        runtime_env["pip"] = pinned_requirements()
    try:
        client = job_client(address)
        job_id = client.submit_job(entrypoint=entrypoint(run_argv, rewrites), runtime_env=runtime_env,
                                   entrypoint_num_cpus=entrypoint_cpus)
    except Exception as exc:  # noqa: BLE001 - cannot reach or use the job server: a setup problem
        raise ConfigError(f"submit to {address}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}") from None
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
