"""The tuning notebook, executed top to bottom on tiny inputs with papermill, and its YAML run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from maskray.pipeline.cli import main
from tests import images

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "tune_actor_pool.ipynb"
REQUIRED = (
    "input_uri",
    "sample_size",
    "pool_sizes",
    "threads_per_actor",
    "cpus_per_actor",
    "batch_sizes",
    "recommended_config_path",
)


def test_parameters_cell_declares_the_documented_parameters():
    nb = json.loads(NOTEBOOK.read_text())
    params = [c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", [])]
    assert len(params) == 1
    source = "".join(params[0]["source"])
    for name in REQUIRED:
        assert f"{name} =" in source


@pytest.mark.slow
def test_notebook_runs_and_its_recommendation_is_accepted(tmp_path):
    import papermill as pm

    photos = tmp_path / "photos"
    photos.mkdir()
    for p in images.PHOTOS[:3]:
        (photos / p.name).write_bytes(p.read_bytes())
    recommended = tmp_path / "recommended.yaml"
    executed = tmp_path / "executed.ipynb"
    pm.execute_notebook(
        str(NOTEBOOK),
        str(executed),
        cwd=str(tmp_path),
        kernel_name="python3",
        progress_bar=False,
        parameters={
            "input_uri": str(photos),
            "sample_size": 3,
            "pool_sizes": [1, 2],
            "threads_per_actor": [2],
            "cpus_per_actor": [0.5],
            "batch_sizes": [2],
            "output_for_config": str(tmp_path / "masks"),
            "recommended_config_path": str(recommended),
            "plots_dir": str(tmp_path / "plots"),
        },
    )
    nb = json.loads(executed.read_text())
    pngs = [o for c in nb["cells"] for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(pngs) >= 2  # throughput/memory and stage plots rendered
    assert (tmp_path / "plots" / "throughput_memory.png").exists() and (tmp_path / "plots" / "stages.png").exists()
    cfg = yaml.safe_load(recommended.read_text())
    assert cfg["pool_size"] in (1, 2) and cfg["input"] == str(photos)
    assert main(["run", "--config", str(recommended), "--no-progress"]) == 0
    assert len(list((tmp_path / "masks" / "masks").glob("*.png"))) == 3
