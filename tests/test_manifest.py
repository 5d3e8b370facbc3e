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


def test_a_part_is_named_by_whether_it_records_masks_and_a_rewrite_leaves_one_part(tmp_path):
    run_dir = str(tmp_path / "run")
    done = manifest.write_part(run_dir, "att", 7, part_table(["skipped", "error", None]), {})
    assert done.endswith("part-att-000007-nomasks.parquet") and not manifest.may_record_masks(done)
    # A retried write task whose rows changed (a failed read that now succeeds) takes the other
    # name and removes the first: the run never holds two parts for one task.
    redone = manifest.write_part(run_dir, "att", 7, part_table(["skipped", "ok", None]), {})
    assert redone.endswith("part-att-000007.parquet") and manifest.may_record_masks(redone)
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["part-att-000007.parquet"]
    assert manifest.may_record_masks("part-0a1b-000003.parquet")  # named before the flag: may hold ok rows


def test_the_run_record_is_every_part_whatever_its_name(tmp_path):
    run_dir = manifest.manifest_dir(str(tmp_path), "r")
    manifest.write_part(run_dir, "att", 0, part_table(["ok", "skipped"]), {})
    manifest.write_part(run_dir, "att", 1, part_table(["skipped", "skipped"]), {})
    parts = manifest.run_parts(str(tmp_path), "r", "att", {})
    assert [p.rsplit("/", 1)[-1] for p in parts] == ["part-att-000000.parquet", "part-att-000001-nomasks.parquet"]
    rows = manifest.read_manifest(str(tmp_path), {"run_id": "r", "attempt": "att"}, {})
    assert rows.num_rows == 4
