"""The Ray Data sink that writes the manifest: one Parquet part per write task, and its statistics.

See ``pipeline.manifest`` for the layout. ``write_parquet`` would write the same files, but
returns nothing to the driver; a ``Datasink`` hands each write task's return value to
``on_write_complete``, which is how the run's statistics reach the driver without its rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from ray.data import Datasink
from ray.data.block import BlockAccessor

from maskray.pipeline.manifest import (
    ROWS_PER_PART,
    block_stats,
    empty_stats,
    manifest_dir,
    merge_stats,
    write_part,
)
from maskray.pipeline.rows import IGNORED, MANIFEST_SCHEMA


class ManifestSink(Datasink):
    """Ray Data sink: each write task writes one Parquet part and returns its statistics."""

    def __init__(
        self, output: str, run_id: str, attempt: str, storage_options: dict, rows_per_part: int = ROWS_PER_PART
    ) -> None:
        self.dir = manifest_dir(output, run_id)
        self.attempt = attempt
        self.options = storage_options
        self.rows_per_part = rows_per_part
        self.stats = empty_stats()

    @property
    def min_rows_per_write(self) -> int:
        return self.rows_per_part

    def write(self, blocks: Iterable[Any], ctx: Any) -> dict[str, Any]:
        tables = [BlockAccessor.for_block(b).to_arrow() for b in blocks]
        tables = [t.select(MANIFEST_SCHEMA.names).cast(MANIFEST_SCHEMA) for t in tables if t.num_rows]
        table = pa.concat_tables(tables) if tables else MANIFEST_SCHEMA.empty_table()
        is_ignored = pc.equal(table.column("status"), IGNORED)
        ignored = int(pc.sum(is_ignored).as_py() or 0)
        table = table.filter(pc.invert(is_ignored))
        if table.num_rows:
            write_part(self.dir, self.attempt, ctx.task_idx, table, self.options)
        return block_stats(table, ignored)

    def on_write_complete(self, write_result: Any) -> None:
        self.stats = merge_stats(write_result.write_returns)
