"""One way to reach a place to read or write: a URI plus storage options, resolved by fsspec.

Steps never branch on gs:// vs s3:// vs local. Filesystem instances are created lazily in
each process (gcsfs instances must not cross a fork) and cached per (protocol, options).
"""

from __future__ import annotations

import json
import os
import posixpath
import socket
import time
import uuid
from collections.abc import Callable
from functools import lru_cache, partial
from typing import Any, TypeVar
from urllib.parse import urlsplit

import fsspec
from fsspec.core import split_protocol

T = TypeVar("T")

# Errors worth retrying: connection drops and timeouts, which the storage client libraries
# surface after their own retries. Not-found, permission and bad-request errors are permanent.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)
RETRY_ATTEMPTS = 4
RETRY_BASE_DELAY_S = 0.5


def protocol_of(uri: str) -> str:
    proto, _ = split_protocol(uri)
    return str({None: "file", "gcs": "gs", "s3a": "s3"}.get(proto, proto))


def strip_protocol(uri: str) -> str:
    """``gs://b/k`` -> ``b/k``; local paths become absolute."""
    proto, path = split_protocol(uri)
    if protocol_of(uri) == "file":
        return str(os.path.abspath(os.path.expanduser(path)))
    return str(path.strip("/") if proto else path)


WEB_PROTOCOLS = ("http", "https")
WEB_TIMEOUT_S = 30  # per request: a stalled CDN fails the image ("read: timeout"), not the run
# What inputs may be read from: object stores, local paths, and web URLs (CDN lists) via fsspec's HTTP.
SOURCE_PROTOCOLS = ("file", "gs", "s3", *WEB_PROTOCOLS)


def object_path(uri: str) -> str:
    """What the URI's filesystem takes as a path: the whole URL for http(s), else ``strip_protocol``."""
    return uri if protocol_of(uri) in WEB_PROTOCOLS else strip_protocol(uri)


def join_uri(base: str, *parts: str) -> str:
    """Join key parts onto a URI without losing the scheme."""
    return posixpath.join(base.rstrip("/"), *parts) if base else posixpath.join(*parts)


def with_protocol(protocol: str, path: str) -> str:
    return path if protocol == "file" else f"{protocol}://{path}"


def filesystem(uri: str, options: dict[str, Any] | None = None) -> fsspec.AbstractFileSystem:
    return _cached_fs(protocol_of(uri), json.dumps(options or {}, sort_keys=True))


# The optional extras that carry each bucket store's fsspec implementation.
EXTRA_FOR_PROTOCOL = {"gs": "gcs", "gcs": "gcs", "s3": "s3", "s3a": "s3"}


class MissingExtraError(ImportError):
    """A bucket URI whose filesystem package is not installed: the message names the extra."""


@lru_cache(maxsize=16)
def _cached_fs(protocol: str, options_json: str) -> fsspec.AbstractFileSystem:
    try:
        return _new_fs(protocol, json.loads(options_json))
    except ImportError as exc:
        extra = EXTRA_FOR_PROTOCOL.get(protocol)
        if extra is None:
            raise
        raise MissingExtraError(f"{protocol}:// needs maskray's {extra} extra: pip install 'maskray[{extra}]'") from exc


def _new_fs(protocol: str, options: dict[str, Any]) -> fsspec.AbstractFileSystem:
    if protocol == "gs":
        return _gcs_filesystem(options)
    if protocol == "file":
        return fsspec.filesystem("file", auto_mkdir=True)
    if protocol in WEB_PROTOCOLS:  # the storage options belong to the bucket store, not to a CDN
        import aiohttp

        return fsspec.filesystem(protocol, client_kwargs={"timeout": aiohttp.ClientTimeout(total=WEB_TIMEOUT_S)})
    return fsspec.filesystem(protocol, **options)


def _gcs_filesystem(options: dict[str, Any]) -> fsspec.AbstractFileSystem:
    """gcsfs, with the emulator case made to work.

    gcsfs's default ("extended") class probes each bucket over gRPC/TLS and stalls ~60 s per
    operation against an emulator, so with an emulator (``STORAGE_EMULATOR_HOST`` or an
    ``endpoint_url`` option) we build the plain class and default to anonymous credentials.
    """
    endpoint = options.get("endpoint_url") or os.environ.get("STORAGE_EMULATOR_HOST")
    if not endpoint:
        return fsspec.filesystem("gs", **options)
    import gcsfs.core

    opts = {"token": "anon", **options, "endpoint_url": endpoint}
    return gcsfs.core.GCSFileSystem(**opts)


def custom_endpoint(uri: str, options: dict[str, Any] | None = None) -> str | None:
    """The endpoint a bucket URI is served from when it is not the store's own (an emulator,
    MinIO, a private gateway): the ``endpoint_url`` option or the env vars the clients read."""
    options = options or {}
    protocol = protocol_of(uri)
    if protocol == "gs":
        return options.get("endpoint_url") or os.environ.get("STORAGE_EMULATOR_HOST")
    if protocol == "s3":
        return (
            options.get("endpoint_url")
            or (options.get("client_kwargs") or {}).get("endpoint_url")
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
        )
    return None


ENDPOINT_CONNECT_TIMEOUT_S = 3.0
ENDPOINT_ATTEMPTS = 3


def check_reachable(endpoint: str) -> None:
    """Raise ConnectionError naming ``host:port`` when nothing answers a TCP connect there.

    A custom endpoint is the user's own setting, so a refused connection is most likely a typo or a
    server that is not up: worth one line in a second or two, not the storage client's own retries
    (gcsfs backs off 1+2+4+8+16 s). The store's own endpoints are left to the clients' retries.
    """
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    try:
        connect = partial(socket.create_connection, (host, port), timeout=ENDPOINT_CONNECT_TIMEOUT_S)
        with_retries(lambda: connect().close(), attempts=ENDPOINT_ATTEMPTS)
    except OSError as exc:  # refused and timed out after the retries; an unknown host at once
        raise ConnectionError(f"cannot connect to {host}:{port} ({exc.strerror or type(exc).__name__})") from exc


def forget_listings(uri: str, options: dict[str, Any] | None = None) -> None:
    """Drop this process's cached listings: other processes (Ray workers) write under the output,
    and a listing cached before their writes would hide them (s3fs and gcsfs cache listings)."""
    filesystem(uri, options).invalidate_cache()


def with_retries(fn: Callable[[], T], attempts: int = RETRY_ATTEMPTS) -> T:
    """Run ``fn``, retrying TRANSIENT_ERRORS with exponential backoff."""
    for attempt in range(attempts):
        try:
            return fn()
        except TRANSIENT_ERRORS:
            if attempt == attempts - 1:
                raise
            time.sleep(RETRY_BASE_DELAY_S * 2**attempt)
    raise AssertionError("unreachable")


def read_bytes(uri: str, options: dict[str, Any] | None = None) -> bytes:
    fs = filesystem(uri, options)
    return bytes(with_retries(lambda: fs.cat_file(strip_protocol(uri))))


def exists(uri: str, options: dict[str, Any] | None = None) -> bool:
    fs = filesystem(uri, options)
    return bool(with_retries(lambda: fs.exists(strip_protocol(uri))))


def remove_if_present(uri: str, options: dict[str, Any] | None = None) -> None:
    """Delete an object; one that is not there is not an error."""
    fs = filesystem(uri, options)
    try:
        with_retries(lambda: fs.rm_file(strip_protocol(uri)))
    except FileNotFoundError:
        pass


def _publish_local(path: str, data: bytes, publish: Callable[[str, str], None]) -> None:
    """Write a complete temporary file beside ``path``, then ``publish`` it there (rename or link)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        publish(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def create_bytes_exclusive(uri: str, data: bytes, options: dict[str, Any] | None = None) -> None:
    """Create an object only if none exists (raises FileExistsError otherwise), whole or not at all.

    GCS: ``ifGenerationMatch=0``; S3: ``If-None-Match: *`` (both via fsspec's ``mode="create"``);
    locally a complete temporary file hard-linked into place (``link`` fails if the name exists).
    """
    fs = filesystem(uri, options)
    path = strip_protocol(uri)
    if protocol_of(uri) != "file":
        try:
            fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            raise
        except Exception:  # a precondition failure comes back as the client library's own error
            fs.invalidate_cache(path)
            if fs.exists(path):
                raise FileExistsError(uri) from None
            raise
        return
    _publish_local(path, data, os.link)  # fails if the name exists


def write_bytes_atomic(uri: str, data: bytes, options: dict[str, Any] | None = None) -> None:
    """Write so that a reader never sees a partial object.

    Object stores publish an upload only when it completes; locally we write a temporary file
    beside the target and rename it over (atomic on POSIX). Re-running with the same content is
    harmless, which matters because Ray retries tasks and actors.
    """
    fs = filesystem(uri, options)
    path = strip_protocol(uri)
    if protocol_of(uri) != "file":
        with_retries(lambda: fs.pipe_file(path, data))
        return
    _publish_local(path, data, os.replace)
