"""Deterministic, injective, contained output keys.

An input's key relative to the input prefix (or, for list inputs, its whole URI) becomes the
output key. The mapping is injective, so two inputs never share an output, and every segment
is escaped so that no key can climb out of the output prefix: ``..`` and ``.`` segments,
backslashes, control characters and ``%`` itself are percent-encoded. Unicode is kept as is
(normalising it could make two distinct keys collide).
"""

from __future__ import annotations

import posixpath
import re

from maskray.operators.storage import protocol_of, strip_protocol

MASK_DIR = "masks"
CUTOUT_DIR = "cutouts"
MANIFEST_DIR = "_manifest"
SUMMARY_NAME = "_summary.json"
OUTPUT_SUFFIX = ".png"
MAX_SEGMENT_BYTES = 250  # common filesystem limit is 255 bytes; leave room for the suffix

_ESCAPE = re.compile(r"[%\\\x00-\x1f\x7f]")


class UnsafeKeyError(ValueError):
    """The key cannot be turned into a contained output key (manifest ``error_kind`` ``unsafe_key``)."""

    kind = "unsafe_key"


def escape_segment(segment: str) -> str:
    if segment in (".", ".."):
        return segment.replace(".", "%2E")
    return _ESCAPE.sub(lambda m: f"%{ord(m.group()):02X}", segment)


def safe_relative_key(key: str) -> str:
    """Escape each '/'-separated segment; empty segments (``a//b``, leading '/') are dropped."""
    segments = [escape_segment(s) for s in key.split("/") if s != ""]
    if not segments:
        raise UnsafeKeyError(f"unsafe_key: empty key {key!r}")
    for seg in segments:
        if len(seg.encode("utf-8")) > MAX_SEGMENT_BYTES:
            raise UnsafeKeyError(f"unsafe_key: path segment longer than {MAX_SEGMENT_BYTES} bytes")
    return "/".join(segments)


def relative_to_prefix(source_path: str, prefix_path: str) -> str:
    """Key of a listed object relative to the listed prefix (both without scheme)."""
    prefix = prefix_path.rstrip("/") + "/"
    if not source_path.startswith(prefix):
        raise UnsafeKeyError(f"unsafe_key: {source_path!r} is not under {prefix!r}")
    return source_path[len(prefix) :]


def key_for_listed_uri(uri: str) -> str:
    """For list inputs: ``gs://b/a/x.jpg`` -> ``gs/b/a/x.jpg``; ``/data/x.jpg`` -> ``file/data/x.jpg``.

    The scheme is kept so that gs://b/x and s3://b/x never collide.
    """
    return f"{protocol_of(uri)}/{strip_protocol(uri).lstrip('/')}"


def output_uri(output_prefix: str, subdir: str, relative_key: str) -> str:
    """Contained output URI; raises if, against all of the above, it would escape."""
    safe = safe_relative_key(relative_key) + OUTPUT_SUFFIX
    base = output_prefix.rstrip("/")
    joined = posixpath.normpath(posixpath.join(strip_protocol(base) or "/", subdir, safe))
    root = posixpath.normpath(posixpath.join(strip_protocol(base) or "/", subdir))
    if not joined.startswith(root + "/"):
        raise UnsafeKeyError(f"unsafe_key: {relative_key!r} would leave the output prefix")
    return f"{base}/{subdir}/{safe}"


def is_under(child: str, parent: str) -> bool:
    """True when URI ``child`` is ``parent`` or lies beneath it (same scheme)."""
    if protocol_of(child) != protocol_of(parent):
        return False
    c, p = strip_protocol(child).rstrip("/"), strip_protocol(parent).rstrip("/")
    return c == p or c.startswith(p + "/")


_URI_CREDENTIALS = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def redact_uri_credentials(text: str) -> str:
    """``s3://KEY:SECRET@bucket/k`` anywhere in ``text`` -> ``s3://<redacted>@bucket/k``."""
    return _URI_CREDENTIALS.sub(r"\1<redacted>@", text)
