"""Per-batch wrappers around the per-image operators; the pipeline maps these over batches.

Batches are dicts of numpy arrays (Ray Data's "numpy" format), one entry per image:

* ``prepare_batch``: ``source, key`` -> + ``mask_uri, cutout_uri, status, error, width, height,
  input_bytes, pre`` (320x320x3 uint8 as bytes), ``data`` (original bytes, cutouts only), times.
* inference (``operators.actor``): + ``small`` (320x320 uint8 mask as bytes), ``node``, ``infer_ms``.
* ``finish_batch``: resize, post-process, encode, write -> one manifest row per image.

Each image's failure is caught and becomes its row's ``status="error"`` with a one-line reason;
only a bug in this code can abort a batch. Status ``pending`` means "fine so far".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from operators import storage
from operators.decode import ImageError, decode_rgb
from operators.encode import encode_mask_png, encode_rgba_png
from operators.keys import CUTOUT_DIR, MASK_DIR, UnsafeKeyError, output_uri
from operators.postprocess import cutout, post_process_mask, resize_mask
from operators.preprocess import MODEL_SIZE, resize_for_model

STAGES = ("read", "decode", "preprocess", "infer", "postprocess", "encode", "write")
TIME_COLUMNS = tuple(f"{s}_ms" for s in STAGES)

MANIFEST_SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("output", pa.string()),
        ("cutout", pa.string()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("input_bytes", pa.int64()),
        ("node", pa.string()),
        ("actor", pa.string()),
        *[(c, pa.float32()) for c in TIME_COLUMNS],
        ("started_at", pa.float64()),
        ("finished_at", pa.float64()),
    ]
)


@dataclass(frozen=True)
class StageSettings:
    """The config fields the operators use (they never see the whole config)."""

    output: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    writes_mask: bool = True
    writes_cutout: bool = False
    overwrite: bool = False
    max_pixels: int = 64_000_000
    max_bytes: int = 256 * 1024 * 1024
    post_process_mask: bool = False
    bgcolor: tuple[int, int, int, int] | None = None
    png_level: int = 1


class Timer:
    """Accumulates elapsed milliseconds per stage name for one image."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}

    def run(self, stage: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            self.ms[stage] = self.ms.get(stage, 0.0) + (time.perf_counter() - t0) * 1000


# ---------------------------------------------------------------- prepare: read, decode, resize

def prepare_image(source: str, key: str, s: StageSettings) -> dict[str, Any]:
    """Everything before inference for one image; never raises for a bad input."""
    row: dict[str, Any] = _blank_row(source)
    timer = Timer()
    try:
        row["mask_uri"] = output_uri(s.output, MASK_DIR, key) if s.writes_mask else ""
        row["cutout_uri"] = output_uri(s.output, CUTOUT_DIR, key) if s.writes_cutout else ""
        if not s.overwrite and _outputs_exist(row, s):
            row["status"] = "skipped"
            return row
        data = timer.run("read", lambda: _fetch(source, s))
        row["input_bytes"] = len(data)
        rgb = timer.run("decode", lambda: decode_rgb(data, s.max_pixels))
        row["width"], row["height"] = rgb.size
        row["pre"] = timer.run("preprocess", lambda: resize_for_model(rgb).tobytes())
        row["data"] = data if s.writes_cutout else b""
        row["status"] = "pending"
    except (ImageError, UnsafeKeyError) as exc:
        _fail(row, str(exc))
    except FileNotFoundError:
        _fail(row, "read: not found")
    except Exception as exc:  # noqa: BLE001 - storage/permission errors are this input's row
        _fail(row, f"read: {_one_line(exc)}")
    finally:
        row.update({f"{k}_ms": v for k, v in timer.ms.items()})
    return row


def prepare_batch(batch: dict[str, np.ndarray], settings: StageSettings) -> dict[str, np.ndarray]:
    pairs = zip(batch["source"], batch["key"], strict=True)
    rows = [prepare_image(str(src), str(key), settings) for src, key in pairs]
    return _columns(rows)


def _fetch(source: str, s: StageSettings) -> bytes:
    fs = storage.filesystem(source, s.storage_options)
    path = storage.strip_protocol(source)
    size = storage.with_retries(lambda: fs.size(path))
    if size is not None and size > s.max_bytes:
        raise ImageError(f"too_large: {size} bytes > max_bytes ({s.max_bytes})")
    if size == 0:
        raise ImageError("empty: zero-byte file")
    return storage.with_retries(lambda: fs.cat_file(path))


def _outputs_exist(row: dict[str, Any], s: StageSettings) -> bool:
    wanted = [u for u in (row["mask_uri"], row["cutout_uri"]) if u]
    return all(storage.exists(u, s.storage_options) for u in wanted)


# ---------------------------------------------------------------- finish: resize, encode, write

def finish_image(row: dict[str, Any], s: StageSettings) -> dict[str, Any]:
    """Mask at full size, optional cutout, atomic writes; returns the manifest row."""
    timer = Timer()
    if row["status"] == "pending":
        try:
            _write_outputs(row, s, timer)
            row["status"] = "ok"
        except ImageError as exc:
            _fail(row, str(exc))
        except Exception as exc:  # noqa: BLE001
            _fail(row, f"write: {_one_line(exc)}")
    for k, v in timer.ms.items():
        row[f"{k}_ms"] = float(row.get(f"{k}_ms") or 0.0) + v
    return manifest_row(row)


def _write_outputs(row: dict[str, Any], s: StageSettings, timer: Timer) -> None:
    small = np.frombuffer(row["small"], dtype=np.uint8).reshape(MODEL_SIZE[1], MODEL_SIZE[0])
    size = (int(row["width"]), int(row["height"]))
    mask = timer.run("postprocess", lambda: resize_mask(small, size))
    if s.post_process_mask:
        mask = timer.run("postprocess", lambda: post_process_mask(mask))
    if s.writes_mask:
        png = timer.run("encode", lambda: encode_mask_png(mask, s.png_level))
        timer.run("write", lambda: storage.write_bytes_atomic(row["mask_uri"], png, s.storage_options))
    if s.writes_cutout:
        # Decoding again here is cheaper than carrying full-size pixels through the object store.
        rgb = timer.run("decode", lambda: decode_rgb(bytes(row["data"]), s.max_pixels))
        image = timer.run("postprocess", lambda: cutout(rgb, mask, s.bgcolor))
        png = timer.run("encode", lambda: encode_rgba_png(image, s.png_level))
        timer.run("write", lambda: storage.write_bytes_atomic(row["cutout_uri"], png, s.storage_options))


def finish_batch(batch: dict[str, np.ndarray], settings: StageSettings) -> pa.Table:
    n = len(batch["source"])
    rows = [finish_image({k: v[i] for k, v in batch.items()}, settings) for i in range(n)]
    return pa.Table.from_pylist(rows, schema=MANIFEST_SCHEMA)


def manifest_row(row: dict[str, Any]) -> dict[str, Any]:
    """Intermediate row -> fixed-schema manifest row (null output on failure, null error on success)."""
    status = str(row["status"])
    ok_or_skipped = status in ("ok", "skipped")
    out = {
        "source": str(row["source"]),
        "output": (str(row["mask_uri"]) or str(row["cutout_uri"]) or None) if ok_or_skipped else None,
        "cutout": (str(row["cutout_uri"]) or None) if ok_or_skipped else None,
        "status": status,
        "error": (str(row["error"]) or "unknown") if status == "error" else None,
        "width": int(row["width"]) or None,
        "height": int(row["height"]) or None,
        "input_bytes": int(row["input_bytes"]) or None,
        "node": str(row.get("node", "")) or None,
        "actor": str(row.get("actor", "")) or None,
        "started_at": float(row["started_at"]),
        "finished_at": time.time(),
    }
    out.update({c: float(row.get(c) or 0.0) for c in TIME_COLUMNS})
    return out


# ---------------------------------------------------------------- helpers

def _blank_row(source: str) -> dict[str, Any]:
    row: dict[str, Any] = {
        "source": source, "mask_uri": "", "cutout_uri": "", "status": "error", "error": "",
        "width": 0, "height": 0, "input_bytes": 0, "pre": b"", "data": b"", "started_at": time.time(),
    }
    row.update({c: 0.0 for c in TIME_COLUMNS})
    return row


def _fail(row: dict[str, Any], reason: str) -> None:
    row["status"], row["error"] = "error", reason
    row["pre"] = row["data"] = b""


def _columns(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name in rows[0]:
        values = [r[name] for r in rows]
        if isinstance(values[0], (bytes, str)):
            out[name] = np.array(values, dtype=object)
        else:
            out[name] = np.asarray(values)
    return out


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
