"""The run's record: manifest parts written by Ray's write tasks, statistics merged on the driver.

``<output>/_manifest/<run_id>/part-<attempt>-<task>.parquet``: one row per input the run saw
(``pipeline.rows.MANIFEST_SCHEMA``), written in parallel by the write tasks of a Ray Data
``Datasink``. A part that records no mask written (only skipped or failed rows) is named
``part-<attempt>-<task>-nomasks.parquet``: a re-run reads only the other parts as evidence, so
the parts of done re-runs are never opened again. A part's name is fixed by the run's attempt
token, the write task's index and that flag; a retried task rewrites the same part (and removes
the other name's, should its rows have changed), so it can never duplicate rows; the attempt
token keeps a reused ``--run-id`` from mixing its new parts with an earlier attempt's (those are
removed once the new attempt completes). Each write task returns small statistics of its rows (counts, error
kinds with a few example sources, stage-time sums, first and last timestamps, per-node and
per-actor figures); the driver merges those, never the rows. ``_summary.json`` is written last
and is the run's commit marker: it names the attempt whose parts make up the run.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from maskray.operators import storage
from maskray.operators.errors import one_line
from maskray.operators.keys import MANIFEST_DIR, SUMMARY_NAME
from maskray.pipeline.rows import ERROR, MANIFEST_SCHEMA, OK, SKIPPED, TIME_COLUMNS

EXAMPLES_PER_KIND = 3
# Rows per manifest part: a crash loses at most this much of the record (the masks are written;
# a re-run redoes them), and a 10M-input run writes ~20k parts.
ROWS_PER_PART = 512


def manifest_dir(output: str, run_id: str) -> str:
    return storage.join_uri(output, MANIFEST_DIR, run_id)


NO_MASKS_SUFFIX = "-nomasks.parquet"


def part_name(attempt: str, task_idx: int, masks: bool = True) -> str:
    """The part's file name; ``masks`` says whether any of its rows is ``ok`` (a mask written)."""
    return f"part-{attempt}-{task_idx:06d}{'.parquet' if masks else NO_MASKS_SUFFIX}"


def records_masks(table: pa.Table) -> bool:
    return bool(pc.any(pc.equal(table.column("status"), OK)).as_py())


def may_record_masks(path: str) -> bool:
    """False only for a part named as holding no ok row; parts written before that naming may
    hold some, so they are read."""
    return not path.endswith(NO_MASKS_SUFFIX)


def part_bytes(table: pa.Table) -> bytes:
    """A part as Parquet with one row group per status (ok first). A re-run reads only ok rows as
    evidence (``pipeline.plan.earlier_evidence``): the status column's statistics then let the
    reader skip every other row group's rows in the parts it opens (those that record masks)."""
    buf = io.BytesIO()
    status = table.column("status")
    with pq.ParquetWriter(buf, table.schema) as writer:
        groups = [pc.equal(status, v) for v in sorted(value_counts(status), key=lambda v: (v != OK, v))]
        for rows in (*groups, pc.is_null(status)):
            part = table.filter(rows)
            if part.num_rows:
                writer.write_table(part, row_group_size=table.num_rows)
    return buf.getvalue()


# ---------------------------------------------------------------- per-part statistics


def empty_stats() -> dict[str, Any]:
    return {
        "rows": 0,
        "ignored": 0,
        "parts": 0,
        "status": {},
        "errors_by_kind": {},
        "skipped_by_kind": {},
        "error_examples": {},
        "stage_ms": {c: 0.0 for c in TIME_COLUMNS},
        "started_at": None,
        "finished_at": None,
        "first_ok_at": None,
        "ok_by_node": {},
        "infer_ms_by_actor": {},
        "restarted_actors": [],  # actor processes Ray started again after their actor died
    }


def value_counts(column: pa.ChunkedArray | pa.Array) -> dict[str, int]:
    """Non-null values of a column -> how often each occurs."""
    return {str(v["values"]): int(v["counts"]) for v in pc.value_counts(column).to_pylist() if v["values"] is not None}


def block_stats(table: pa.Table, ignored: int = 0) -> dict[str, Any]:
    """Statistics of one part's rows; small whatever the part's size."""
    s = empty_stats()
    s.update(rows=table.num_rows, ignored=ignored, parts=1 if table.num_rows else 0)
    if not table.num_rows:
        return s
    status = table.column("status")
    s["status"] = value_counts(status)
    errors = table.filter(pc.equal(status, ERROR))
    s["errors_by_kind"] = value_counts(errors.column("error_kind"))
    s["skipped_by_kind"] = value_counts(table.filter(pc.equal(status, SKIPPED)).column("error_kind"))
    for kind, source in zip(errors.column("error_kind").to_pylist(), errors.column("source").to_pylist(), strict=True):
        examples = s["error_examples"].setdefault(kind, [])
        if len(examples) < EXAMPLES_PER_KIND:
            examples.append(source)
    s["stage_ms"] = {c: float(pc.sum(table.column(c)).as_py() or 0.0) for c in TIME_COLUMNS}
    s["started_at"] = pc.min(table.column("started_at")).as_py()
    s["finished_at"] = pc.max(table.column("finished_at")).as_py()
    ok = table.filter(pc.equal(status, OK))
    if ok.num_rows:
        s["first_ok_at"] = pc.min(ok.column("finished_at")).as_py()
        s["ok_by_node"] = value_counts(ok.column("node"))
        by_actor = ok.group_by("actor").aggregate([("infer_ms", "sum")])
        s["infer_ms_by_actor"] = {
            str(a): float(v)
            for a, v in zip(
                by_actor.column("actor").to_pylist(), by_actor.column("infer_ms_sum").to_pylist(), strict=True
            )
            if a
        }
        restarted = ok.filter(pc.fill_null(ok.column("actor_restarted"), False))
        s["restarted_actors"] = sorted(set(restarted.column("actor").to_pylist()))
    return s


def merge_stats(parts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    out = empty_stats()
    for s in parts:
        for key in ("rows", "ignored", "parts"):
            out[key] += s[key]
        for key in ("status", "errors_by_kind", "skipped_by_kind", "ok_by_node", "infer_ms_by_actor", "stage_ms"):
            for k, v in s[key].items():
                out[key][k] = out[key].get(k, 0) + v
        for kind, examples in s["error_examples"].items():
            mine = out["error_examples"].setdefault(kind, [])
            mine.extend(examples[: EXAMPLES_PER_KIND - len(mine)])
        for key, pick in (("started_at", min), ("finished_at", max), ("first_ok_at", min)):
            values = [v for v in (out[key], s[key]) if v is not None]
            out[key] = pick(values) if values else None
        out["restarted_actors"] = sorted({*out["restarted_actors"], *s["restarted_actors"]})
    return out


# ---------------------------------------------------------------- reading a run back


def run_parts(output: str, run_id: str, attempt: str | None, storage_options: dict) -> list[str]:
    """The part files of one run's committed attempt (or every part, when ``attempt`` is None)."""
    fs = storage.filesystem(output, storage_options)
    root = storage.strip_protocol(manifest_dir(output, run_id))
    storage.forget_listings(output, storage_options)
    try:
        names = fs.ls(root, detail=False)
    except FileNotFoundError:
        return []
    prefix = f"part-{attempt}-" if attempt else "part-"
    return sorted(p for p in names if p.rsplit("/", 1)[-1].startswith(prefix) and p.endswith(".parquet"))


def iter_manifest(
    output: str, summary: dict[str, Any], storage_options: dict, columns: list[str] | None = None
) -> Iterator[pa.Table]:
    """The committed run's rows, one part at a time (bounded memory for any run size)."""
    fs = storage.filesystem(output, storage_options)
    for path in run_parts(output, summary["run_id"], summary.get("attempt"), storage_options):
        with fs.open(path, "rb") as fh:
            yield pq.read_table(fh, columns=columns)


def read_manifest(output: str, summary: dict[str, Any], storage_options: dict) -> pa.Table:
    """The whole committed record in memory: for small runs (tests, the tuning notebook)."""
    tables = list(iter_manifest(output, summary, storage_options))
    return pa.concat_tables(tables) if tables else MANIFEST_SCHEMA.empty_table()


def remove_other_attempts(output: str, run_id: str, attempt: str, storage_options: dict) -> int:
    """After a reused run id completes: drop the parts of its earlier attempts."""
    fs = storage.filesystem(output, storage_options)
    stale = [p for p in run_parts(output, run_id, None, storage_options) if f"part-{attempt}-" not in p]
    for path in stale:
        storage.with_retries(partial(fs.rm_file, path))
    return len(stale)


class RecordError(RuntimeError):
    """The run's record (a manifest part or the summary) could not be written: the run stops,
    exit 4. Its message is one line naming the object and the cause."""


def write_record(uri: str, data: bytes, storage_options: dict) -> None:
    try:
        storage.write_bytes_atomic(uri, data, storage_options)
    except Exception as exc:  # noqa: BLE001 - disk full, permission, quota, lost bucket
        raise RecordError(f"cannot write the run's record {uri} ({one_line(exc)})") from None


def write_part(run_dir: str, attempt: str, task_idx: int, table: pa.Table, storage_options: dict) -> str:
    """Write one write task's rows as its part, named by whether they record masks; then remove
    the part of the other name, which a retried task whose rows changed (a transient read error
    that now succeeds) would otherwise leave beside it, duplicating its rows."""
    masks = records_masks(table)
    uri = storage.join_uri(run_dir, part_name(attempt, task_idx, masks))
    write_record(uri, part_bytes(table), storage_options)
    other = storage.join_uri(run_dir, part_name(attempt, task_idx, not masks))
    try:
        storage.remove_if_present(other, storage_options)
    except Exception as exc:  # noqa: BLE001 - as for the part itself
        raise RecordError(f"cannot remove the run's earlier record {other} ({one_line(exc)})") from None
    return uri


def write_summary(output: str, summary: dict[str, Any], storage_options: dict) -> str:
    uri = storage.join_uri(output, SUMMARY_NAME)
    write_record(uri, json.dumps(summary, indent=2, default=_json_default).encode(), storage_options)
    return uri


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


def read_summary(output: str, storage_options: dict) -> dict[str, Any]:
    return json.loads(storage.read_bytes(storage.join_uri(output, SUMMARY_NAME), storage_options))
