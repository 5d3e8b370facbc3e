"""Pool size, task slots, worker limit and the fit check (``pipeline/sizing.py``): pure, no Ray."""

from __future__ import annotations

import math
import os

import pytest

from maskray.pipeline import sizing
from maskray.pipeline.config import ConfigError, resolve_config
from maskray.pipeline.execution import pool_size
from maskray.pipeline.graph import GraphSpec, max_input_blocks, rows_per_input_block
from maskray.pipeline.sizing import Reservations

DEFAULTS = Reservations(0.75, 0.25, 0.25)


def config(**flags):
    return resolve_config({"input": "a", "output": "b", **flags}, environ={})


def test_a_pool_that_cannot_fit_fails_fast_and_never_exceeds_the_inputs():
    with pytest.raises(ConfigError, match=r"3 actors x 0.75 CPU \+ decode 0.25 \+ write 0.25 = 2.75 CPUs do not fit"):
        pool_size(config(pool_size=3), 2.0, started_locally=True)
    assert pool_size(config(), 2.0, True) == 2
    assert pool_size(config(), 2.0, True, inputs=1) == 1
    # A pool that cannot fit is refused whatever the input.
    with pytest.raises(ConfigError, match="do not fit"):
        pool_size(config(pool_size=3), 2.0, started_locally=True, inputs=1)
    # A cluster may grow: no fit check there.
    assert pool_size(config(pool_size=64), 2.0, started_locally=False) == 64


def test_the_fit_is_exact_at_the_edge():
    assert sizing.cpus_needed(2, DEFAULTS) == 2.0
    assert sizing.fits(2, DEFAULTS, 2.0) and not sizing.fits(3, DEFAULTS, 2.0)
    assert not sizing.fits(2, Reservations(1.0, 0.25, 0.25), 2.0)  # 1-CPU actors leave no room


@pytest.mark.parametrize(
    ("cluster_cpus", "pool", "expected"),
    [
        (2.0, 2, 1),  # 2 x 0.75 + one decode + one write slot is the whole machine
        (384.0, 384, 48),  # one slot per ~8 actors, well inside the 96 CPUs left beside the pool
        (2.0, 16, 1),  # pool waiting for the autoscaler: sized for the cluster it asked for
        (8.0, 4, 2),
    ],
)
def test_task_slots_always_leave_room_for_writes(cluster_cpus, pool, expected):
    """Decode runs ahead of inference; if its tasks could hold every spare CPU, no write could
    start until all inputs were decoded."""
    slots = sizing.task_slots(pool, DEFAULTS, cluster_cpus)
    assert slots == expected
    planned = max(cluster_cpus, pool * 0.75 + 0.5)
    assert pool * 0.75 + slots * 0.5 <= planned + 1e-9


def test_a_gpu_pool_keeps_every_free_cpu_decoding():
    gpu = Reservations(0.75, 0.25, 0.25, gpus_per_actor=0.5)
    assert sizing.task_slots(2, gpu, 16.0) == 14  # one decode and one write task per CPU beside the pool
    assert sizing.task_slots(2, DEFAULTS, 16.0) == 2
    assert sizing.default_pool(gpu, cpus=16.0, gpus=2.0) == 4
    assert sizing.default_pool(DEFAULTS, cpus=16.0, gpus=2.0) == 16


def test_idle_workers_kept_cover_the_pool_and_every_task_slot():
    # 2 CPUs / 0.25 = 8 fractional task slots, + 2 actors, + 4 spare
    assert sizing.worker_soft_limit(2, DEFAULTS, None) == 14
    assert sizing.worker_soft_limit(2, DEFAULTS, 1) == 13


def test_input_blocks_are_whole_batches_and_capped_by_the_cluster():
    assert rows_per_input_block(10, 4, 16) == 4
    for n in (16 * 4, 16 * 4 + 1, 1_000_000):
        rows = rows_per_input_block(n, 4, 16)
        assert rows % 4 == 0 and math.ceil(n / rows) <= 16
    # The cap follows the cluster's decode slots, not the catalog.
    assert max_input_blocks(GraphSpec(2, DEFAULTS, 4, {}, cluster_cpus=2.0)) == 16
    big = GraphSpec(320, Reservations(1.15, 0.25, 0.25), 4, {}, cluster_cpus=384.0)
    assert max_input_blocks(big) == 8 * big.task_slots > 16


def test_fewer_inputs_than_a_batch_per_actor_get_smaller_batches_spread_over_the_pool():
    assert [sizing.batch_size_for(n, 4, 2) for n in (1, 2, 3, 6, 7, 8, 100)] == [1, 1, 2, 3, 4, 4, 4]
    assert sizing.batch_size_for(5, 4, 16) == 1


def test_the_notebook_sweep_uses_the_runs_own_fit_check():
    from maskray.pipeline.tuning import Trial, fits

    ok = Trial("pool_size", 2, {"pool_size": 2, "cpus_per_actor": 0.75, "intra_op_threads": 1, "batch_size": 4})
    too_big = Trial("pool_size", 3, {**ok.settings, "pool_size": 3})
    assert fits(ok, 2.0, can_grow=False) and not fits(too_big, 2.0, can_grow=False)
    assert fits(too_big, 2.0, can_grow=True)


def test_parquet_footer_readers_follow_the_cluster_and_a_users_setting_wins(monkeypatch):
    from maskray.pipeline.execution import FOOTER_READERS_ENV, footer_readers_for

    assert [sizing.footer_readers(c) for c in (0, 2, 16, 384, 50 * 384)] == [1, 1, 2, 32, 32]
    monkeypatch.delenv(FOOTER_READERS_ENV, raising=False)
    with footer_readers_for(16.0):
        assert os.environ[FOOTER_READERS_ENV] == "2"  # what read_parquet, called here, reads
    assert FOOTER_READERS_ENV not in os.environ  # not left behind for the next run in this process
    monkeypatch.setenv(FOOTER_READERS_ENV, "7")
    with footer_readers_for(2.0):
        assert os.environ[FOOTER_READERS_ENV] == "7"
    assert os.environ[FOOTER_READERS_ENV] == "7"
