"""How much of everything a run starts, and whether it fits: the inference pool's size, the decode
and write task slots beside it, how many idle worker processes Ray keeps, and the fit check.

The one place for these numbers: the run (``execution``, ``graph``), the notebook's sweeps
(``tuning``) and the tests all call these functions. No Ray here: callers pass the cluster's
CPUs and GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from maskray.pipeline.config import ConfigError, RunConfig

# Float slack: 2 x 0.75 + 0.25 + 0.25 must fit 2 CPUs exactly.
EPS = 1e-9


@dataclass(frozen=True)
class Reservations:
    """What each stage reserves from Ray's scheduler (fractions of a CPU or GPU)."""

    cpus_per_actor: float
    decode_cpus: float
    write_cpus: float
    gpus_per_actor: float = 0.0  # > 0: the pool runs on GPUs

    @classmethod
    def of(cls, cfg: RunConfig) -> Reservations:
        return cls(
            cfg.cpus_per_actor, cfg.decode_cpus, cfg.write_cpus, cfg.gpus_per_actor if cfg.device == "cuda" else 0.0
        )


def cpus_needed(pool: int, res: Reservations) -> float:
    """The pool's reservations plus one decode and one write task: what must fit to make progress.
    A stage that cannot get a slot beside the pool deadlocks silently (no error, no progress)."""
    return pool * res.cpus_per_actor + res.decode_cpus + res.write_cpus


def fits(pool: int, res: Reservations, cpus: float) -> bool:
    return cpus_needed(pool, res) <= cpus + EPS


def check_fit(pool: int, res: Reservations, cpus: float) -> None:
    """A config that cannot run on a fixed-size (local) cluster: one line naming the sum."""
    if not fits(pool, res, cpus):
        raise ConfigError(
            f"pool_size: {pool} actors x {res.cpus_per_actor} CPU + decode {res.decode_cpus} + write "
            f"{res.write_cpus} = {cpus_needed(pool, res):g} CPUs do not fit this machine's {cpus:g} CPUs "
            "(the run would hang)"
        )


def default_pool(res: Reservations, cpus: float, gpus: float) -> int:
    """One single-threaded session per CPU (the measured best for throughput on CPUs); on GPUs,
    ``1 / gpus_per_actor`` actors per GPU."""
    if res.gpus_per_actor:
        return max(1, int(gpus / res.gpus_per_actor + EPS))
    return max(1, int(cpus))


def pool_for_inputs(pool: int, inputs: int) -> int:
    """Never more actors than inputs: each would load a model copy only to sit idle."""
    return max(1, min(pool, inputs))


def task_slots(pool: int, res: Reservations, cluster_cpus: float) -> int:
    """Concurrent decode (and write) tasks. A batch of 4 decodes in ~60 ms and infers in ~2 s
    per actor, so one task slot keeps ~8 actors fed; more slots only start more worker processes,
    whose imports compete with inference, most of all at start-up.

    Never more than fit beside the pool with one slot of each stage: decode runs ahead of
    inference, so if its tasks may take every spare CPU, no write task can start until all
    inputs are decoded (the first mask waits, writes come in bursts).

    A GPU pool is the exception: each GPU actor infers hundreds of images a second, so every CPU
    that fits decodes and writes for it.
    """
    pool_cpus = pool * res.cpus_per_actor
    planned = max(cluster_cpus, cpus_needed(pool, res))  # growth beyond the cluster is requested
    fit = int((planned - pool_cpus + EPS) // (res.decode_cpus + res.write_cpus))
    if res.gpus_per_actor:  # one decode and one write task per free CPU: at most 2x oversubscribed
        return max(1, min(int(planned - pool_cpus), fit))
    return max(1, min(max(2, math.ceil(pool / 8)), fit))


def worker_soft_limit(cpus: float, res: Reservations, pool: int | None) -> int:
    """How many idle worker processes a local Ray keeps alive.

    Ray's default is the CPU count, and it kills idle workers above it after a second. The pool's
    actors count against that limit, so with a pool of one actor per CPU every decode and write
    task would start a fresh Python worker (seconds of imports each, taken from inference).
    Keep enough workers for the pool plus every fractional task slot.
    """
    return int(cpus / min(res.decode_cpus, res.write_cpus)) + (pool or int(cpus)) + 4


def batch_size_for(n: int, batch_size: int, pool: int) -> int:
    """The configured batch size, or smaller when there are fewer inputs than a batch per actor.

    Ray Data bundles small blocks up to a map's batch size, so 6 images at batch size 4 would
    go 4 + 2 to two actors, and 3 images all to one while the other idles: spread them instead.
    """
    if 0 < n < batch_size * pool:
        return math.ceil(n / min(n, pool))
    return batch_size


# Ray Data 2.60 reads Parquet footers (earlier manifests, Parquet lists) on a pool of actors, 32
# whatever the cluster's size (``RAY_DATA_PARQUET_FOOTER_NUM_ACTORS``). On a small cluster
# starting them costs far more than the reads (`bench/evidence_growth.py`, figures in the README's
# "At catalog scale"). One actor (128 concurrent reads) per 8 CPUs present when the plan is made
# (the actors are placed then), up to Ray's 32.
FOOTER_READERS_MAX = 32


def footer_readers(cluster_cpus: float) -> int:
    return max(1, min(FOOTER_READERS_MAX, int(cluster_cpus // 8)))
