"""`make bench`'s harness on a tiny input: the ceiling and maskray contenders, one round, real
model and real Ray. Checks the outputs it promises, not speed (speed is for the benchmark)."""

from __future__ import annotations

import json

import pytest

from bench import bench


@pytest.mark.slow
def test_bench_writes_table_json_and_chart(tmp_path, capsys):
    assert bench.main(["--images", "8", "--rounds", "1", "--only", "maskray", "--results", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    assert set(data["table"]) == {"ceiling", "maskray"}
    ceiling, maskray = data["table"]["ceiling"], data["table"]["maskray"]
    # Every run is divided by the ceiling probes taken just before and after it.
    assert all(r["ceiling_nearby"] > 0 for rs in data["runs"].values() for r in rs)
    # The ceiling's own paired ratio is exactly one; maskray's is a real, positive figure.
    assert ceiling["fraction_of_ceiling"] == {"min": 1.0, "median": 1.0, "max": 1.0}
    assert maskray["fraction_of_ceiling"]["median"] > 0
    assert 0 < maskray["images_per_second"]["median"] and maskray["cold_start_s"] > 0
    assert 0 < maskray["latency_p50_ms"] <= maskray["latency_p95_ms"]
    # 8 masks are too few for a steady-state figure: it is reported as missing, not made up.
    assert maskray["steady_images_per_second"]["median"] is None
    # The process tree's CPU time, split: the actors' share is real, so is the rest's (the driver
    # and Ray's own processes at least); the ceiling runs no actors, so it has no split.
    assert 0 < maskray["cpu_outside_infer_share"] < 1
    assert ceiling["cpu_outside_infer_share"] is None
    assert maskray["cost_per_million_usd"] > ceiling["cost_per_million_usd"] > 0
    md = (tmp_path / "bench.md").read_text()
    assert "| maskray |" in md and md in capsys.readouterr().out
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "work").exists()


def test_settings_comparisons_run_only_when_named():
    defaults = bench.default_contenders(bf16_hardware=True)
    assert "maskray" in defaults and "maskray-batch2" not in defaults
    assert set(bench.OPTIONAL) <= set(bench.CONTENDERS)


def test_bf16_contenders_need_bf16_hardware():
    bf16 = ["ceiling-openvino-bf16", "maskray-bf16"]
    assert set(bf16) <= set(bench.default_contenders(bf16_hardware=True))
    assert not set(bf16) & set(bench.default_contenders(bf16_hardware=False))
    assert bench.refused_contenders(["maskray", *bf16], bf16_hardware=False) == bf16
    assert bench.refused_contenders(bf16, bf16_hardware=True) == []


def test_cpu_kind_is_the_first_kind_a_process_showed():
    idle, actor = "ray::IDLE", "ray::MapWorker(MapBatches(InferenceActor))"
    assert bench.cpu_kind(idle) == "ray and driver"
    assert bench.cpu_kind(idle, bench.cpu_kind(actor)) == "inference"
    task = bench.cpu_kind("ray::MapBatches(prepare_batch)")
    assert task == "image tasks" and bench.cpu_kind(idle, task) == "image tasks"
    assert bench.cpu_kind("ray::MapBatches(finish_batch)") == "image tasks"
    assert bench.cpu_kind("ray::_StatsActor") == "ray and driver"


def test_catalog_photos_bench_prints_every_step_and_the_gate(capsys):
    from bench import catalog_photos

    assert catalog_photos.main(["--megapixels", "0.2", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("| 0.2 |") == 7  # six photos and their mean
    assert "mask PNG ms libpng / maskray" in out
    # The verdicts: one per cheap path, each naming its worst case against the gate.
    assert out.count("0.2 MP cubic: worst MAD") == 1 and out.count("0.2 MP fast_decode: worst MAD") == 1


@pytest.mark.slow
def test_startup_bench_pairs_both_import_orders(capsys):
    """One pair of the cheap measure (``maskray run`` itself is covered everywhere else)."""
    from bench import startup

    assert startup.main(["--rounds", "1", "--first-mask-rounds", "0", "--warm-rounds", "0"]) == 0
    out = capsys.readouterr().out
    section = out.split("imports + connect, 1 pairs", 1)[1]
    for order in (startup.DURING, startup.FIRST):
        assert float(section.split(order, 1)[1].split("median", 1)[1].split()[0]) > 0
    assert "of 1 pairs; median pair gain" in section
    assert "first mask" not in out
