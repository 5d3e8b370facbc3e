"""The one manifest row type: schema, status values, error kinds, and the helpers that build rows.

Every input gets exactly one row with this schema, whether it was masked, failed or skipped.
``error_kind`` is set where the failure happens (never parsed back out of the message), and
``fingerprint`` records what made an ok row's output, so a re-run can tell a reusable output
from one made with other settings (``pipeline.plan``).
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import numpy as np
import pyarrow as pa

# Row statuses written to the manifest.
OK, ERROR, SKIPPED = "ok", "error", "skipped"
# In-flight statuses that never reach the manifest: "pending" = fine so far; "ignored" = a
# listed object without an image extension (counted in the summary, not a row).
PENDING, IGNORED = "pending", "ignored"

# Error kinds: the prefix of every one-line reason, and the ``error_kind`` column.
ERROR_KINDS = (
    "read",  # the source could not be fetched (not found, permission, network)
    "empty",  # zero-byte file
    "too_large",  # over max_bytes (from the listing) or max_pixels (from the header)
    "not_an_image",
    "unsupported_format",
    "decode",
    "unsafe_key",  # no contained output key can be made for it
    "unsafe_source",  # a list entry that lies under the output prefix
    "infer",
    "write",
)
# Kinds of skipped rows (in ``error_kind`` too, so the record says why nothing was done).
DONE, DUPLICATE = "done", "duplicate"
DUPLICATE_REASON = "duplicate: the same URI is listed more than once"

STAGES = ("read", "decode", "preprocess", "infer", "postprocess", "encode", "write")
TIME_COLUMNS = tuple(f"{s}_ms" for s in STAGES)

MANIFEST_SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("output", pa.string()),
        ("cutout", pa.string()),
        ("status", pa.string()),
        ("error_kind", pa.string()),
        ("error", pa.string()),
        ("fingerprint", pa.string()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("input_bytes", pa.int64()),
        ("node", pa.string()),
        ("actor", pa.string()),
        ("actor_restarted", pa.bool_()),
        ("engine", pa.string()),
        *[(c, pa.float32()) for c in TIME_COLUMNS],
        ("started_at", pa.float64()),
        ("finished_at", pa.float64()),
    ]
)

# Bump when the mask math changes (resize, normalisation, post-processing): outputs made by an
# earlier version are then redone on resume instead of kept.
MASK_MATH_VERSION = 1


def fingerprint(
    model_md5: str,
    fmt: str,
    post_process_mask: bool,
    bgcolor: Any,
    png_level: int,
    engine: str = "ort/fp32/cpu",
    mask_resize: str = "lanczos",
    fast_decode: bool = False,
) -> str:
    """Everything that changes an output's bytes, hashed: equal fingerprints, equal outputs.
    ``engine`` (``name/precision/device``): fp32 engines agree to rounding, not bit for bit."""
    parts = {
        "model_md5": model_md5,
        "format": fmt,
        "post_process_mask": bool(post_process_mask),
        "bgcolor": list(bgcolor) if bgcolor is not None else None,
        "png_level": int(png_level),
        "mask_math": MASK_MATH_VERSION,
        "engine": engine,
        "mask_resize": mask_resize,
        "fast_decode": bool(fast_decode),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def blank_row(source: str, key: str, size: int | None = None) -> dict[str, Any]:
    """The in-flight row of one input, before anything has been done to it."""
    row: dict[str, Any] = {
        "source": source,
        "key": key,
        "size": -1 if size is None else int(size),
        "mask_uri": "",
        "cutout_uri": "",
        "status": ERROR,
        "error_kind": "",
        "error": "",
        "width": 0,
        "height": 0,
        "input_bytes": 0,
        "pre": b"",
        "data": b"",
        "started_at": time.time(),
    }
    row.update({c: 0.0 for c in TIME_COLUMNS})
    return row


def fail(row: dict[str, Any], kind: str, reason: str) -> None:
    """Mark an in-flight row failed; ``reason`` is the whole one-line message (``kind: ...``)."""
    row["status"], row["error_kind"], row["error"] = ERROR, kind, reason
    row["pre"] = row["data"] = b""


def manifest_row(row: dict[str, Any], fp: str) -> dict[str, Any]:
    """In-flight row -> fixed-schema manifest row (null output on failure, null error on success)."""
    status = str(row["status"])
    ok = status == OK
    out = {
        "source": str(row["source"]),
        "output": (str(row["mask_uri"]) or str(row["cutout_uri"]) or None) if ok else None,
        "cutout": (str(row["cutout_uri"]) or None) if ok else None,
        "status": status,
        "error_kind": (str(row["error_kind"]) or "unknown") if status == ERROR else None,
        "error": (str(row["error"]) or "unknown") if status == ERROR else None,
        "fingerprint": fp if ok else None,
        "width": int(row["width"]) or None,
        "height": int(row["height"]) or None,
        "input_bytes": int(row["input_bytes"]) or None,
        "node": str(row.get("node", "")) or None,
        "actor": str(row.get("actor", "")) or None,
        "actor_restarted": bool(row["actor_restarted"]) if "actor_restarted" in row else None,
        "engine": str(row.get("engine", "")) or None,
        "started_at": float(row["started_at"]),
        "finished_at": time.time(),
    }
    out.update({c: float(row.get(c) or 0.0) for c in TIME_COLUMNS})
    return out


def decided_rows(
    sources: list[str],
    statuses: list[str],
    kinds: list[str | None],
    errors: list[str | None],
    outputs: list[str | None],
    cutouts: list[str | None],
    fingerprints: list[str | None],
    sizes: list[int | None],
) -> pa.Table:
    """Manifest rows for inputs decided without touching the image (skipped, unsafe, ignored)."""
    n, now = len(sources), time.time()
    columns: dict[str, Any] = {
        "source": sources,
        "output": outputs,
        "cutout": cutouts,
        "status": statuses,
        "error_kind": kinds,
        "error": errors,
        "fingerprint": fingerprints,
        "width": [None] * n,
        "height": [None] * n,
        "input_bytes": sizes,
        "node": [None] * n,
        "actor": [None] * n,
        "actor_restarted": [None] * n,
        "engine": [None] * n,
        **{c: np.zeros(n, dtype=np.float32) for c in TIME_COLUMNS},
        "started_at": np.full(n, now),
        "finished_at": np.full(n, now),
    }
    return pa.table({f.name: pa.array(columns[f.name], type=f.type) for f in MANIFEST_SCHEMA})


def columns(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """In-flight rows -> Ray Data's numpy batch format (bytes and strings as object arrays)."""
    out: dict[str, np.ndarray] = {}
    for name in rows[0]:
        values = [r[name] for r in rows]
        out[name] = np.array(values, dtype=object) if isinstance(values[0], (bytes, str)) else np.asarray(values)
    return out
