"""Wire the Ray Data graph: planned inputs -> prepare tasks -> fixed inference pool -> finish tasks
-> manifest sink; inputs the plan already decided (skipped, unsafe, ignored) go straight to the sink.

Stage resources (the defaults fit a 2-CPU machine: 2 x 0.75 for the pool + 0.25 + 0.25):
- prepare (fetch, decode, resize): CPU tasks reserving ``decode_cpus`` each;
- inference: ``ActorPoolStrategy(size=pool)`` so every actor starts at once (an autoscaling
  pool that starts at 1 often never grows), each reserving ``cpus_per_actor`` (< 1, so the
  decode and write tasks always find room; a stage asking for a whole CPU beside a pool that
  leaves only a fraction deadlocks silently);
- finish (resize mask, encode, write): CPU tasks reserving ``write_cpus`` each;
- the decided rows and the manifest writes: light tasks with a small reservation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import ray
from ray.data import ActorPoolStrategy, TaskPoolStrategy
from ray.data.dataset import MaterializedDataset

from maskray.operators.preprocess import MODEL_SIZE
from maskray.pipeline.actor import InferenceActor
from maskray.pipeline.plan import TODO
from maskray.pipeline.sizing import Reservations, batch_size_for, task_slots
from maskray.pipeline.stages import StageSettings, decided_batch, finish_batch, prepare_batch

# CPU reservation of the light stages (decided rows, manifest parts): they must never wait long
# for a slot beside the pool and the decode/write tasks.
LIGHT_CPUS = 0.05


@dataclass(frozen=True)
class GraphSpec:
    pool_size: int
    res: Reservations
    batch_size: int
    engine: dict[str, Any]  # maskray.operators.engines.EngineSpec's fields
    engine_label: str = ""
    reference: Any = None  # reference masks an actor on a GPU checks its engine against
    cluster_cpus: float = 0.0

    @property
    def task_slots(self) -> int:
        return task_slots(self.pool_size, self.res, self.cluster_cpus)


# Input blocks of the image graph: enough for every decode task slot to hold several, and no more.
# Each block costs the driver memory (`bench/plan_memory.py`: +127 MB for 2000 blocks of a 1M-input
# plan), so their number follows the cluster, not the catalog.
MIN_INPUT_BLOCKS, BLOCKS_PER_TASK_SLOT = 16, 8
# A prepare task fetches this many inference batches at once (their requests overlap).
FETCH_BATCHES = 4


def max_input_blocks(spec: GraphSpec) -> int:
    return max(MIN_INPUT_BLOCKS, BLOCKS_PER_TASK_SLOT * spec.task_slots)


def rows_per_input_block(n: int, batch_size: int, max_blocks: int) -> int:
    """One batch per block up to ``max_blocks`` blocks, then whole batches per block."""
    return batch_size * max(1, math.ceil(n / (batch_size * max_blocks)))


def prepared_batch_bytes(batch_size: int) -> int:
    """Ray Data's target block size for this graph: just under one prepared batch.

    A task's output is cut into a new block once it exceeds the target, so each prepared batch
    (``batch_size`` x 320x320x3 uint8 plus small columns) leaves its decode task as soon as it is
    ready and the pool never waits for a whole input block to be decoded. Blocks are sliced only
    above 1.5x the target, so a batch is not split unless it carries large originals (cutouts).
    """
    return int(batch_size * MODEL_SIZE[0] * MODEL_SIZE[1] * 3 * 0.9)


def split_decisions(resolved: ray.data.Dataset) -> tuple[ray.data.Dataset, ray.data.Dataset]:
    """(inputs to mask, inputs already decided), from the materialized plan."""

    def pick(todo: bool):
        def keep(t: pa.Table) -> pa.Table:
            is_todo = pc.equal(t.column("decision"), TODO)
            return t.filter(is_todo if todo else pc.invert(is_todo))

        return keep

    todo = resolved.map_batches(pick(True), batch_format="pyarrow", batch_size=None, num_cpus=LIGHT_CPUS)
    decided = resolved.map_batches(pick(False), batch_format="pyarrow", batch_size=None, num_cpus=LIGHT_CPUS)
    return todo, decided


def fetch_rows_for(n: int, batch: int, pool_size: int) -> int:
    """Rows a prepare task fetches at once: several batches when there is work for every actor."""
    return batch * FETCH_BATCHES if n >= batch * FETCH_BATCHES * pool_size else batch


def input_blocks(todo: ray.data.Dataset, n: int, spec: GraphSpec) -> MaterializedDataset:
    """The inputs to mask in blocks of whole prepare batches, at most ~``max_input_blocks`` of them
    (``n`` is an upper bound of their number: the plan's rows, decided ones included).

    A streaming repartition (by rows per block): the split-and-combine kind (``num_blocks=``)
    costs the driver about twice as much (`bench/plan_memory.py`: +247 vs +127 MB for 2000
    blocks). Done before the pool starts, as its tasks ask for a whole CPU, which a pool could
    leave no room for.
    """
    batch = batch_size_for(n, spec.batch_size, spec.pool_size)
    rows = rows_per_input_block(n, fetch_rows_for(n, batch, spec.pool_size), max_input_blocks(spec))
    return todo.repartition(target_num_rows_per_block=rows).materialize()


# Inputs that go first, one per block, so that the first actors' first batches are one image
# each: an actor infers its whole batch before any of it is written, so the first mask waited for
# four inferences (~2.4 s on an AVX2 core). Only the first few actors need one.
LEAD_ROWS = 8


def batches_are_blocks(settings: StageSettings) -> bool:
    """Whether each prepared batch leaves its task as one block, so that the pool and the writes
    can take blocks as they come (``batch_size=None``) and a one-row lead block stays a one-image
    batch. Rows with cutouts carry their original bytes, and Ray Data slices such blocks (above
    1.5x ``prepared_batch_bytes``): those stages re-bundle ``batch`` rows instead."""
    return not settings.writes_cutout


def lead_rows_first(blocks: MaterializedDataset, n: int, k: int) -> ray.data.Dataset:
    """``blocks`` (``n`` rows) with its first ``k`` rows as blocks of one row each, ahead of the rest.

    Ray Data bundles a map's input up to its ``batch_size``, so a smaller first batch needs
    stages that take blocks as batches (``batches_are_blocks``). ``split_at_indices`` splits only
    the block the rows are in and keeps every other block's metadata (``from_arrow_refs`` would
    ask a task per block: thousands on a large cluster). Without ``preserve_order`` a union emits
    blocks as its inputs give them, so the lead blocks, given first, go first
    (``tests/test_pipeline_local.py`` checks the order).
    """
    k = min(k, n - 1)
    if k < 1:
        return blocks
    *lead, rest = blocks.split_at_indices(list(range(1, k + 1)))
    return lead[0].union(*lead[1:], rest)


def image_graph(
    todo: MaterializedDataset, n: int, model_ref: ray.ObjectRef, settings: StageSettings, spec: GraphSpec
) -> ray.data.Dataset:
    """``n`` inputs to mask (``input_blocks``) -> one manifest row each."""
    batch = batch_size_for(n, spec.batch_size, spec.pool_size)
    fetch_rows = fetch_rows_for(n, batch, spec.pool_size)
    ds: ray.data.Dataset = todo
    # No more task slots than blocks: a tiny run needs no idle slots (and Ray Data warns of them).
    tasks = TaskPoolStrategy(size=min(spec.task_slots, todo.num_blocks()))
    stage = StageSettings(**{**settings.__dict__, "batch_size": batch})
    whole = batches_are_blocks(settings)
    if whole:
        ds = lead_rows_first(todo, n, min(spec.pool_size, LEAD_ROWS))
    ds = ds.map_batches(  # fetch (concurrently) + decode + resize to 320x320 uint8, `batch` rows per output
        prepare_batch,
        fn_kwargs={"settings": stage, "fetch_rows": fetch_rows if whole else 0},
        batch_size=None if whole else fetch_rows,
        batch_format="numpy",
        num_cpus=spec.res.decode_cpus,
        compute=tasks,
    )
    ds = ds.map_batches(  # fp32 U2Net-P, one single-threaded engine per actor (or one GPU share)
        InferenceActor,
        fn_constructor_kwargs={
            "model": model_ref,
            "engine": spec.engine,
            "label": spec.engine_label,
            "reference": spec.reference,
            "stop_key": settings.stop_key,
        },
        compute=ActorPoolStrategy(size=spec.pool_size),
        batch_size=None if whole else batch,
        batch_format="numpy",
        **actor_resources(spec),
    )
    return ds.map_batches(  # full-size mask, optional cutout, PNG encode, concurrent atomic writes -> rows
        finish_batch,
        fn_kwargs={"settings": stage},
        batch_size=None if whole else batch,
        batch_format="numpy",
        num_cpus=spec.res.write_cpus,
        compute=tasks,
    )


def actor_resources(spec: GraphSpec) -> dict[str, float]:
    """What each inference actor reserves: a CPU share, plus a GPU share on a GPU pool (only GPU
    nodes have ``GPU``, so a cluster's CPU nodes keep decoding and writing)."""
    resources = {"num_cpus": spec.res.cpus_per_actor}
    if spec.res.gpus_per_actor:
        resources["num_gpus"] = spec.res.gpus_per_actor
    return resources


def decided_graph(decided: ray.data.Dataset, settings: StageSettings) -> ray.data.Dataset:
    return decided.map_batches(
        decided_batch, fn_kwargs={"s": settings}, batch_format="pyarrow", batch_size=None, num_cpus=LIGHT_CPUS
    )
