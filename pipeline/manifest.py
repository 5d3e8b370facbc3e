"""The run's record: Parquet manifest parts written as rows arrive, and the summary.

``<output>/_manifest/<run_id>/part-00000.parquet ...``: one row per input the run saw (schema
``operators.stages.MANIFEST_SCHEMA``). Parts are flushed every ``flush_rows`` rows or
``flush_seconds``, so a crash loses at most that much of the record (the masks themselves are
already written, and a re-run reports them as skipped).
"""

from __future__ import annotations

import io
import json
import time
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from operators import storage
from operators.keys import MANIFEST_DIR, SUMMARY_NAME
from operators.stages import MANIFEST_SCHEMA, TIME_COLUMNS


def manifest_dir(output: str, run_id: str) -> str:
    return storage.join_uri(output, MANIFEST_DIR, run_id)


class ManifestWriter:
    def __init__(self, output: str, run_id: str, storage_options: dict, flush_rows: int = 512,
                 flush_seconds: float = 20.0) -> None:
        self.dir = manifest_dir(output, run_id)
        self.options = storage_options
        self.flush_rows, self.flush_seconds = flush_rows, flush_seconds
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
        self.parts = 0
        self.last_flush = time.monotonic()
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.stage_ms: Counter[str] = Counter()
        self.first_ok_at: float | None = None
        self.actors: set[str] = set()  # actor processes that served inference (restarts add more)

    def add(self, table: pa.Table) -> None:
        table = table.cast(MANIFEST_SCHEMA)
        self._count(table)
        self.pending.append(table)
        self.pending_rows += table.num_rows
        due = time.monotonic() - self.last_flush >= self.flush_seconds
        if self.pending_rows >= self.flush_rows or due:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        buf = io.BytesIO()
        pq.write_table(pa.concat_tables(self.pending), buf)
        uri = storage.join_uri(self.dir, f"part-{self.parts:05d}.parquet")
        storage.write_bytes_atomic(uri, buf.getvalue(), self.options)
        self.parts += 1
        self.pending, self.pending_rows, self.last_flush = [], 0, time.monotonic()

    def _count(self, table: pa.Table) -> None:
        self.counts.update(table.column("status").to_pylist())
        for status, error in zip(table.column("status").to_pylist(), table.column("error").to_pylist(), strict=False):
            if status == "error":
                self.errors[error_kind(error)] += 1
        for col in TIME_COLUMNS:
            self.stage_ms[col] += float(pc.sum(table.column(col)).as_py() or 0.0)
        self.actors.update(a for a in table.column("actor").to_pylist() if a)
        if self.first_ok_at is None and self.counts["ok"]:
            self.first_ok_at = time.time()

    @property
    def rows(self) -> int:
        return sum(self.counts.values())


def error_kind(error: str | None) -> str:
    """``decode: truncated image (...)`` -> ``decode``."""
    return (error or "unknown").split(":", 1)[0].strip()


def read_manifest(output: str, run_id: str, storage_options: dict) -> pa.Table:
    fs = storage.filesystem(output, storage_options)
    root = storage.strip_protocol(manifest_dir(output, run_id))
    paths = sorted(p for p in fs.find(root) if p.endswith(".parquet"))
    tables = [pq.read_table(io.BytesIO(fs.cat_file(p))) for p in paths]
    return pa.concat_tables(tables) if tables else MANIFEST_SCHEMA.empty_table()


def write_summary(output: str, summary: dict[str, Any], storage_options: dict) -> str:
    uri = storage.join_uri(output, SUMMARY_NAME)
    storage.write_bytes_atomic(uri, json.dumps(summary, indent=2, default=str).encode(), storage_options)
    return uri


def read_summary(output: str, storage_options: dict) -> dict[str, Any]:
    return json.loads(storage.read_bytes(storage.join_uri(output, SUMMARY_NAME), storage_options))
