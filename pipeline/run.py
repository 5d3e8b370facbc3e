"""Run one job: check everything that can fail fast, then stream the graph and record it.

Order matters: config, locations, model and output access are all checked before Ray starts
or any image is read, so a mistake costs one line and exit status 2, not a half-done run.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from maskray.operators import storage
from maskray.operators.errors import one_line
from maskray.operators.keys import is_under
from maskray.pipeline import lease, stopping
from maskray.pipeline.config import ConfigError, RunConfig, dump_yaml, recorded_config, redact_uri
from maskray.pipeline.engine_choice import EngineChoice, cached_choice, check_local_cuda, check_precision
from maskray.pipeline.manifest import manifest_dir, remove_other_attempts, write_summary
from maskray.pipeline.model import LoadedModel, load_model
from maskray.pipeline.plan import InputSpec, check_input, is_list_file
from maskray.pipeline.rows import fingerprint
from maskray.pipeline.stages import StageSettings
from maskray.pipeline.sysinfo import machine_info

log = logging.getLogger("maskray")


@dataclass
class RunResult:
    summary: dict[str, Any]
    exit_code: int
    manifest_dir: str


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


def check_locations(cfg: RunConfig) -> None:
    """Outputs must never land under the input prefix, nor inputs under the output prefix."""
    if is_list_file(cfg.input):
        if is_under(cfg.input, cfg.output):
            raise ConfigError(f"input list {cfg.input} lies under the output prefix {cfg.output}")
        return
    if is_under(cfg.output, cfg.input) or is_under(cfg.input, cfg.output):
        raise ConfigError(f"output {cfg.output} and input {cfg.input} overlap: use separate prefixes")


def check_endpoints(cfg: RunConfig) -> None:
    """A custom storage endpoint that refuses connections is a config error, named in a second or
    two. Each endpoint is probed once, however many of input, output and model it serves."""
    endpoints: dict[str, str] = {}
    for uri in (cfg.input, cfg.output, cfg.model):
        endpoint = storage.custom_endpoint(uri, cfg.storage_options)
        if endpoint:
            endpoints.setdefault(endpoint, uri)
    for endpoint, uri in endpoints.items():
        try:
            storage.check_reachable(endpoint)
        except ConnectionError as exc:
            raise ConfigError(f"{redact_uri(uri)}: the storage endpoint is unreachable: {exc}") from None


def probe_output(cfg: RunConfig, run_id: str) -> None:
    """Write the resolved config beside the manifest: proves the output is writable, early."""
    uri = storage.join_uri(manifest_dir(cfg.output, run_id), "_config.yaml")
    try:
        storage.write_bytes_atomic(uri, dump_yaml(cfg).encode(), cfg.storage_options)
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"output {cfg.output}: cannot write ({one_line(exc)})") from None


def run_fingerprint(cfg: RunConfig, model: LoadedModel, engine: EngineChoice) -> str:
    return fingerprint(
        model.md5,
        cfg.format,
        cfg.post_process_mask,
        cfg.bgcolor,
        cfg.png_level,
        engine.spec.label,
        cfg.mask_resize,
        cfg.fast_decode,
    )


def run_dir_exists(cfg: RunConfig, run_id: str) -> bool:
    fs = storage.filesystem(cfg.output, cfg.storage_options)
    try:
        return bool(fs.exists(storage.strip_protocol(manifest_dir(cfg.output, run_id))))
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"output {cfg.output}: cannot read ({one_line(exc)})") from None


def prepare(cfg: RunConfig) -> tuple[str, bool, LoadedModel, InputSpec, EngineChoice]:
    """All fail-fast checks; raises ConfigError with one line. Reads no input beyond one probe.
    Then ``execute`` takes the output's lease and writes the config beside the manifest."""
    check_locations(cfg)
    check_precision(cfg)
    check_endpoints(cfg)
    if cfg.device == "cuda" and not (cfg.address or os.environ.get("RAY_ADDRESS")):
        check_local_cuda(cfg)
    model = load_model(cfg.model, cfg.model_md5, cfg.storage_options)
    spec = replace(check_input(cfg.input, cfg.output, cfg.storage_options), allow_local_sources=cfg.allow_local_sources)
    engine = cached_choice(cfg, model.data, model.md5)
    run_id = cfg.run_id or new_run_id()
    reused = run_dir_exists(cfg, run_id)
    return run_id, reused, model, spec, engine


def take_lease(cfg: RunConfig, run_id: str) -> lease.Lease:
    """The output's lease (its creation is also the first write to the output)."""
    try:
        return lease.acquire(cfg.output, run_id, cfg.storage_options, force=cfg.force)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"output {cfg.output}: cannot write ({one_line(exc)})") from None


def execute(cfg: RunConfig) -> RunResult:
    t0 = time.time()
    run_id, reused, model, spec, engine = prepare(cfg)
    held = take_lease(cfg, run_id)
    try:
        probe_output(cfg, run_id)
        return execute_leased(cfg, t0, run_id, reused, model, spec, engine, held)
    finally:
        held.release()


def execute_leased(
    cfg: RunConfig,
    t0: float,
    run_id: str,
    reused: bool,
    model: LoadedModel,
    spec: InputSpec,
    engine: EngineChoice,
    held: lease.Lease,
) -> RunResult:
    # Ray is imported and started only now, out of the fail-fast path above; Ray Data and the
    # graph are imported while it starts.
    from maskray.pipeline import ray_connect

    connection = ray_connect.start(cfg)
    from maskray.pipeline import execution
    from maskray.pipeline.sink import ManifestSink

    attempt = uuid.uuid4().hex[:8]
    fp = run_fingerprint(cfg, model, engine)
    sink = ManifestSink(cfg.output, run_id, attempt, cfg.storage_options)

    def on_stop(signal_name: str, exiting: bool) -> None:
        record_interruption(cfg, run_id, attempt, signal_name, sink.stats, t0, drained=False)
        if exiting:  # the process exits without unwinding: release the lease here
            held.release()

    settings = StageSettings.of(cfg, fp, stopping.key_for(cfg.output, attempt))
    try:
        placement = execution.run_graph(cfg, spec, model, settings, engine, sink, connection, on_stop=on_stop)
    except stopping.Stopped as stop:
        record_interruption(cfg, run_id, attempt, str(stop), sink.stats, t0, drained=True)
        raise
    storage.forget_listings(cfg.output, cfg.storage_options)  # the workers wrote under it
    if reused:
        removed = remove_other_attempts(cfg.output, run_id, attempt, cfg.storage_options)
        log.info("run id %s was used before: replaced its %d earlier manifest parts", run_id, removed)
    stats = sink.stats
    if stats["ignored"]:
        log.warning("ignored %d objects under %s without an image extension", stats["ignored"], cfg.input)
    placement["engine"] = {"used": engine.label, "checks": engine.checks}
    summary = build_summary(cfg, run_id, attempt, fp, model, stats, time.time() - t0, t0, placement)
    write_summary(cfg.output, summary, cfg.storage_options)
    return RunResult(summary, 3 if summary["failed"] else 0, manifest_dir(cfg.output, run_id))


def record_interruption(
    cfg: RunConfig, run_id: str, attempt: str, signal_name: str, stats: dict[str, Any], t0: float, drained: bool
) -> None:
    """``_manifest/<run>/_interrupted.json``: what the committed parts hold so far; ``drained``
    once the run stopped taking inputs and every mask written has its row. Never the output's
    ``_summary.json``, which marks a complete run."""
    record = {
        "run_id": run_id,
        "attempt": attempt,
        "interrupted_by": signal_name,
        "drained": drained,
        "seconds": round(time.time() - t0, 3),
        "committed_rows": stats.get("rows", 0),
        "status": stats.get("status", {}),
        "manifest_parts": stats.get("parts", 0),
        "at": datetime.now(timezone.utc).isoformat(),
    }
    try:
        uri = storage.join_uri(manifest_dir(cfg.output, run_id), "_interrupted.json")
        storage.write_bytes_atomic(uri, json.dumps(record, indent=2).encode(), cfg.storage_options)
    except Exception as exc:  # noqa: BLE001 - stopping must not fail on the record of stopping
        log.warning("could not record the interruption: %s", one_line(exc))


def build_summary(
    cfg: RunConfig,
    run_id: str,
    attempt: str,
    fp: str,
    model: LoadedModel,
    stats: dict[str, Any],
    seconds: float,
    t0: float,
    placement: dict[str, Any],
) -> dict[str, Any]:
    status = stats["status"]
    ok = status.get("ok", 0)
    first = stats["first_ok_at"]
    return {
        "run_id": run_id,
        "attempt": attempt,
        "inputs": stats["rows"],
        "ok": ok,
        "failed": status.get("error", 0),
        "skipped": status.get("skipped", 0),
        "skipped_by_kind": stats["skipped_by_kind"],
        "ignored_non_image_objects": stats["ignored"],
        "seconds": round(seconds, 3),
        "images_per_second": round(ok / seconds, 4) if seconds > 0 else 0.0,
        "seconds_to_first_mask": round(first - t0, 3) if first else None,
        "errors_by_kind": stats["errors_by_kind"],
        "error_examples": stats["error_examples"],
        "stage_seconds_total": {c[:-3]: round(v / 1000, 3) for c, v in stats["stage_ms"].items()},
        "first_row_started_at": stats["started_at"],
        "last_row_finished_at": stats["finished_at"],
        "ok_by_node": stats["ok_by_node"],
        "infer_seconds_by_actor": {a: round(v / 1000, 3) for a, v in stats["infer_ms_by_actor"].items()},
        "manifest": manifest_dir(cfg.output, run_id),
        "manifest_parts": stats["parts"],
        "fingerprint": fp,
        "config": recorded_config(cfg),
        "model": {"uri": redact_uri(cfg.model), "md5": model.md5, "precisions": list(model.precisions)},
        "cluster": placement,
        "machine": machine_info(),
        "started_at": datetime.fromtimestamp(t0, timezone.utc).isoformat(),
        "finished_at": datetime.now(timezone.utc).isoformat(),
    }
