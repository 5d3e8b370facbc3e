"""The "first version" contender: maskray's own operators wired with Ray Data's defaults.

Differences from maskray.pipeline.graph, on purpose: ``from_items`` blocks from rows taken to the driver,
Ray Data's default block size, default 1-CPU tasks, an autoscaling actor pool that starts at 1
(no ``compute=``), and ONNX
Runtime's default thread count (0 = all cores per session). Everything else (manifest, summary) is maskray's.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ray  # noqa: E402

from maskray.pipeline import execution  # noqa: E402
from maskray.pipeline.actor import InferenceActor  # noqa: E402
from maskray.pipeline.config import resolve_config  # noqa: E402
from maskray.pipeline.run import execute  # noqa: E402
from maskray.pipeline.stages import finish_batch, prepare_batch  # noqa: E402


def naive_graph(todo, n, model_ref, settings, spec):
    ds = ray.data.from_items(todo.take_all())  # the plan on the driver, as a first version would
    ds = ds.map_batches(prepare_batch, fn_kwargs={"settings": settings}, batch_format="numpy")
    ds = ds.map_batches(
        InferenceActor,
        fn_constructor_kwargs={"model": model_ref, "engine": {"threads": 0, "inter_op_threads": 0}},
        batch_format="numpy",
    )
    return ds.map_batches(finish_batch, fn_kwargs={"settings": settings}, batch_format="numpy")


def naive_data_context(cfg) -> None:
    """Ray Data's own defaults (block size, ordering), progress bars off as for every contender."""
    ray.data.DataContext.get_current().enable_progress_bars = False


def main() -> int:
    execution.image_graph = naive_graph
    execution.input_blocks = lambda todo, n, spec: todo
    execution.configure_data_context = naive_data_context
    cfg = resolve_config({"input": sys.argv[1], "output": sys.argv[2], "progress": False, "pool_size": 1})
    result = execute(cfg)
    print(result.summary["images_per_second"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
