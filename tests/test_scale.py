"""Catalog scale: inputs planned on the cluster, fingerprinted resume, duplicates, reused run ids."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from maskray.pipeline.cli import main
from maskray.pipeline.manifest import NO_MASKS_SUFFIX
from maskray.pipeline.plan import earlier_evidence
from tests import images

pytestmark = pytest.mark.usefixtures("ray_local")


def summary_and_rows(out: Path) -> tuple[dict, list[dict]]:
    summary = json.loads((out / "_summary.json").read_text())
    return summary, pq.read_table(out / "_manifest" / summary["run_id"]).to_pylist()


def photos(tmp_path: Path, n: int) -> Path:
    src = tmp_path / "in"
    src.mkdir()
    for p in images.PHOTOS[:n]:
        (src / p.name).write_bytes(p.read_bytes())
    return src


def run(src, out, *flags) -> tuple[int, dict, list[dict]]:
    code = main(["run", "--input", str(src), "--output", str(out), "--no-progress", *flags])
    return (code, *summary_and_rows(out))


def resolved(input_uri: str, output: str, expected_rows: int | None = None):
    from maskray.pipeline import plan

    spec = plan.check_input(input_uri, output, {})
    return plan.resolve(plan.raw_inputs(spec), spec, None, 4, expected_rows).materialize()


def planned(input_uri: str, output: str) -> tuple[int, dict[str, int]]:
    """Plan a run's inputs on Ray (no masking): how many rows, by decision."""
    ds = resolved(input_uri, output)
    counts = ds.groupby("decision").count().take_all()
    return ds.count(), {r["decision"]: r["count()"] for r in counts}


def test_a_small_plan_and_a_large_one_are_shuffled_differently_and_decide_alike(tmp_path):
    """A plan of a few rows takes the sort shuffle (no aggregator actors to wait for); one expected
    to be large streams into the default shuffle. Both give every source the same decision."""
    from ray.data import DataContext
    from ray.data.context import ShuffleStrategy

    listing = tmp_path / "list.txt"
    listing.write_text("gs://b/a.jpg\ngs://b/c.jpg\ngs://b/a.jpg\n")
    small = resolved(str(listing), str(tmp_path / "out"))
    large = resolved(str(listing), str(tmp_path / "out"), expected_rows=10**6)
    assert small.context.shuffle_strategy == ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
    assert large.context.shuffle_strategy == DataContext.get_current().shuffle_strategy
    assert DataContext.get_current().shuffle_strategy != ShuffleStrategy.SORT_SHUFFLE_PULL_BASED

    def decisions(ds):
        return sorted((r["source"], r["decision"]) for r in ds.take_all())

    assert decisions(small) == decisions(large)
    assert decisions(small) == [("gs://b/a.jpg", "duplicate"), ("gs://b/a.jpg", "todo"), ("gs://b/c.jpg", "todo")]


def test_a_200k_line_list_is_planned_without_growing_the_driver(tmp_path):
    """The list is read, de-duplicated and keyed in Ray tasks; the driver holds block references.
    (Before: ~1 KB of driver memory per input, so ~200 MB here.)"""
    listing = tmp_path / "list.txt"
    lines = [f"gs://shop/images/c{i % 97}/img{i:07d}.jpg" for i in range(200_000)]
    listing.write_text("# catalog\n" + "\n".join(lines + lines[:10]) + "\n")
    planned(str(listing), str(tmp_path / "warm"))  # Ray Data's own imports and first-use state
    before = psutil.Process().memory_info().rss
    n, decisions = planned(str(listing), str(tmp_path / "out"))
    grown = (psutil.Process().memory_info().rss - before) / 2**20
    assert n == 200_010 and decisions == {"todo": 200_000, "duplicate": 10}
    assert grown < 40, f"driver RSS grew {grown:.0f} MB while planning 200k inputs"


def test_every_kind_of_list_is_read_by_ray(tmp_path):
    """.txt (comments, blanks, relative entries), .csv and sharded .parquet lists, duplicates caught."""
    (tmp_path / "lists").mkdir()
    txt = tmp_path / "lists" / "l.txt"
    txt.write_text("# header\n\nrel/a.jpg\n/abs/b.jpg\n  /abs/b.jpg  \ngs://x/c.jpg\n")
    assert planned(str(txt), "gs://out/o") == (4, {"todo": 3, "duplicate": 1})
    csv = tmp_path / "lists" / "l.csv"
    csv.write_text("uri,label\ngs://x/a.jpg,1\ngs://x/b.jpg,2\ngs://x/a.jpg,3\n")
    assert planned(str(csv), "gs://out/o") == (3, {"todo": 2, "duplicate": 1})
    for i in range(3):
        pq.write_table(
            pa.table({"source": [f"s3://b/{i}/{j}.png" for j in range(1000)]}), tmp_path / "lists" / f"list-{i}.parquet"
        )
    # An entry under the output prefix is an error row, never an input.
    pq.write_table(pa.table({"source": ["s3://b/out/masks/x.png"]}), tmp_path / "lists" / "list-9.parquet")
    assert planned(str(tmp_path / "lists" / "list-*.parquet"), "s3://b/out") == (3001, {"todo": 3000, "unsafe": 1})


def test_relative_list_entries_resolve_against_the_list_folder(tmp_path):
    from maskray.pipeline.plan import resolve_entry

    assert resolve_entry("a/b.jpg", str(tmp_path)) == str(tmp_path / "a" / "b.jpg")
    assert resolve_entry("a/b.jpg", "gs://bkt/lists") == "gs://bkt/lists/a/b.jpg"
    assert resolve_entry("gs://o/k.jpg", str(tmp_path)) == "gs://o/k.jpg"


def test_duplicates_in_a_list_get_one_skipped_row_each(tmp_path):
    photo = tmp_path / "cat.jpg"
    photo.write_bytes((images.SAMPLES / "chelsea.jpg").read_bytes())
    listing = tmp_path / "list.txt"
    listing.write_text(f"{photo}\ncat.jpg\n./cat.jpg\n")  # one file, three spellings
    code, summary, rows = run(listing, tmp_path / "out")
    assert code == 0 and len(rows) == 3
    assert sorted(r["status"] for r in rows) == ["ok", "skipped", "skipped"]
    dups = [r for r in rows if r["status"] == "skipped"]
    assert all(r["error_kind"] == "duplicate" and r["source"] == str(photo) for r in dups)
    assert summary["skipped_by_kind"] == {"duplicate": 2}


def test_changing_any_fingerprinted_option_redoes_every_input(tmp_path):
    src = photos(tmp_path, 2)
    out = tmp_path / "out"
    mask = out / "masks" / f"{images.PHOTOS[0].name}.png"

    def statuses(*flags):
        code, summary, rows = run(src, out, *flags)
        assert code == 0 and len(rows) == 2
        return sorted(r["status"] for r in rows), {r["fingerprint"] for r in rows}

    first, prints = statuses()
    assert first == ["ok", "ok"] and len(prints) == 1
    soft = np.asarray(Image.open(mask))
    assert statuses() == (["skipped", "skipped"], prints)  # nothing changed: nothing redone
    # The next re-run reads only the first run's 2 ok rows of the 4 recorded: skipped rows restate
    # them, so re-running a done catalog does not make the evidence grow.
    assert len(pq.read_table(out / "_manifest").column("source")) == 4
    assert earlier_evidence(str(out), {}, next(iter(prints))).count() == 2
    # The re-run's part is named as recording no mask, and the next re-run does not even open it:
    # its bytes do not matter (restored after).
    (rerun_part,) = (out / "_manifest").glob(f"*/*{NO_MASKS_SUFFIX}")
    kept = rerun_part.read_bytes()
    rerun_part.write_bytes(b"not a parquet file")
    assert earlier_evidence(str(out), {}, next(iter(prints))).count() == 2
    rerun_part.write_bytes(kept)
    redone, ppm_prints = statuses("-ppm")
    assert redone == ["ok", "ok"] and ppm_prints != prints
    assert set(np.unique(np.asarray(Image.open(mask)))) <= {0, 255}
    # Back to the first settings: the files now hold -ppm masks, so they are redone, not kept.
    assert statuses()[0] == ["ok", "ok"]
    assert (np.asarray(Image.open(mask)) == soft).all()
    # png level and format together (each alone is covered by the fingerprint unit test below).
    cutout = out / "cutouts" / f"{images.PHOTOS[0].name}.png"
    assert statuses("--png-level", "9", "--format", "both")[0] == ["ok", "ok"] and cutout.exists()
    plain = np.asarray(Image.open(cutout))
    assert statuses("--png-level", "9", "--format", "both", "--bgcolor", "0,255,0,255")[0] == ["ok", "ok"]
    assert (np.asarray(Image.open(cutout)) != plain).any()  # the cutout was replaced, not kept


def test_a_reused_run_id_never_mixes_old_and_new_parts(tmp_path):
    src = photos(tmp_path, 3)
    out = tmp_path / "out"
    run(src, out, "--run-id", "same")
    first_parts = set((out / "_manifest" / "same").glob("part-*.parquet"))
    code, summary, rows = run(src, out, "--run-id", "same", "--overwrite")
    parts = set((out / "_manifest" / "same").glob("part-*.parquet"))
    assert code == 0 and len(rows) == 3 and all(r["status"] == "ok" for r in rows)
    assert parts and not parts & first_parts
    assert all(f"part-{summary['attempt']}-" in p.name for p in parts)


def test_earlier_runs_that_recorded_no_mask_leave_no_evidence(tmp_path):
    from maskray.pipeline import manifest
    from tests.test_manifest import part_table

    out = tmp_path / "out"
    manifest.write_part(manifest.manifest_dir(str(out), "failed"), "a", 0, part_table(["error", "skipped"]), {})
    assert earlier_evidence(str(out), {}, "fp") is None  # as if no run had been: everything is masked
    masked = part_table(["ok", "error"])
    masked = masked.set_column(masked.schema.get_field_index("fingerprint"), "fingerprint", pa.array(["fp", None]))
    manifest.write_part(manifest.manifest_dir(str(out), "later"), "b", 0, masked, {})
    assert earlier_evidence(str(out), {}, "fp").count() == 1  # the later run's ok row


def test_rows_from_before_fingerprints_count_as_unknown_not_done():
    """Manifests written before the fingerprint column: their outputs are redone once, not kept."""
    from maskray.pipeline.plan import evidence_rows

    old = pa.table({"source": ["/in/a.jpg"], "status": ["ok"], "finished_at": [1.0]})
    assert evidence_rows(old, "fp").num_rows == 0
    new = pa.table(
        {
            "source": ["/in/a.jpg", "/in/b.jpg", "/in/c.jpg", "/in/d.jpg"],
            "status": ["ok", "error", "ok", "skipped"],
            "fingerprint": ["fp", None, "other", "fp"],
            "finished_at": [1.0, 2.0, 3.0, 4.0],
        }
    )
    ev = evidence_rows(new, "fp").to_pylist()  # a skipped row restates an ok row: not evidence
    assert [(r["source"], r["t_any"], r["t_same"]) for r in ev] == [("/in/a.jpg", 1.0, 1.0), ("/in/c.jpg", 3.0, None)]


def test_no_storage_option_value_is_written_to_the_output_or_the_console(tmp_path, capsys):
    src = photos(tmp_path, 1)
    job = tmp_path / "job.yaml"
    job.write_text("storage_options:\n  secret: CANARY-7f3a9\n  token: CANARY-7f3a9-token\n")
    out = tmp_path / "out"
    assert main(["run", "--config", str(job), "--input", str(src), "--output", str(out), "--no-progress"]) == 0
    assert main(["report", str(out)]) == 0
    console = capsys.readouterr()
    assert "CANARY" not in console.out + console.err
    written = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "_config.yaml" for p in written) and any(p.name == "_report.html" for p in written)
    assert not [p for p in written if b"CANARY" in p.read_bytes()]
