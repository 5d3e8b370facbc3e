"""The full pipeline on local folders, on a real local Ray with the real model."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from maskray.pipeline.cli import main
from tests import images
from tests.conftest import write_catalog
from tests.rembg_reference import agreement, reference_mask

pytestmark = pytest.mark.usefixtures("ray_local")


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.md5(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


def load_manifest(out: Path, run_id: str | None = None):
    summary = json.loads((out / "_summary.json").read_text())
    run = run_id or summary["run_id"]
    table = pq.read_table(out / "_manifest" / run)
    return summary, table.to_pylist()


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    root = tmp_path_factory.mktemp("catalog") / "in"
    files = write_catalog(root)
    return root, files


@pytest.fixture(scope="module")
def first_run(catalog, tmp_path_factory):
    root, files = catalog
    before = tree_digest(root)
    out = tmp_path_factory.mktemp("run") / "out"
    code = main(["run", "--input", str(root), "--output", str(out), "--no-progress", "--run-id", "first"])
    return root, files, out, code, before


def test_every_input_has_exactly_one_row_and_bad_ones_fail_with_reasons(first_run):
    root, files, out, code, _ = first_run
    assert code == 3  # completed, some inputs failed
    summary, rows = load_manifest(out)
    image_keys = {k for k in files if not k.endswith(".txt")}
    assert sorted(r["source"] for r in rows) == sorted(str(root / k) for k in image_keys)
    by_key = {Path(r["source"]).relative_to(root).as_posix(): r for r in rows}
    for key, (_, reason) in images.bad_inputs().items():
        assert by_key[key]["status"] == "error" and by_key[key]["error"].startswith(reason), by_key[key]
        assert by_key[key]["output"] is None
    good = [r for k, r in by_key.items() if k not in images.bad_inputs()]
    assert all(r["status"] == "ok" and r["error"] is None for r in good)
    assert summary["inputs"] == len(image_keys) and summary["failed"] == len(images.bad_inputs())
    assert summary["ok"] == len(good) and summary["ignored_non_image_objects"] == 1
    assert summary["model"]["md5"] == "8e83ca70e441ab06c318d82300c84806"
    assert "cpu_flags" in summary["machine"] and summary["config"]["pool_size"] is None
    assert summary["cluster"]["pool_size"] == 2
    assert all(r["infer_ms"] > 0 and r["decode_ms"] > 0 and r["write_ms"] > 0 for r in good)


def test_masks_are_rembgs_and_keep_structure(first_run, model_bytes):
    import onnxruntime as ort

    root, files, out, _, _ = first_run
    sess = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    for key in [k for k in files if k.endswith((".jpg", ".png")) and not k.startswith(("bad/", "variants/"))]:
        mask_file = out / "masks" / (key + ".png")
        mask = Image.open(mask_file)
        assert mask.mode == "L"
        ref = reference_mask(files[key], sess)
        assert mask.size == (ref.shape[1], ref.shape[0])
        mad, iou = agreement(np.asarray(mask), ref)
        print(f"{key}: MAD {mad:.4f} IoU {iou:.4f}")
        assert mad < 1.0 and iou > 0.98
    rotated = Image.open(out / "masks" / "variants" / "rotated.jpg.png")
    assert rotated.size == images.photo().size  # orientation-corrected size


def test_nothing_written_under_the_input(first_run):
    root, _, _, _, before = first_run
    assert tree_digest(root) == before


def test_rerun_skips_done_and_retries_failed_then_overwrite_redoes(first_run):
    root, files, out, _, _ = first_run
    (root / "bad" / "truncated.jpg").write_bytes((images.SAMPLES / "coffee.jpg").read_bytes())  # fixed
    mtime = (out / "masks" / "chelsea.jpg.png").stat().st_mtime_ns
    try:
        code = main(["run", "--input", str(root), "--output", str(out), "--no-progress", "--run-id", "second"])
        summary, rows = load_manifest(out, "second")
        status = {Path(r["source"]).relative_to(root).as_posix(): r["status"] for r in rows}
        assert status["bad/truncated.jpg"] == "ok"
        assert status["chelsea.jpg"] == "skipped"
        assert summary["ok"] == 1 and summary["failed"] == len(images.bad_inputs()) - 1 and code == 3
        assert (out / "masks" / "chelsea.jpg.png").stat().st_mtime_ns == mtime
        code = main(
            ["run", "--input", str(root), "--output", str(out), "--no-progress", "--run-id", "third", "--overwrite"]
        )
        summary, _ = load_manifest(out, "third")
        assert summary["skipped"] == 0 and summary["ok"] == summary["inputs"] - summary["failed"]
    finally:
        (root / "bad" / "truncated.jpg").write_bytes(files["bad/truncated.jpg"])


def test_interrupted_write_is_not_mistaken_for_done(first_run, tmp_path):
    """A leftover temp file (the only trace an interrupted local write can leave) is not a mask,
    and no manifest row says it was done: the next run masks the image."""
    root, _, _, _, _ = first_run
    out = tmp_path / "out"
    partial = out / "masks" / ".coffee.jpg.png.deadbeef.tmp"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"\x89PNG partial")
    main(["run", "--input", str(root), "--output", str(out), "--no-progress", "--run-id", "fourth"])
    _, rows = load_manifest(out, "fourth")
    row = next(r for r in rows if r["source"].endswith("/coffee.jpg"))
    assert row["status"] == "ok" and Image.open(out / "masks" / "coffee.jpg.png").size == (600, 400)


def test_cutouts_with_bgcolor_and_ppm(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "cat.jpg").write_bytes((images.SAMPLES / "chelsea.jpg").read_bytes())
    out = tmp_path / "out"
    code = main(
        [
            "run",
            "--input",
            str(src),
            "--output",
            str(out),
            "--no-progress",
            "--format",
            "both",
            "--bgcolor",
            "0,255,0,255",
            "-ppm",
        ]
    )
    assert code == 0
    mask = np.asarray(Image.open(out / "masks" / "cat.jpg.png"))
    assert set(np.unique(mask)) <= {0, 255}  # post-processed masks are binary
    cut = Image.open(out / "cutouts" / "cat.jpg.png")
    assert cut.mode == "RGBA" and cut.size == (451, 300)
    px = np.asarray(cut)
    assert (px[mask == 0][:, :3] == [0, 255, 0]).all()


def test_list_input_txt_and_csv(tmp_path, catalog):
    root, _ = catalog
    listing = tmp_path / "list.txt"
    listing.write_text(
        f"{root / 'chelsea.jpg'}\n# a comment\n{root / 'nested/deeper/clock.jpg'}\n"
        f"{root / 'chelsea.jpg'}\n{root / 'missing.jpg'}\n"
    )
    out = tmp_path / "out"
    code = main(["run", "--input", str(listing), "--output", str(out), "--no-progress"])
    summary, rows = load_manifest(out)
    assert code == 3 and len(rows) == 4 and summary["ok"] == 2 and summary["skipped"] == 1
    miss = next(r for r in rows if r["source"].endswith("missing.jpg"))
    assert miss["error"] == "read: not found"
    assert (out / "masks" / "file" / str(root / "chelsea.jpg").lstrip("/")).with_suffix(".jpg.png").exists()
    csv = tmp_path / "list.csv"
    csv.write_text(f"path,label\n{root / 'coffee.jpg'},cup\n")
    assert main(["run", "--input", str(csv), "--output", str(tmp_path / "out2"), "--no-progress"]) == 0


def test_input_blocks_are_whole_batches(ray_local):
    """The inputs to mask are cut into blocks of whole prepare batches (Ray Data's repartition)."""
    import pyarrow as pa
    import ray

    from maskray.pipeline.graph import GraphSpec, input_blocks
    from maskray.pipeline.sizing import Reservations

    todo = ray.data.from_arrow(pa.table({"source": [f"s{i}" for i in range(10)], "key": [f"k{i}" for i in range(10)]}))
    blocks = input_blocks(todo, 10, GraphSpec(2, Reservations(0.75, 0.25, 0.25), 4, {}, cluster_cpus=2.0))
    assert blocks.num_blocks() == 3 and blocks.count() == 10


def test_the_first_inputs_go_one_per_block_so_each_first_actor_infers_one_image_first(ray_local):
    """Where prepared batches are blocks, the first rows (one for each of the first actors) are
    blocks of their own, given ahead of the rest, so the first masks wait for one inference, not a
    batch of four; no input is lost or repeated. With cutouts the stages re-bundle instead."""
    import pyarrow as pa
    import ray

    from maskray.pipeline.config import resolve_config
    from maskray.pipeline.graph import GraphSpec, batches_are_blocks, input_blocks, lead_rows_first
    from maskray.pipeline.sizing import Reservations
    from maskray.pipeline.stages import StageSettings

    sources = [f"s{i:02d}" for i in range(40)]
    todo = ray.data.from_arrow(pa.table({"source": sources, "key": sources}))
    blocks = input_blocks(todo, 40, GraphSpec(2, Reservations(0.75, 0.25, 0.25), 4, {}, cluster_cpus=2.0))
    ds = lead_rows_first(blocks, 40, 3)
    given = [b.num_rows() for b in ds.iter_internal_ref_bundles()]
    assert given[:3] == [1, 1, 1] and sum(given) == 40 and len(given) == blocks.num_blocks() + 3
    assert sorted(r["source"] for r in ds.take_all()) == sources
    tiny = input_blocks(todo.limit(1), 1, GraphSpec(2, Reservations(0.75, 0.25, 0.25), 4, {}, cluster_cpus=2.0))
    assert lead_rows_first(tiny, 1, 3).count() == 1  # nothing to split off a single input

    def settings(fmt: str) -> StageSettings:
        return StageSettings.of(resolve_config({"input": "in", "output": "out", "format": fmt}), "fp")

    assert batches_are_blocks(settings("mask"))
    assert not batches_are_blocks(settings("cutout")) and not batches_are_blocks(settings("both"))


def test_a_block_of_many_batches_still_feeds_every_actor(tmp_path, monkeypatch, data_context):
    """When a catalog is big enough that input blocks hold many batches, each prepared batch must
    still leave its decode task as its own block: otherwise one actor gets the whole block while
    the rest of the pool idles."""
    import maskray.pipeline.graph

    monkeypatch.setattr(maskray.pipeline.graph, "MIN_INPUT_BLOCKS", 1)  # every input in one block
    monkeypatch.setattr(maskray.pipeline.graph, "BLOCKS_PER_TASK_SLOT", 1)
    src = tmp_path / "in"
    src.mkdir()
    for i in range(16):
        (src / f"{i:02d}.jpg").write_bytes((images.SAMPLES / "chelsea.jpg").read_bytes())
    out = tmp_path / "out"
    assert main(["run", "--input", str(src), "--output", str(out), "--no-progress", "--batch-size", "2"]) == 0
    _, rows = load_manifest(out)
    assert len(rows) == 16 and all(r["status"] == "ok" for r in rows)
    assert len({r["actor"] for r in rows}) == 2
