"""Engines, their agreement with ONNX Runtime, auto's choice, bf16's hardware gate, the GPU pool's
fail-fast and resource requests, and the cheap catalog-size paths against the exact one."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from maskray.operators import agreement, decode, encode, postprocess, preprocess
from maskray.operators.engines import ENGINES, EngineError, EngineSpec, installed, open_engine
from maskray.pipeline import engine_choice
from maskray.pipeline.cli import main
from maskray.pipeline.config import ConfigError, resolve_config
from maskray.pipeline.graph import GraphSpec, actor_resources
from maskray.pipeline.sizing import Reservations
from maskray.pipeline.sysinfo import has_bf16_hardware
from tests import images

INSTALLED_CPU = [e for e in ENGINES if e != "torch" and installed(e)]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Engine choices and compiled models go to a per-test cache, never the user's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def sample_tensors() -> np.ndarray:
    return np.concatenate(
        [
            preprocess.normalise(preprocess.resize_for_model(decode.decode_rgb(p.read_bytes(), 10**9)))
            for p in images.PHOTOS
        ]
    )


@pytest.fixture(scope="module")
def reference(model_bytes):
    tensors = sample_tensors()
    return tensors, agreement.masks_of(open_engine(model_bytes, EngineSpec()), tensors)[0]


def test_openvino_is_installed_by_setup():
    assert "openvino" in INSTALLED_CPU  # `make setup` installs the extra: its agreement is tested below


@pytest.mark.parametrize("name", INSTALLED_CPU)
def test_every_installed_engine_agrees_with_ort_on_the_samples(name, model_bytes, reference):
    tensors, ref = reference
    engine = open_engine(model_bytes, EngineSpec(name=name))
    masks, _ = agreement.masks_of(engine, tensors)
    found = agreement.compare(ref, masks, 0.0)
    print(f"{name}: {found.describe()}")
    assert found.passes("fp32"), found.describe()
    # one image at a time gives the batch's masks (the actor sends whole batches)
    one = agreement.masks_of(engine, tensors[:1])[0][0]
    assert np.array_equal(one, masks[0])


def test_openvino_runs_fp32_even_where_its_default_would_be_bf16(model_bytes):
    engine = open_engine(model_bytes, EngineSpec(name="openvino"))
    assert str(engine.compiled.get_property("INFERENCE_PRECISION_HINT")) in ("<Type: 'float32'>", "f32")
    assert engine.compiled.get_property("ENABLE_CPU_PINNING") is False


def cfg(**kw):
    return resolve_config({"input": "in", "output": "out", **kw}, environ={})


def test_auto_picks_an_agreeing_engine_and_says_why(model_bytes):
    choice = engine_choice.choose_engine(cfg(), model_bytes)
    assert choice.spec.name in INSTALLED_CPU and set(choice.checks) == set(INSTALLED_CPU)
    assert choice.checks["ort"].startswith("reference")
    assert all(c.startswith(("agrees", "reference")) for c in choice.checks.values()), choice.checks
    assert choice.reference.shape == (3, 320, 320) and choice.reference.dtype == np.uint8


class Perturbed:
    """An engine whose masks are visibly off (a shifted map): auto must not choose it, however fast."""

    def __init__(self, inner):
        self.inner, self.spec, self.version = inner, inner.spec, "test"

    def infer(self, batch):
        return np.roll(self.inner.infer(batch), 40, axis=2)


def test_auto_never_picks_an_engine_that_disagrees(model_bytes, monkeypatch):
    real = engine_choice.open_engine

    def fake(model, spec):
        engine = real(model, spec)
        return Perturbed(engine) if spec.name == "openvino" else engine

    monkeypatch.setattr(engine_choice, "open_engine", fake)
    choice = engine_choice.choose_engine(cfg(), model_bytes)
    assert choice.spec.name == "ort" and choice.checks["openvino"].startswith("disagrees")
    with pytest.raises(ConfigError, match="no engine passed the agreement check"):
        engine_choice.choose_engine(cfg(engine="openvino"), model_bytes)


def test_the_choice_is_cached_per_model_and_settings(model_bytes, tmp_path):
    first = engine_choice.cached_choice(cfg(), model_bytes, "md5-a")
    files = list((tmp_path / "cache" / "maskray" / "engine-choice").glob("*.npz"))
    assert len(files) == 1
    again = engine_choice.cached_choice(cfg(), model_bytes, "md5-a")
    assert again.label == first.label and np.array_equal(again.reference, first.reference)
    engine_choice.cached_choice(cfg(engine="ort"), model_bytes, "md5-a")
    assert len(list(files[0].parent.glob("*.npz"))) == 2  # other settings, another check


def test_bf16_is_refused_without_bf16_hardware_naming_the_flag():
    with pytest.raises(ConfigError, match="neither avx512_bf16 nor amx_bf16"):
        engine_choice.check_precision(cfg(precision="bf16"), flags=("avx2", "avx512f"))
    engine_choice.check_precision(cfg(precision="bf16"), flags=("avx512f", "avx512_bf16"))  # passes
    engine_choice.check_precision(cfg(precision="bf16"), flags=("amx_bf16",))
    with pytest.raises(ConfigError, match="engine ort runs fp32 only"):
        engine_choice.check_precision(cfg(precision="bf16", engine="ort"), flags=("amx_bf16",))


def test_bf16_cli_exits_2_before_reading_anything(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(engine_choice, "cpu_flags", lambda: ("avx2",))
    code = main(["run", "--input", str(tmp_path / "missing"), "--output", str(tmp_path / "o"), "--precision", "bf16"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "avx512_bf16" in err


@pytest.mark.skipif(not engine_choice.installed("openvino"), reason="needs the openvino extra")
def test_bf16_on_bf16_hardware_meets_the_agreement_gate_or_is_refused(model_bytes, monkeypatch):
    """With the hardware (faked where absent), bf16 runs the gate: IoU >= 0.98 on every check photo.
    On bf16 hardware maskray's bf16 (the heaviest convolutions only) passes it. Where the flag is
    faked, the CPU plugin turns the bf16 convolutions back to f32 and the engine itself refuses,
    never passing as bf16."""
    real_hardware = has_bf16_hardware()  # this CPU's own flags, read before they are faked
    monkeypatch.setattr(engine_choice, "cpu_flags", lambda: ("avx512_bf16",))
    try:
        choice = engine_choice.choose_engine(cfg(precision="bf16"), model_bytes)
    except ConfigError as exc:
        assert not real_hardware, f"bf16 refused on bf16 hardware: {exc}"
        assert "compiled f32 when bf16 was asked for" in str(exc), str(exc)
    else:
        assert real_hardware, "a bf16 engine passed on a CPU without bf16 hardware"
        assert choice.spec.precision == "bf16" and choice.checks[choice.spec.name].startswith("agrees")


@pytest.mark.skipif(not engine_choice.installed("openvino"), reason="needs the openvino extra")
def test_bf16_runs_only_the_heaviest_convolutions(model_bytes):
    """U2Net-P's four convolutions of >= 5% of its MACs each (67% together) are the bf16 ones, and
    the fp32 engine runs nothing in bf16 (OpenVINO's CPU default would be bf16 on this hardware)."""
    from maskray.operators import engines

    _, net = engines.read_openvino(model_bytes)
    convs = engines.convolutions(net)
    total = sum(engines.per_image_macs(c) for c in convs)
    assert len(convs) == 119 and round(total / 1e9, 2) == 19.76  # the 19.76 GMAC
    heavy = engines.bf16_convolutions(net)
    assert len(heavy) == 4 and round(sum(engines.per_image_macs(c) for c in heavy) / total, 2) == 0.67
    fp32 = open_engine(model_bytes, EngineSpec(name="openvino")).compiled
    assert "bf16" not in engines.runtime_precisions(fp32, set())["all"]
    if not has_bf16_hardware():
        return
    bf16 = open_engine(model_bytes, EngineSpec(name="openvino", precision="bf16")).compiled
    found = engines.runtime_precisions(bf16, {c.get_friendly_name() for c in heavy})
    assert found["islands"] == "bf16" and found["convolutions"] == "f32", found


@pytest.mark.skipif(not engine_choice.installed("openvino"), reason="needs the openvino extra")
def test_openvino_refuses_a_precision_it_did_not_compile():
    from maskray.operators.engines import check_compiled_precision

    bf16, fp32 = EngineSpec(name="openvino", precision="bf16"), EngineSpec(name="openvino")
    check_compiled_precision(bf16, {"islands": "bf16", "convolutions": "f32", "all": "bf16,f32,i32"})
    check_compiled_precision(fp32, {"islands": "", "convolutions": "f32", "all": "f32,i32"})
    with pytest.raises(EngineError, match="compiled f32 when bf16 was asked for"):
        check_compiled_precision(bf16, {"islands": "f32", "convolutions": "f32", "all": "f32,i32"})
    with pytest.raises(EngineError, match="compiled no convolution when bf16 was asked for"):
        check_compiled_precision(bf16, {"islands": "", "convolutions": "f32", "all": "f32,i32"})
    with pytest.raises(EngineError, match="beyond its bf16 convolutions"):
        check_compiled_precision(bf16, {"islands": "bf16", "convolutions": "bf16,f32", "all": "bf16,f32"})
    with pytest.raises(EngineError, match="compiled bf16 when fp32 was asked for"):
        check_compiled_precision(fp32, {"islands": "", "convolutions": "f32", "all": "bf16,f32"})


def test_cuda_on_a_machine_without_one_exits_2_before_reading_anything(tmp_path, capsys):
    if engine_choice.cuda_engines():
        pytest.skip("this machine has a CUDA engine")
    code = main(["run", "--input", str(tmp_path / "missing"), "--output", str(tmp_path / "o"), "--device", "cuda"])
    err = capsys.readouterr().err
    assert code == 2 and "device cuda: no CUDA device" in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_cuda_engines_refuse_to_start_without_a_device(model_bytes):
    if engine_choice.cuda_engines():
        pytest.skip("this machine has a CUDA engine")
    with pytest.raises(EngineError, match="CUDA|not installed"):
        open_engine(model_bytes, EngineSpec(name="ort", device="cuda"))
    with pytest.raises(EngineError):
        open_engine(model_bytes, EngineSpec(name="torch", device="cuda"))


def test_gpu_pool_requests_gpus():
    gpu = GraphSpec(2, Reservations(0.75, 0.25, 0.25, gpus_per_actor=0.5), 64, {}, cluster_cpus=16.0)
    cpu = GraphSpec(2, Reservations(0.75, 0.25, 0.25), 64, {}, cluster_cpus=16.0)
    assert actor_resources(gpu) == {"num_cpus": 0.75, "num_gpus": 0.5}
    assert actor_resources(cpu) == {"num_cpus": 0.75}


def test_cuda_defaults(monkeypatch):
    from maskray.pipeline import execution

    c = cfg(device="cuda")
    assert c.batch_size == 64 and cfg().batch_size == 4 and cfg(device="cuda", batch_size=8).batch_size == 8
    monkeypatch.setattr(execution, "cluster_gpus", lambda: 2.0)
    assert execution.pool_size(c, 16.0, started_locally=True) == 4  # 1 / 0.5 actors per GPU
    monkeypatch.setattr(execution, "cluster_gpus", lambda: 0.0)
    with pytest.raises(ConfigError, match="no GPU"):
        execution.pool_size(c, 16.0, started_locally=True)


# ------------------------------------------------------------ catalog-size photos: cheap paths


def jpeg_12mp(name: str, orientation: int | None = None) -> bytes:
    img = Image.open(images.SAMPLES / name).convert("RGB")
    size = (4000, 3000) if img.width >= img.height else (3000, 4000)
    buf = io.BytesIO()
    exif = Image.Exif()
    if orientation:
        exif[0x0112] = orientation
    img.resize(size, Image.LANCZOS).save(buf, "JPEG", quality=90, exif=exif.tobytes())
    return buf.getvalue()


@pytest.fixture(scope="module")
def ort_engine(model_bytes):
    return open_engine(model_bytes, EngineSpec())


def small_mask(engine, rgb):
    return agreement.masks_of(engine, preprocess.normalise(preprocess.resize_for_model(rgb)))[0][0]


@pytest.mark.parametrize("name", ["astronaut.jpg", "rocket.jpg"])
def test_cheap_writeback_agrees_with_the_exact_path_at_12mp(name, ort_engine):
    rgb = decode.decode_rgb(jpeg_12mp(name), 10**9)
    small = small_mask(ort_engine, rgb)
    exact = postprocess.resize_mask(small, rgb.size, "lanczos")
    cubic = postprocess.resize_mask(small, rgb.size, "cubic")
    mad, iou = agreement.mad(exact, cubic), agreement.iou(exact, cubic)
    print(f"{name}: cubic vs lanczos MAD {mad:.3f} IoU {iou:.5f}")
    assert cubic.shape == exact.shape and mad <= agreement.CHEAP_PATH_MAX_MAD and iou >= agreement.CHEAP_PATH_MIN_IOU
    png = encode.encode_mask_png(cubic, 1)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(png))), cubic)  # the fast PNG is lossless


def test_fast_decode_keeps_the_full_upright_size_and_stays_close(ort_engine):
    data = jpeg_12mp("astronaut.jpg", orientation=6)  # rotated 90 degrees by EXIF
    exact, size = decode.decode_for_model(data, 10**9)
    reduced, full = decode.decode_for_model(data, 10**9, reduce_to=preprocess.MODEL_SIZE)
    assert size == full == exact.size == (3000, 4000)
    assert reduced.size[0] < exact.size[0] and min(reduced.size) >= 320
    a = postprocess.resize_mask(small_mask(ort_engine, exact), full)
    b = postprocess.resize_mask(small_mask(ort_engine, reduced), full)
    mad, iou = agreement.mad(a, b), agreement.iou(a, b)
    print(f"fast decode vs exact at 12 MP: MAD {mad:.3f} IoU {iou:.5f}")
    # Outside the default gate on some photos (rocket: IoU 0.964), hence an option; close on this one.
    assert mad <= 1.0 and iou >= 0.99


@pytest.mark.skipif(not engine_choice.installed("openvino"), reason="needs the openvino extra")
def test_an_openvino_engine_sends_no_usage_telemetry_and_writes_nothing_home(tmp_path, model_path):
    """A plain ``import openvino`` forks a process that reports the import to Google Analytics and
    writes a client id to ``~/intel`` (OpenVINO 2026.4, no consent file, as on a fresh node). An
    engine opened the way an actor opens it must do neither. CI markers are dropped from the
    environment: openvino-telemetry stays quiet under them, which would hide a regression."""
    probe = (
        "import sys\n"
        "from pathlib import Path\n"
        "from maskray.operators.engines import EngineSpec, open_engine\n"
        f"open_engine(Path({model_path!r}).read_bytes(), EngineSpec(name='openvino'))\n"
        "import openvino.tools.ovc.telemetry_utils as used\n"
        "print(sys.modules.get('openvino_telemetry'), used.tm.__name__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TF_BUILD", "JENKINS_URL")}
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={**env, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.split() == ["None", "openvino.tools.ovc.telemetry_stub"]
    assert not (tmp_path / "intel").exists()
