"""Operators on their own, without Ray: decode guards, rembg-exact math, post-processing."""

from __future__ import annotations

import io

import cv2
import numpy as np
import onnxruntime as ort
import pytest
from PIL import Image

from maskray.operators import decode, encode, postprocess, preprocess, session
from maskray.pipeline.config import resolve_config
from maskray.pipeline.stages import StageSettings, finish_image, prepare_image
from tests import images
from tests.rembg_reference import agreement, reference_mask


@pytest.fixture(scope="module")
def ort_session(model_bytes):
    return session.make_session(model_bytes)


def our_mask(data: bytes, sess) -> np.ndarray:
    rgb = decode.decode_rgb(data, 64_000_000)
    small = session.to_small_mask(session.run_model(sess, preprocess.normalise(preprocess.resize_for_model(rgb))))
    return postprocess.resize_mask(small, rgb.size)


@pytest.mark.parametrize("name", [p.name for p in images.PHOTOS])
def test_mask_matches_rembg_math_on_real_photos(name, ort_session, model_bytes):
    data = (images.SAMPLES / name).read_bytes()
    ref_session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    mad, iou = agreement(our_mask(data, ort_session), reference_mask(data, ref_session))
    print(f"{name}: mean abs diff {mad:.4f} grey levels, IoU@128 {iou:.4f}")
    assert mad < 1.0
    assert iou > 0.99


@pytest.mark.parametrize("name", sorted(images.good_variants()))
def test_every_mode_and_container_decodes_to_rgb(name):
    rgb = decode.decode_rgb(images.good_variants()[name], 64_000_000)
    assert rgb.mode == "RGB"
    assert min(rgb.size) > 0


def test_exif_orientation_is_applied():
    cat = images.photo()
    rgb = decode.decode_rgb(images.exif_rotated_jpeg(), 64_000_000)
    assert rgb.size == cat.size  # stored sideways, displayed upright
    diff = np.abs(np.asarray(rgb, dtype=np.int16) - np.asarray(cat.convert("RGB"), dtype=np.int16)).mean()
    assert diff < 8  # JPEG re-encoding noise only


def test_sixteen_bit_grey_is_scaled_not_clipped():
    rgb = np.asarray(decode.decode_rgb(images.sixteen_bit_grey_png(), 64_000_000))
    original = np.asarray(images.photo("camera.png").convert("L"))
    assert np.abs(rgb[..., 0].astype(int) - original).max() <= 1


def test_gif_first_frame():
    frames = [Image.new("RGB", (40, 30), c) for c in ("red", "blue")]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    rgb = decode.decode_rgb(buf.getvalue(), 64_000_000)
    assert rgb.getpixel((5, 5))[0] > 200 and rgb.getpixel((5, 5))[2] < 50


@pytest.mark.parametrize("name", sorted(images.bad_inputs()))
def test_bad_inputs_give_reasons(name):
    data, reason = images.bad_inputs()[name]
    with pytest.raises(decode.ImageError) as err:
        decode.decode_rgb(data, 64_000_000)
    assert str(err.value).startswith(reason), str(err.value)
    assert "\n" not in str(err.value)


def test_pixel_cap_is_checked_from_the_header_without_decoding():
    bomb = images.png_header_only(30000, 30000)  # 900 MP claimed, ~100 bytes on disk
    with pytest.raises(decode.ImageError, match=r"too_large: 30000x30000 > max_pixels \(64000000\)"):
        decode.open_header(bomb, 64_000_000)


def test_normalise_matches_rembg_tensor_bit_for_bit():
    rgb = images.photo().convert("RGB")
    ours = preprocess.normalise(preprocess.resize_for_model(rgb))
    im = np.array(rgb.resize((320, 320), Image.LANCZOS))
    im = im / np.max(im)
    ref = np.stack([(im[..., c] - m) / s for c, (m, s) in enumerate(zip(preprocess.MEAN, preprocess.STD, strict=True))])
    assert ours.dtype == np.float32 and ours.shape == (1, 3, 320, 320)
    assert np.array_equal(ours[0], ref.astype(np.float32))


def test_black_image_does_not_divide_by_zero():
    out = preprocess.normalise(np.zeros((320, 320, 3), np.uint8))
    assert np.isfinite(out).all()


def test_small_mask_truncates_like_rembg():
    pred = np.array([[0.0, 0.5], [0.999, 1.0]], dtype=np.float32)
    assert session.to_small_mask(pred).tolist() == [[0, 127], [254, 255]]


def test_post_process_mask_is_rembgs():
    rng = np.random.default_rng(0)
    mask = (rng.random((64, 64)) * 255).astype(np.uint8)
    kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (3, 3))
    assert kernel.tolist() == [[0, 1, 0], [1, 1, 1], [0, 1, 0]]  # the 3x3 cross
    ref = cv2.GaussianBlur(cv2.morphologyEx(mask, cv2.MORPH_OPEN, kernel), (5, 5), sigmaX=2, sigmaY=2)
    expected = np.where(ref < 127, 0, 255).astype(np.uint8)
    assert np.array_equal(postprocess.post_process_mask(mask), expected)
    assert set(np.unique(expected)) <= {0, 255}


def test_cutout_is_rgb_times_mask_with_alpha_mask():
    rgb = Image.new("RGB", (2, 1), (200, 100, 50))
    mask = np.array([[255, 128]], dtype=np.uint8)
    out = np.asarray(postprocess.cutout(rgb, mask))
    assert out[0, 0].tolist() == [200, 100, 50, 255]
    assert out[0, 1, 3] == 128 and abs(int(out[0, 1, 0]) - 100) <= 1


def test_bgcolor_fills_behind_the_cutout():
    rgb = Image.new("RGB", (2, 1), (200, 100, 50))
    out = np.asarray(postprocess.cutout(rgb, np.array([[255, 0]], np.uint8), (0, 0, 255, 255)))
    assert out[0, 0].tolist() == [200, 100, 50, 255] and out[0, 1].tolist() == [0, 0, 255, 255]


@pytest.mark.parametrize("level", range(10))
@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (7, 1), (48, 64), (301, 203)])
def test_mask_png_is_lossless_at_every_level_and_shape(level, shape):
    rng = np.random.default_rng(sum(shape) + level)
    mask = np.zeros(shape, np.uint8)
    mask[shape[0] // 3 :, : shape[1] // 2] = 255  # runs, as masks have
    mask[: shape[0] // 2] = rng.integers(0, 256, (shape[0] // 2, shape[1]))  # and every byte value
    png = encode.encode_mask_png(mask[:, ::-1][:, ::-1], level)  # a strided view is made contiguous
    back = Image.open(io.BytesIO(png))
    back.load()  # PIL checks every chunk's CRC here
    assert back.mode == "L" and back.size == shape[::-1] and np.array_equal(np.asarray(back), mask)
    assert np.array_equal(cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_UNCHANGED), mask)


def test_cutout_png_is_lossless_rgba():
    rng = np.random.default_rng(7)
    rgba = np.zeros((37, 53, 4), np.uint8)
    rgba[10:30, 5:40] = rng.integers(0, 256, (20, 35, 4))  # a photo-like subject on transparency
    for level in (0, 1, 3, 6):
        back = Image.open(io.BytesIO(encode.encode_rgba_png(Image.fromarray(rgba, "RGBA"), level)))
        assert back.mode == "RGBA" and np.array_equal(np.asarray(back), rgba)
    flat = Image.new("RGBA", (3, 2), (10, 20, 30, 40))
    assert np.asarray(Image.open(io.BytesIO(encode.encode_rgba_png(flat, 1)))).tolist() == np.asarray(flat).tolist()


def test_png_refuses_what_is_not_a_mask_or_rgba():
    for bad in (np.zeros((2, 2, 4), np.uint8), np.zeros(5, np.uint8)):
        with pytest.raises(ValueError, match="a mask must be a 2-D array"):
            encode.encode_mask_png(bad, 1)
    with pytest.raises(ValueError, match="non-empty"):
        encode.encode_mask_png(np.zeros((0, 4), np.uint8), 1)
    for bad in (np.zeros((2, 2, 3), np.uint8), np.zeros((0, 2, 4), np.uint8)):
        with pytest.raises(ValueError, match="RGBA"):
            encode.encode_png(bad, 1)


def test_stage_functions_end_to_end_on_local_files(tmp_path, ort_session):
    """prepare -> (inference by hand) -> finish, writing a real mask; no Ray involved."""
    src = tmp_path / "in" / "cat.jpg"
    src.parent.mkdir()
    src.write_bytes((images.SAMPLES / "chelsea.jpg").read_bytes())
    settings = stage_settings(tmp_path, "fp-test")
    row = prepare_image(str(src), "cat.jpg", settings)
    assert row["status"] == "pending" and (row["width"], row["height"]) == (451, 300)
    resized = np.frombuffer(row["pre"], np.uint8).reshape(320, 320, 3)
    row["small"] = session.to_small_mask(session.run_model(ort_session, preprocess.normalise(resized))).tobytes()
    out = finish_image(row, settings)
    assert out["status"] == "ok" and out["error"] is None and out["error_kind"] is None
    assert out["fingerprint"] == "fp-test"
    assert out["output"] == str(tmp_path / "out" / "masks" / "cat.jpg.png")
    assert Image.open(out["output"]).size == (451, 300)


def test_missing_source_is_a_row_not_an_exception(tmp_path):
    settings = stage_settings(tmp_path, "fp")
    row = prepare_image(str(tmp_path / "nope.jpg"), "nope.jpg", settings)
    assert row["status"] == "error" and row["error"] == "read: not found" and row["error_kind"] == "read"


def test_size_from_the_listing_is_checked_before_any_read(tmp_path):
    """A listed size over max_bytes is refused without reading; a list entry (size unknown) is
    read at most max_bytes + 1 bytes and refused as well."""
    big = tmp_path / "big.jpg"
    big.write_bytes((images.SAMPLES / "chelsea.jpg").read_bytes())
    settings = stage_settings(tmp_path, "fp", max_bytes=1000)
    listed = prepare_image(str(tmp_path / "absent.jpg"), "absent.jpg", settings, size=5000)
    assert listed["error_kind"] == "too_large" and "5000 bytes" in listed["error"]  # never opened
    unlisted = prepare_image(str(big), "big.jpg", settings)
    assert unlisted["error_kind"] == "too_large"
    assert prepare_image(str(big), "big.jpg", settings, size=0)["error_kind"] == "empty"


def test_fetches_and_writes_of_a_batch_overlap():
    """io_map runs a batch's requests on the I/O threads: 8 sleeps of 0.2 s overlap."""
    import threading
    import time

    from maskray.pipeline.stages import io_map

    active, peak, lock = [0], [0], threading.Lock()

    def request(_):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.2)
        with lock:
            active[0] -= 1
        return _

    assert io_map(request, list(range(8)), threads=8) == list(range(8))
    assert peak[0] == 8
    peak[0] = 0
    io_map(request, list(range(3)), threads=1)
    assert peak[0] == 1


def test_error_kinds_come_from_the_operators_not_the_message():
    for name, (data, reason) in images.bad_inputs().items():
        with pytest.raises(decode.ImageError) as err:
            decode.decode_rgb(data, 64_000_000)
        expected_kind = reason.split(":")[0]
        assert err.value.kind == expected_kind and str(err.value).startswith(expected_kind + ": "), name


def test_fingerprint_changes_with_every_output_setting():
    from maskray.pipeline.rows import fingerprint

    base = dict(model_md5="a" * 32, fmt="mask", post_process_mask=False, bgcolor=None, png_level=1)
    variants = [
        dict(model_md5="b" * 32),
        dict(fmt="both"),
        dict(post_process_mask=True),
        dict(bgcolor=(0, 0, 0, 255)),
        dict(png_level=9),
    ]
    prints = {fingerprint(**{**base, **v}) for v in variants}
    assert len(prints) == len(variants) and fingerprint(**base) not in prints
    assert fingerprint(**base) == fingerprint(**base)


def test_low_precision_model_warns_without_bf16_hardware(monkeypatch, caplog):
    from maskray.pipeline import model as model_mod

    monkeypatch.setattr(model_mod, "has_bf16_hardware", lambda: False)
    with caplog.at_level("WARNING", logger="maskray"):
        model_mod.warn_low_precision("m.onnx", ("tensor(float16)",))
        model_mod.warn_low_precision("ok.onnx", ("tensor(float)",))
    assert len(caplog.records) == 1 and "no avx512_bf16/amx_bf16" in caplog.records[0].getMessage()


def test_cpu_flags_are_read_from_proc_cpuinfo():
    from maskray.pipeline.sysinfo import cpu_flags, machine_info

    info = machine_info()
    assert info["cpu_flags"] == list(cpu_flags()) and len(info["cpu_flags"]) > 10
    assert isinstance(info["bf16_hardware"], bool)


def stage_settings(tmp_path, fp: str, **flags) -> StageSettings:
    """The stages' settings as a run builds them, from a config with its defaults."""
    cfg = resolve_config({"input": str(tmp_path / "in"), "output": str(tmp_path / "out"), **flags}, environ={})
    return StageSettings.of(cfg, fp)
