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


def items_dataset(items: pa.Table, batch_size: int) -> ray.data.Dataset:
    """One block per batch: every block is a separately schedulable unit, so masks start
    flowing after one batch rather than one large block, and a retried task redoes little."""
    slices = [items.slice(i, batch_size) for i in range(0, items.num_rows, batch_size)]
    return ray.data.from_arrow(slices or [items])


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
    ds = items_dataset(items, spec.batch_size)
    tasks = TaskPoolStrategy(size=cpu_task_slots(spec))
    ds = ds.map_batches(  # read + decode + resize to 320x320 uint8 (the float tensor is built in the actor)
        prepare_batch, fn_kwargs={"settings": settings}, batch_size=spec.batch_size,
        batch_format="numpy", num_cpus=spec.decode_cpus, compute=tasks,
    )
    ds = ds.map_batches(  # fp32 U2Net-P, one single-threaded session per actor
        InferenceActor,
        fn_constructor_kwargs={"model": model_ref, "session_options": spec.session_options},
        compute=ActorPoolStrategy(size=spec.pool_size), batch_size=spec.batch_size,
        batch_format="numpy", num_cpus=spec.cpus_per_actor,
    )
    return ds.map_batches(  # full-size mask, optional cutout, PNG encode, atomic write -> manifest rows
        finish_batch, fn_kwargs={"settings": settings}, batch_size=spec.batch_size,
        batch_format="numpy", num_cpus=spec.write_cpus, compute=tasks,
    )
