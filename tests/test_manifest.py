"""The run's record as files: parts laid out so that a re-run reads only what it needs."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from maskray.pipeline import manifest
from maskray.pipeline.rows import MANIFEST_SCHEMA


def part_table(statuses: list[str | None]) -> pa.Table:
    n = len(statuses)
    cols = {"source": pa.array([f"/in/{i}.jpg" for i in range(n)]), "status": pa.array(statuses, pa.string())}
    return pa.table({f.name: cols.get(f.name, pa.nulls(n, f.type)) for f in MANIFEST_SCHEMA})


def test_a_part_keeps_every_row_with_one_row_group_per_status_ok_first(tmp_path):
    table = part_table(["skipped", "ok", "error", None, "ok", "skipped"])
    path = tmp_path / "part.parquet"
    path.write_bytes(manifest.part_bytes(table))

    back = pq.read_table(path)
    assert back.schema == MANIFEST_SCHEMA
    assert sorted(back.column("source").to_pylist()) == sorted(table.column("source").to_pylist())
    meta = pq.ParquetFile(path).metadata
    status_col = MANIFEST_SCHEMA.names.index("status")
    groups = [meta.row_group(i).column(status_col).statistics for i in range(meta.num_row_groups)]
    assert [(g.min, g.max) if g.has_min_max else None for g in groups] == [
        ("ok", "ok"),
        ("error", "error"),
        ("skipped", "skipped"),
        None,  # the null-status rows: kept, never read as evidence
    ]
    # What a re-run's scan does with the filter Ray pushes down: only the ok row group is left.
    fragment = next(pads.dataset(path, format="parquet").get_fragments())
    kept = fragment.subset(filter=pads.field("status") == "ok")
    assert [rg.id for rg in kept.row_groups] == [0]
