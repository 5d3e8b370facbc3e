"""Run one job: check everything that can fail fast, then stream the graph and record it.

Order matters: config, locations, model and output access are all checked before Ray starts
or any image is read, so a mistake costs one line and exit status 2, not a half-done run.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from operators import storage
from operators.keys import is_under
from operators.stages import MANIFEST_SCHEMA, TIME_COLUMNS, StageSettings
from pipeline.config import ConfigError, RunConfig, dump_yaml
from pipeline.inputs import Inputs, discover, is_list_file, storage_error
from pipeline.manifest import ManifestWriter, manifest_dir, write_summary
from pipeline.model import LoadedModel, load_model
from pipeline.sysinfo import machine_info

log = logging.getLogger("maskray")

@dataclass
class RunResult:
    summary: dict[str, Any]
    exit_code: int
    manifest_dir: str
    stats: str = ""


def new_run_id() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


def check_locations(cfg: RunConfig) -> None:
    """Outputs must never land under the input prefix, nor inputs under the output prefix."""
    if is_list_file(cfg.input):
        if is_under(cfg.input, cfg.output):
            raise ConfigError(f"input list {cfg.input} lies under the output prefix {cfg.output}")
        return
    if is_under(cfg.output, cfg.input) or is_under(cfg.input, cfg.output):
        raise ConfigError(f"output {cfg.output} and input {cfg.input} overlap: use separate prefixes")


def probe_output(cfg: RunConfig, run_id: str) -> None:
    """Write the resolved config beside the manifest: proves the output is writable, early."""
    uri = storage.join_uri(manifest_dir(cfg.output, run_id), "_config.yaml")
    try:
        storage.write_bytes_atomic(uri, dump_yaml(cfg).encode(), cfg.storage_options)
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"output {cfg.output}: cannot write ({storage_error(exc)})") from None


def stage_settings(cfg: RunConfig) -> StageSettings:
    return StageSettings(
        output=cfg.output.rstrip("/"), storage_options=cfg.storage_options, writes_mask=cfg.writes_mask,
        writes_cutout=cfg.writes_cutout, overwrite=cfg.overwrite, max_pixels=cfg.max_pixels,
        max_bytes=cfg.max_bytes, post_process_mask=cfg.post_process_mask, bgcolor=cfg.bgcolor,
        png_level=cfg.png_level,
    )


def session_options(cfg: RunConfig) -> dict[str, Any]:
    return {"intra_op_threads": cfg.intra_op_threads, "inter_op_threads": cfg.inter_op_threads,
            "graph_optimization": cfg.graph_optimization}


def split_driver_rows(inputs: Inputs, cfg: RunConfig) -> tuple[pa.Table, pa.Table]:
    """Rows decided without reading the image: duplicate list entries, sources under the output.

    Returns (items for the graph, manifest rows written by the driver).
    """
    seen: set[str] = set()
    keep, rows = [], []
    now = time.time()
    columns = (inputs.table.column("source").to_pylist(), inputs.table.column("key").to_pylist())
    for source, key in zip(*columns, strict=True):
        reason, status = None, "error"
        if source in seen:
            reason, status = "duplicate: the same URI is listed more than once", "skipped"
        elif inputs.kind == "list" and is_under(source, cfg.output):
            reason = "unsafe_source: lies under the output prefix"
        seen.add(source)
        if reason is None:
            keep.append({"source": source, "key": key})
            continue
        row = {c: None for c in MANIFEST_SCHEMA.names}
        row.update({c: 0.0 for c in TIME_COLUMNS})
        row.update(source=source, status=status, error=reason, started_at=now, finished_at=now)
        rows.append(row)
    items = pa.Table.from_pylist(keep, schema=pa.schema([("source", pa.string()), ("key", pa.string())]))
    return items, pa.Table.from_pylist(rows, schema=MANIFEST_SCHEMA)


def prepare(cfg: RunConfig) -> tuple[str, LoadedModel, Inputs]:
    """All fail-fast checks; raises ConfigError with one line."""
    check_locations(cfg)
    model = load_model(cfg.model, cfg.model_md5, cfg.storage_options)
    run_id = cfg.run_id or new_run_id()
    probe_output(cfg, run_id)
    inputs = discover(cfg.input, cfg.storage_options)
    return run_id, model, inputs


def execute(cfg: RunConfig) -> RunResult:
    from pipeline import execution  # imports Ray; kept out of the fail-fast path above

    t0 = time.time()
    run_id, model, inputs = prepare(cfg)
    items, driver_rows = split_driver_rows(inputs, cfg)
    writer = ManifestWriter(cfg.output, run_id, cfg.storage_options)
    if driver_rows.num_rows:
        writer.add(driver_rows)
    if inputs.ignored:
        log.warning("ignored %d objects under %s without an image extension", inputs.ignored, cfg.input)
    stats, placement = "", {}
    if items.num_rows:
        stats, placement = execution.stream(cfg, items, model, stage_settings(cfg), session_options(cfg), writer)
    writer.flush()
    seconds = time.time() - t0
    summary = build_summary(cfg, run_id, model, inputs, writer, seconds, t0, placement)
    write_summary(cfg.output, summary, cfg.storage_options)
    return RunResult(summary, 3 if summary["failed"] else 0, writer.dir, stats)


def build_summary(cfg: RunConfig, run_id: str, model: LoadedModel, inputs: Inputs, writer: ManifestWriter,
                  seconds: float, t0: float, placement: dict[str, Any]) -> dict[str, Any]:
    ok = writer.counts["ok"]
    return {
        "run_id": run_id,
        "inputs": writer.rows,
        "ok": ok,
        "failed": writer.counts["error"],
        "skipped": writer.counts["skipped"],
        "ignored_non_image_objects": inputs.ignored,
        "seconds": round(seconds, 3),
        "images_per_second": round(ok / seconds, 4) if seconds > 0 else 0.0,
        "seconds_to_first_mask": round(writer.first_ok_at - t0, 3) if writer.first_ok_at else None,
        "errors_by_kind": dict(writer.errors),
        "stage_seconds_total": {c[:-3]: round(v / 1000, 3) for c, v in writer.stage_ms.items()},
        "manifest": writer.dir,
        "config": cfg.model_dump(mode="json"),
        "model": {"uri": cfg.model, "md5": model.md5, "precisions": list(model.precisions)},
        "cluster": placement,
        "machine": machine_info(),
        "finished_at": datetime.now(UTC).isoformat(),
    }
