"""Plan the inputs on the cluster, size the pool, and run the graph into the manifest sink (on Ray as
``ray_connect`` joined or started it)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from typing import Any

import ray
from ray.data import DataContext

from maskray.operators.errors import one_line
from maskray.pipeline import plan, sizing, stopping
from maskray.pipeline.config import ConfigError, RunConfig
from maskray.pipeline.engine_choice import EngineChoice
from maskray.pipeline.graph import (
    LIGHT_CPUS,
    GraphSpec,
    decided_graph,
    image_graph,
    input_blocks,
    prepared_batch_bytes,
    split_decisions,
)
from maskray.pipeline.manifest import read_summary
from maskray.pipeline.model import LoadedModel
from maskray.pipeline.plan import InputSpec
from maskray.pipeline.ray_connect import Connection
from maskray.pipeline.sink import ManifestSink
from maskray.pipeline.sizing import Reservations
from maskray.pipeline.stages import StageSettings
from maskray.pipeline.stopping import EXIT_SIGNAL, Stopped

log = logging.getLogger("maskray")


def cluster_cpus() -> float:
    return float(ray.cluster_resources().get("CPU", 0))


def cluster_gpus() -> float:
    return float(ray.cluster_resources().get("GPU", 0))


# How long a --device cuda run on a cluster waits for the autoscaler's first GPU node.
GPU_WAIT_S = 900


def wait_for_gpus(started_locally: bool) -> float:
    """The cluster's GPUs; a cluster without any is asked for one GPU node, and given GPU_WAIT_S."""
    gpus = cluster_gpus()
    if gpus > 0 or started_locally:
        return gpus
    from ray.autoscaler.sdk import request_resources

    log.warning(
        "device cuda: the cluster has no GPU now: asking the autoscaler for one (waiting up to %d s)", GPU_WAIT_S
    )
    request_resources(bundles=[{"GPU": 1}])
    deadline = time.monotonic() + GPU_WAIT_S
    while gpus <= 0 and time.monotonic() < deadline:
        time.sleep(5)
        gpus = cluster_gpus()
    return gpus


def pool_size(cfg: RunConfig, cpus: float, started_locally: bool, inputs: int | None = None) -> int:
    """The configured pool, or one session per CPU (per ``gpus_per_actor`` GPU share on CUDA),
    checked to fit a local Ray; never more actors than inputs (``inputs``).

    The fit check applies to the pool as configured, so a config that cannot run fails the same
    way whatever the input. A cluster is not checked: it may grow (``request_cluster_growth``).
    """
    res = Reservations.of(cfg)
    gpus = wait_for_gpus(started_locally) if cfg.device == "cuda" and not cfg.pool_size else 0.0
    if res.gpus_per_actor and not cfg.pool_size and gpus <= 0:
        raise ConfigError(
            "device cuda: the Ray cluster has no GPU (and none came from the autoscaler); use --device cpu"
        )
    size = cfg.pool_size or sizing.default_pool(res, cpus, gpus)
    if started_locally:
        sizing.check_fit(size, res, cpus)
    if inputs is not None and inputs < size:
        log.info("pool of %d actors for %d inputs: starting %d", size, inputs, max(1, inputs))
        size = sizing.pool_for_inputs(size, inputs)
    return size


def request_cluster_growth(size: int, res: Reservations) -> None:
    """Ask an autoscaling cluster for the pool up front; pending actors are demand as well."""
    from ray.autoscaler.sdk import request_resources

    bundles = [{"CPU": res.cpus_per_actor}] * size + [{"CPU": res.decode_cpus}, {"CPU": res.write_cpus}]
    log.warning("pool of %d actors needs more CPUs than the cluster has now: requesting them from the autoscaler", size)
    request_resources(bundles=bundles)


# Block size while planning: large blocks, so a plan of millions of inputs is a few hundred blocks
# (the driver keeps a little state per block), not one per megabyte.
PLAN_BLOCK_BYTES = 64 * 1024 * 1024


def configure_data_context(cfg: RunConfig) -> None:
    ctx = DataContext.get_current()
    ctx.enable_progress_bars = cfg.progress
    quiet_ray_data_console()
    ctx.execution_options.preserve_order = False
    ctx.target_max_block_size = PLAN_BLOCK_BYTES


def quiet_ray_data_console() -> None:
    """Ray Data's console lines (per-execution INFO, and an aborted execution's traceback) go only
    to its own log file (``ray-data.log`` in the session's logs): on the console a run's outcome is
    our one line, whatever the exit code."""
    for handler in logging.getLogger("ray.data").handlers:
        if not isinstance(handler, logging.FileHandler) and type(handler).__name__ != "SessionFileHandler":
            handler.setLevel(logging.CRITICAL)


def configure_for_images(cfg: RunConfig, ds: ray.data.Dataset) -> None:
    """One prepared batch per block: memory stays flat and bounded, and batches stream. Set on the
    dataset about to run: a dataset keeps the context of the one it was derived from (the plan's)."""
    ds.context.target_max_block_size = prepared_batch_bytes(cfg.batch_size)


def shuffle_partitions(cpus: float) -> int:
    """Partitions of the resolve shuffle: a few per CPU, capped (each is a reduce task)."""
    return max(2, min(200, int(cpus) * 2))


def expected_plan_rows(cfg: RunConfig) -> int | None:
    """The inputs of the last complete run on this output (its ``_summary.json``, one read); None
    when there is none. Only a hint of the plan's size: it picks how the plan is shuffled."""
    try:
        return int(read_summary(cfg.output, cfg.storage_options)["inputs"])
    except Exception:  # noqa: BLE001 - without the hint the plan is counted before its shuffle
        return None


FOOTER_READERS_ENV = "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"


@contextmanager
def footer_readers_for(cpus: float) -> Iterator[None]:
    """Size Ray Data's Parquet footer-reader pool to the cluster (``sizing.footer_readers``) for
    the reads started inside; a value the user set is kept. Ray reads the variable on the driver
    when ``read_parquet`` is called, so setting it around the call is enough."""
    if FOOTER_READERS_ENV in os.environ:
        yield
        return
    os.environ[FOOTER_READERS_ENV] = str(sizing.footer_readers(cpus))
    try:
        yield
    finally:
        os.environ.pop(FOOTER_READERS_ENV, None)


def plan_run(cfg: RunConfig, spec: InputSpec, fp: str, cpus: float) -> ray.data.Dataset:
    """The resolved inputs, materialized in the object store (not on the driver)."""
    with footer_readers_for(cpus):
        raw = plan.raw_inputs(spec)
        evidence = None if cfg.overwrite else plan.earlier_evidence(cfg.output, cfg.storage_options, fp)
    if spec.kind == "list" or evidence is not None:
        hint = expected_plan_rows(cfg) if evidence is not None else None
        resolved = plan.resolve(raw, spec, evidence, shuffle_partitions(cpus), hint)
    else:
        resolved = plan.plain(raw, spec)
    return resolved.materialize()


# How long a stopping run may drain (batches in flight finish and get their rows) before Ray is
# stopped outright. Kubernetes waits 30 s before SIGKILL; `ray job stop` only ~3 s, which is why
# the interruption is recorded as soon as the signal arrives, and again once the run has drained.
DRAIN_S = 10.0


class StopHandlers:
    """SIGINT / SIGTERM: one line, stop taking new inputs, let what is in flight finish, exit 130 / 143.

    Installed after Ray starts (Ray replaces the handlers it finds). The first signal records the
    interruption (``on_stop``), raises the run's stop flag (``maskray.pipeline.stopping``) so that
    prepare tasks take no more inputs, and lets the main thread go on: the dataset then ends, every
    mask already written has its row, and ``run_graph`` raises ``Stopped``. If it has not drained
    within ``DRAIN_S`` (a plan still listing, a stalled bucket), Ray is stopped and the process
    exits; masks without a row are then redone by the next run. A second signal exits at once.
    """

    def __init__(self, on_stop: Callable[[str, bool], None] | None, stop_key: str) -> None:
        self.on_stop, self.stop_key = on_stop, stop_key
        self.signum: int | None = None
        self.finished = threading.Event()
        self.previous: dict[int, Any] = {}

    def install(self) -> StopHandlers:
        self.previous = {signum: signal.signal(signum, self.stop) for signum in EXIT_SIGNAL}
        return self

    def restore(self) -> None:
        self.finished.set()
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def stop(self, signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        print(f"maskray: {name} received: stopping; re-run the same command to resume", file=sys.stderr, flush=True)
        for sig in EXIT_SIGNAL:  # a second signal exits at once
            signal.signal(sig, lambda s, _f: os._exit(EXIT_SIGNAL.get(s, 1)))
        self.signum = signum
        if self.on_stop is not None:
            self.on_stop(name, False)
        try:
            stopping.raise_flag(self.stop_key)
        except Exception as exc:  # noqa: BLE001 - without the flag the deadline below still stops the run
            log.warning("could not raise the stop flag: %s", one_line(exc))
        threading.Thread(target=self.deadline, args=(signum,), daemon=True).start()

    def deadline(self, signum: int) -> None:
        if self.finished.wait(DRAIN_S):
            return

        def shutdown() -> None:
            if self.on_stop is not None:
                self.on_stop(signal.Signals(signum).name, True)
            ray.shutdown()

        done = threading.Thread(target=shutdown, daemon=True)
        done.start()
        done.join(timeout=10)
        os._exit(EXIT_SIGNAL.get(signum, 1))


def run_graph(
    cfg: RunConfig,
    spec: InputSpec,
    model: LoadedModel,
    settings: StageSettings,
    engine: EngineChoice,
    sink: ManifestSink,
    connection: Connection,
    on_stop: Callable[[str, bool], None] | None = None,
) -> dict[str, Any]:
    """Plan, mask and record, on the Ray that ``connection`` joined or started; returns placement
    and timing facts for the summary. Raises ``Stopped`` when a signal stopped the run and it
    drained in time."""
    handlers = StopHandlers(on_stop, settings.stop_key)
    if threading.current_thread() is threading.main_thread():
        handlers.install()
    try:
        placement = _run_graph(cfg, spec, model, settings, engine, sink, connection)
    finally:
        handlers.restore()
        stopping.clear_flag(settings.stop_key)
    if handlers.signum is not None:
        raise Stopped(handlers.signum)
    return placement


def _run_graph(
    cfg: RunConfig,
    spec: InputSpec,
    model: LoadedModel,
    settings: StageSettings,
    engine: EngineChoice,
    sink: ManifestSink,
    connection: Connection,
) -> dict[str, Any]:
    t_connected = time.monotonic()
    cpus = cluster_cpus()
    configure_data_context(cfg)
    resolved = plan_run(cfg, spec, settings.fingerprint, cpus)
    n_planned = resolved.count()  # known from the materialized blocks' metadata
    todo, decided = split_decisions(resolved)
    # Sized before the inputs to mask are counted (their blocks depend on it); the autoscaler is
    # asked for it only once there is something to mask (a re-run of a done catalog asks nothing).
    size = pool_size(cfg, cpus, connection.started_locally, n_planned) if n_planned else 1
    res = Reservations.of(cfg)
    graph = GraphSpec(
        size,
        res,
        cfg.batch_size,
        asdict(engine.spec),
        engine.label,
        reference=engine.reference if res.gpus_per_actor else None,
        cluster_cpus=cpus,
    )
    todo = input_blocks(todo, n_planned, graph)
    n_todo = todo.count()
    t_planned = time.monotonic()
    out = decided_graph(decided, settings)
    if n_todo:
        if n_todo < size:  # never more actors than inputs to mask (the fit was checked above)
            size = sizing.pool_for_inputs(size, n_todo)
            graph = replace(graph, pool_size=size)
        if not sizing.fits(size, res, cpus):
            request_cluster_growth(size, res)
        model_ref = ray.put(model.data)  # once; every actor reads it from the object store
        out = image_graph(todo, n_todo, model_ref, settings, graph).union(out)
    else:
        size = 0
    configure_for_images(cfg, out)
    out.write_datasink(sink, ray_remote_args={"num_cpus": LIGHT_CPUS})
    actors = list(sink.stats["infer_ms_by_actor"])
    return {
        "cluster_cpus": cpus,
        "pool_size": size,
        "nodes": len([n for n in ray.nodes() if n["Alive"]]),
        "inputs_to_mask": n_todo,
        # A killed actor is restarted by Ray as a new process; its in-flight batches are retried.
        "actor_processes": len(actors),
        "actor_restarts": len(sink.stats["restarted_actors"]),
        # Cold start, split: joining/starting Ray, planning the inputs (listing, resolve), the rest.
        "ray_connect_s": round(connection.seconds, 3),
        "plan_s": round(t_planned - t_connected, 3),
    }
