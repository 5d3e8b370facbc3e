"""Per-batch wrappers around the per-image operators; the graph maps these over batches.

Batches are dicts of numpy arrays (Ray Data's "numpy" format), one entry per image:

* ``prepare_batch``: ``source, key, size`` -> in-flight rows (``pipeline.rows.blank_row``) with
  ``pre`` (320x320x3 uint8 as bytes), ``data`` (original bytes, cutouts only) and stage times,
  yielded ``batch_size`` rows at a time.
* inference (``pipeline.actor``): + ``small`` (320x320 uint8 mask as bytes), ``node``, ``actor``.
* ``finish_batch``: resize, post-process, encode, write -> one manifest row per image.

Object storage answers each request in tens of milliseconds, so the fetches of a whole input
batch and the writes of a finished batch run on a small thread pool per worker process
(``io_threads``): one request's latency per batch instead of one per image. Each image's failure
becomes its row's ``status="error"`` with a kind and a one-line reason; only a bug in this code
can abort a batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from maskray.operators import storage
from maskray.operators.decode import ImageError, decode_for_model, decode_rgb
from maskray.operators.encode import encode_mask_png, encode_rgba_png
from maskray.operators.errors import one_line
from maskray.operators.keys import CUTOUT_DIR, MASK_DIR, UnsafeKeyError, output_uri
from maskray.operators.postprocess import cutout, post_process_mask, resize_mask
from maskray.operators.preprocess import MODEL_SIZE, resize_for_model
from maskray.pipeline import rows
from maskray.pipeline.config import RunConfig
from maskray.pipeline.rows import MANIFEST_SCHEMA, OK, PENDING
from maskray.pipeline.stopping import stopping


@dataclass(frozen=True)
class StageSettings:
    """The config fields the stages use (they never see the whole config); defaults live in
    ``RunConfig`` alone, so these are always built from one (``of``)."""

    output: str
    fingerprint: str
    storage_options: dict[str, Any]
    writes_mask: bool
    writes_cutout: bool
    max_pixels: int
    max_bytes: int
    post_process_mask: bool
    bgcolor: tuple[int, int, int, int] | None
    png_level: int
    mask_resize: str  # maskray.operators.postprocess.MASK_RESIZES
    fast_decode: bool  # JPEGs decoded at a reduced DCT scale for the model (not for cutouts)
    batch_size: int  # rows per prepared batch (what one inference call takes)
    io_threads: int  # concurrent storage requests per worker process; 1 = one at a time
    stop_key: str  # the run's stop flag (maskray.pipeline.stopping); "" = none

    @classmethod
    def of(cls, cfg: RunConfig, fingerprint: str, stop_key: str = "") -> StageSettings:
        return cls(
            output=cfg.output.rstrip("/"),
            fingerprint=fingerprint,
            storage_options=cfg.storage_options,
            writes_mask=cfg.writes_mask,
            writes_cutout=cfg.writes_cutout,
            max_pixels=cfg.max_pixels,
            max_bytes=cfg.max_bytes,
            post_process_mask=cfg.post_process_mask,
            bgcolor=cfg.bgcolor,
            png_level=cfg.png_level,
            mask_resize=cfg.mask_resize,
            fast_decode=cfg.fast_decode,
            batch_size=cfg.batch_size,
            io_threads=cfg.io_threads,
            stop_key=stop_key,
        )


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


_POOLS: dict[int, ThreadPoolExecutor] = {}


def io_map(fn: Callable[[Any], Any], items: list[Any], threads: int) -> list[Any]:
    """``[fn(x) for x in items]`` with up to ``threads`` running at once (one pool per process)."""
    if threads <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    pool = _POOLS.get(threads)
    if pool is None:
        pool = _POOLS[threads] = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="maskray-io")
    return list(pool.map(fn, items))


# ---------------------------------------------------------------- prepare: read, decode, resize


def fetch(source: str, size: int, s: StageSettings) -> bytes:
    """One GET. The size comes from the listing when there was one (no HEAD for it); for list
    entries the read is capped at ``max_bytes + 1`` so an oversized file is never held whole."""
    fs = storage.filesystem(source, s.storage_options)
    path = storage.object_path(source)
    if size > s.max_bytes:
        raise ImageError("too_large", f"{size} bytes > max_bytes ({s.max_bytes})")
    if size == 0:
        raise ImageError("empty", "zero-byte file")
    if size > 0:
        return storage.with_retries(lambda: fs.cat_file(path))
    data = storage.with_retries(lambda: fs.cat_file(path, start=0, end=s.max_bytes + 1))
    if len(data) > s.max_bytes:
        raise ImageError("too_large", f"more than max_bytes ({s.max_bytes})")
    return data


def read_reason(exc: BaseException, source: str) -> str:
    """Why a source could not be read, in a few words: ``not found``, ``http 404``, ``timeout``, ..."""
    web = storage.protocol_of(source) in storage.WEB_PROTOCOLS
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    if web and isinstance(status, int):
        return f"http {status}"
    if isinstance(exc, FileNotFoundError):
        return "http 404" if web else "not found"
    if isinstance(exc, TimeoutError) or "timeout" in type(exc).__name__.lower():
        return "timeout"
    return one_line(exc)


def start_row(source: str, key: str, size: int, s: StageSettings) -> dict[str, Any]:
    """The in-flight row with its output URIs, then its bytes (run on the I/O threads)."""
    row = rows.blank_row(source, key, size)
    timer = Timer()
    try:
        row["mask_uri"] = output_uri(s.output, MASK_DIR, key) if s.writes_mask else ""
        row["cutout_uri"] = output_uri(s.output, CUTOUT_DIR, key) if s.writes_cutout else ""
        row["data"] = timer.run("read", lambda: fetch(source, size, s))
        row["input_bytes"] = len(row["data"])
        row["status"] = PENDING
    except (ImageError, UnsafeKeyError) as exc:
        rows.fail(row, exc.kind, str(exc))
    except Exception as exc:  # noqa: BLE001 - storage/permission errors are this input's row
        rows.fail(row, "read", f"read: {read_reason(exc, source)}")
    row["read_ms"] = timer.ms.get("read", 0.0)
    return row


def decode_row(row: dict[str, Any], s: StageSettings) -> dict[str, Any]:
    """Decode and resize a fetched row to the model's input; never raises for a bad input."""
    if row["status"] != PENDING:
        return row
    timer = Timer()
    try:
        reduce_to = MODEL_SIZE if s.fast_decode and not s.writes_cutout else None
        rgb, (row["width"], row["height"]) = timer.run(
            "decode", lambda: decode_for_model(row["data"], s.max_pixels, reduce_to)
        )
        row["pre"] = timer.run("preprocess", lambda: resize_for_model(rgb).tobytes())
        if not s.writes_cutout:
            row["data"] = b""
    except ImageError as exc:
        rows.fail(row, exc.kind, str(exc))
    row.update({f"{k}_ms": v for k, v in timer.ms.items()})
    return row


def prepare_image(source: str, key: str, s: StageSettings, size: int = -1) -> dict[str, Any]:
    """Everything before inference for one image."""
    return decode_row(start_row(source, key, size, s), s)


def prepare_batch(
    batch: dict[str, np.ndarray], settings: StageSettings, fetch_rows: int = 0
) -> Iterator[dict[str, np.ndarray]]:
    """``prepare_rows`` for each ``fetch_rows`` rows of the input (0: all of it at once): a whole
    input block comes in one call when the graph takes blocks as batches."""
    n = len(batch["source"])
    step = fetch_rows or max(n, 1)
    for i in range(0, n, step):
        yield from prepare_rows({k: v[i : i + step] for k, v in batch.items()}, settings)


def prepare_rows(batch: dict[str, np.ndarray], settings: StageSettings) -> Iterator[dict[str, np.ndarray]]:
    """Fetch the rows concurrently, then decode and yield ``batch_size`` rows at a time,
    so inference can start on the first prepared batch while the rest decode. Once the run is
    stopping, nothing more: those inputs get no row in this run and the next run masks them."""
    if stopping(settings.stop_key):
        return
    items = list(zip(batch["source"], batch["key"], batch["size"], strict=True))
    started = io_map(lambda it: start_row(str(it[0]), str(it[1]), int(it[2]), settings), items, settings.io_threads)
    step = max(1, settings.batch_size)
    for i in range(0, len(started), step):
        if stopping(settings.stop_key):
            return
        yield rows.columns([decode_row(r, settings) for r in started[i : i + step]])


# ---------------------------------------------------------------- finish: resize, encode, write


def encode_outputs(row: dict[str, Any], s: StageSettings, timer: Timer) -> list[tuple[str, bytes]]:
    """Mask at full size and optional cutout, encoded: [(uri, png bytes)]."""
    small = np.frombuffer(row["small"], dtype=np.uint8).reshape(MODEL_SIZE[1], MODEL_SIZE[0])
    size = (int(row["width"]), int(row["height"]))
    mask = timer.run("postprocess", lambda: resize_mask(small, size, s.mask_resize))
    if s.post_process_mask:
        mask = timer.run("postprocess", lambda: post_process_mask(mask))
    out = []
    if s.writes_mask:
        out.append((row["mask_uri"], timer.run("encode", lambda: encode_mask_png(mask, s.png_level))))
    if s.writes_cutout:
        # Decoding again here is cheaper than carrying full-size pixels through the object store.
        rgb = timer.run("decode", lambda: decode_rgb(bytes(row["data"]), s.max_pixels))
        image = timer.run("postprocess", lambda: cutout(rgb, mask, s.bgcolor))
        out.append((row["cutout_uri"], timer.run("encode", lambda: encode_rgba_png(image, s.png_level))))
    return out


def write_outputs(row: dict[str, Any], encoded: list[tuple[str, bytes]], s: StageSettings) -> None:
    """Atomic writes of one image's outputs (run on the I/O threads); a failure is its row's."""
    timer = Timer()
    try:
        for uri, png in encoded:
            timer.run("write", partial(storage.write_bytes_atomic, uri, png, s.storage_options))
        row["status"] = OK
    except Exception as exc:  # noqa: BLE001
        rows.fail(row, "write", f"write: {one_line(exc)}")
    row["write_ms"] = float(row.get("write_ms") or 0.0) + timer.ms.get("write", 0.0)


def finish_rows(batch_rows: list[dict[str, Any]], s: StageSettings) -> list[dict[str, Any]]:
    """Encode each pending row here, write them all concurrently, and return manifest rows."""
    writes = []
    for row in batch_rows:
        if row["status"] != PENDING:
            continue
        timer = Timer()
        try:
            writes.append((row, encode_outputs(row, s, timer)))
        except ImageError as exc:
            rows.fail(row, exc.kind, str(exc))
        except Exception as exc:  # noqa: BLE001
            rows.fail(row, "write", f"write: encode: {one_line(exc)}")
        for k, v in timer.ms.items():
            row[f"{k}_ms"] = float(row.get(f"{k}_ms") or 0.0) + v
    io_map(lambda w: write_outputs(w[0], w[1], s), writes, s.io_threads)
    return [rows.manifest_row(r, s.fingerprint) for r in batch_rows]


def finish_image(row: dict[str, Any], s: StageSettings) -> dict[str, Any]:
    return finish_rows([row], s)[0]


def finish_batch(batch: dict[str, np.ndarray], settings: StageSettings) -> pa.Table:
    n = len(batch["source"])
    batch_rows = [{k: v[i] for k, v in batch.items()} for i in range(n)]
    return pa.Table.from_pylist(finish_rows(batch_rows, settings), schema=MANIFEST_SCHEMA)


# ---------------------------------------------------------------- decided without the image

_DECIDED = {  # decision -> (status, error_kind, error)
    "done": (rows.SKIPPED, rows.DONE, None),
    "duplicate": (rows.SKIPPED, rows.DUPLICATE, rows.DUPLICATE_REASON),
    "unsafe": (rows.ERROR, "unsafe_source", "unsafe_source: lies under the output prefix"),
    "local": (
        rows.ERROR,
        "unsafe_source",
        "unsafe_source: a local path in a list read from a bucket "
        "(each worker would read its own disk; pass --allow-local-sources to allow it)",
    ),
    "scheme": (rows.ERROR, "read", "read: unsupported scheme (supported: gs://, s3://, http(s)://, local paths)"),
    "ignored": (rows.IGNORED, None, None),
}


def decided_batch(batch: pa.Table, s: StageSettings) -> pa.Table:
    """Manifest rows for inputs the plan decided (skipped, unsafe, ignored): no image is read."""
    decisions = batch.column("decision").to_pylist()
    keys = batch.column("key").to_pylist()
    outcome = [_DECIDED[d] for d in decisions]
    done = [d == "done" for d in decisions]
    mask = [output_uri(s.output, MASK_DIR, k) if d and s.writes_mask else None for d, k in zip(done, keys, strict=True)]
    cut = [
        output_uri(s.output, CUTOUT_DIR, k) if d and s.writes_cutout else None for d, k in zip(done, keys, strict=True)
    ]
    sizes = [v if v is not None and v >= 0 else None for v in batch.column("size").to_pylist()]
    return rows.decided_rows(
        batch.column("source").to_pylist(),
        [o[0] for o in outcome],
        [o[1] for o in outcome],
        [o[2] for o in outcome],
        [m or c for m, c in zip(mask, cut, strict=True)],
        cut,
        [s.fingerprint if d else None for d in done],
        sizes,
    )
