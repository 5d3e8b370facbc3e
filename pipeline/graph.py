"""Wire the Ray Data graph: items -> prepare tasks -> fixed inference pool -> finish tasks.

Stage resources (the defaults fit a 2-CPU machine: 2 x 0.75 for the pool + 0.25 + 0.25):
- prepare (read, decode, resize): CPU tasks reserving ``decode_cpus`` each;
- inference: ``ActorPoolStrategy(size=pool)`` so every actor starts at once (an autoscaling
  pool that starts at 1 often never grows), each reserving ``cpus_per_actor`` (< 1, so the
  decode and write tasks always find room; a stage asking for a whole CPU beside a pool that
  leaves only a fraction deadlocks silently);
- finish (resize mask, encode, write): CPU tasks reserving ``write_cpus`` each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import ray
from ray.data import ActorPoolStrategy, TaskPoolStrategy

from operators.actor import InferenceActor
from operators.preprocess import MODEL_SIZE
from operators.stages import StageSettings, finish_batch, prepare_batch


@dataclass(frozen=True)
class GraphSpec:
    pool_size: int
    cpus_per_actor: float
    decode_cpus: float
    write_cpus: float
    batch_size: int
    session_options: dict[str, Any]
    cluster_cpus: float = 0.0


# Building the dataset costs the driver one object-store put per input block (~1-2 ms each on a
# 2-CPU box): cap the count so a million-image catalog starts in seconds, not minutes.
MAX_INPUT_BLOCKS = 2000


def rows_per_input_block(n: int, batch_size: int) -> int:
    """One batch per block up to MAX_INPUT_BLOCKS blocks, then whole batches per block."""
    return batch_size * max(1, math.ceil(n / (batch_size * MAX_INPUT_BLOCKS)))


def batch_size_for(n: int, batch_size: int, pool_size: int) -> int:
    """The configured batch size, or smaller when there are fewer inputs than a batch per actor.

    Ray Data bundles small blocks up to a map's batch size, so 6 images at batch size 4 would
    go 4 + 2 to two actors, and 3 images all to one while the other idles: spread them instead.
    """
    if 0 < n < batch_size * pool_size:
        return math.ceil(n / min(n, pool_size))
    return batch_size


def items_dataset(items: pa.Table, batch_size: int) -> ray.data.Dataset:
    """Input blocks of whole batches, built on the driver with no Ray task per block.

    ``from_arrow`` on a list of tables runs one metadata task per table (measured here: 2.3 s for
    300 images, i.e. O(n) tasks); ``from_blocks`` computes the metadata locally and keeps the
    block count. Every block is a separately schedulable unit, so the first masks flow after one
    batch, and a block holding many batches still streams one output block per batch (see
    ``prepared_batch_bytes``).
    """
    rows = rows_per_input_block(items.num_rows, batch_size)
    return ray.data.from_blocks([items.slice(i, rows) for i in range(0, items.num_rows, rows)] or [items])


def prepared_batch_bytes(batch_size: int) -> int:
    """Ray Data's target block size for this graph: just under one prepared batch.

    A task's output is cut into a new block once it exceeds the target, so each prepared batch
    (``batch_size`` x 320x320x3 uint8 plus small columns) leaves its decode task as soon as it is
    ready and the pool never waits for a whole input block to be decoded. Blocks are sliced only
    above 1.5x the target, so a batch is not split unless it carries large originals (cutouts).
    """
    return int(batch_size * MODEL_SIZE[0] * MODEL_SIZE[1] * 3 * 0.9)


def cpu_task_slots(spec: GraphSpec) -> int:
    """Concurrent decode (and write) tasks. A batch of 4 decodes in ~60 ms and infers in ~2 s
    per actor, so one task slot keeps ~8 actors fed; more slots only start more worker processes,
    whose imports (~1.7 s of CPU each) compete with inference, most of all at start-up.

    Never more than fit beside the pool with one slot of each stage: decode runs ahead of
    inference, so if its tasks may take every spare CPU, no write task can start until all
    inputs are decoded (seen here: on 2 CPUs the first mask waited ~3 s, writes came in bursts).
    """
    pool_cpus = spec.pool_size * spec.cpus_per_actor
    planned = max(spec.cluster_cpus, pool_cpus + spec.decode_cpus + spec.write_cpus)  # growth is requested
    fit = int((planned - pool_cpus + 1e-9) // (spec.decode_cpus + spec.write_cpus))
    return max(1, min(max(2, math.ceil(spec.pool_size / 8)), fit))


def build_graph(
    items: pa.Table, model_ref: ray.ObjectRef, settings: StageSettings, spec: GraphSpec
) -> ray.data.Dataset:
    batch = batch_size_for(items.num_rows, spec.batch_size, spec.pool_size)
    ds = items_dataset(items, batch)
    # No more task slots than blocks: a tiny run needs no idle slots (and Ray Data warns of them).
    tasks = TaskPoolStrategy(size=min(cpu_task_slots(spec), ds.num_blocks()))
    ds = ds.map_batches(  # read + decode + resize to 320x320 uint8 (the float tensor is built in the actor)
        prepare_batch, fn_kwargs={"settings": settings}, batch_size=batch,
        batch_format="numpy", num_cpus=spec.decode_cpus, compute=tasks,
    )
    ds = ds.map_batches(  # fp32 U2Net-P, one single-threaded session per actor
        InferenceActor,
        fn_constructor_kwargs={"model": model_ref, "session_options": spec.session_options},
        compute=ActorPoolStrategy(size=spec.pool_size), batch_size=batch,
        batch_format="numpy", num_cpus=spec.cpus_per_actor,
    )
    return ds.map_batches(  # full-size mask, optional cutout, PNG encode, atomic write -> manifest rows
        finish_batch, fn_kwargs={"settings": settings}, batch_size=batch,
        batch_format="numpy", num_cpus=spec.write_cpus, compute=tasks,
    )
