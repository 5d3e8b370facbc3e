"""Output keys: deterministic, injective, and never outside the output prefix."""

from __future__ import annotations

import posixpath

import pytest

from maskray.operators.keys import (
    MASK_DIR,
    UnsafeKeyError,
    is_under,
    key_for_listed_uri,
    output_uri,
    relative_to_prefix,
    safe_relative_key,
)

NASTY = [
    "../../etc/passwd.jpg",
    "a/../../../x.jpg",
    "/abs/path.jpg",
    "..",
    "./././a.jpg",
    "a\\..\\..\\b.jpg",
    "ca\u0301t/\u202egnp.jpg",  # combining accent, right-to-left override
    "\uff0e\uff0e/\u2215x.jpg",  # fullwidth dots, division slash
    "ctrl\x00\x1f.jpg",
    "100%25.jpg",
]


@pytest.mark.parametrize("key", NASTY)
@pytest.mark.parametrize("prefix", ["gs://bucket/out", "/tmp/out", "s3://b/deep/out/"])
def test_output_keys_stay_under_the_output_prefix(key, prefix):
    uri = output_uri(prefix, MASK_DIR, key)
    root = prefix.rstrip("/") + "/" + MASK_DIR + "/"
    assert uri.startswith(root)
    rest = uri[len(root) :]
    assert all(seg not in ("", ".", "..") for seg in rest.split("/"))
    assert "\\" not in rest and "\x00" not in rest
    assert posixpath.normpath(uri.split("://")[-1]).startswith(root.split("://")[-1].rstrip("/"))


def test_keys_are_injective():
    keys = ["a.jpg", "a.png", "a.jpg.png", "A.jpg", "x/a.jpg", "x%2Fa.jpg", "x/..", "x/%2E%2E", "sp ace.jpg"]
    outs = [output_uri("gs://b/o", MASK_DIR, k) for k in keys]
    assert len(set(outs)) == len(outs)


def test_keys_are_deterministic_and_keep_structure():
    assert output_uri("gs://b/o/", MASK_DIR, "shoes/red/1.JPG") == "gs://b/o/masks/shoes/red/1.JPG.png"
    assert safe_relative_key("shoes//red/1.jpg") == "shoes/red/1.jpg"


def test_overlong_segment_is_refused():
    with pytest.raises(UnsafeKeyError):
        output_uri("/o", MASK_DIR, "x" * 300 + ".jpg")


def test_listed_uri_keys_keep_scheme_and_bucket():
    assert key_for_listed_uri("gs://shop/img/a.jpg") == "gs/shop/img/a.jpg"
    assert key_for_listed_uri("s3://shop/img/a.jpg") == "s3/shop/img/a.jpg"
    assert key_for_listed_uri("/data/a.jpg") == "file/data/a.jpg"


def test_relative_to_prefix():
    assert relative_to_prefix("b/in/x/y.jpg", "b/in/") == "x/y.jpg"
    with pytest.raises(UnsafeKeyError):
        relative_to_prefix("b/input2/y.jpg", "b/in")


def test_is_under():
    assert is_under("gs://b/in/out", "gs://b/in")
    assert not is_under("gs://b/input", "gs://b/in")
    assert not is_under("s3://b/in", "gs://b/in")
