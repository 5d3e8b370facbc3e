"""Find the inputs of a run: a listed prefix, or a file that lists URIs.

Output: a pyarrow table with ``source`` (full URI) and ``key`` (the key the output keys derive
from). A prefix is listed once, recursively, on the driver; a list file is only read, never
listed, so a million-key catalog starts in seconds.
"""

from __future__ import annotations

import io
import posixpath
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from operators import storage
from operators.keys import key_for_listed_uri, relative_to_prefix
from pipeline.config import ConfigError

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".jpe", ".png", ".webp", ".bmp", ".dib", ".tif", ".tiff", ".gif", ".mpo"}
)
LIST_EXTENSIONS = (".txt", ".csv", ".parquet")
LIST_COLUMNS = ("source", "path", "uri")


@dataclass
class Inputs:
    table: pa.Table  # columns: source, key
    ignored: int  # listed objects without an image extension (counted, reported, not rows)
    kind: str  # "prefix" | "list"


def is_list_file(uri: str) -> bool:
    return uri.lower().endswith(LIST_EXTENSIONS)


def discover(input_uri: str, storage_options: dict) -> Inputs:
    if is_list_file(input_uri):
        return Inputs(_list_table(read_uri_list(input_uri, storage_options)), 0, "list")
    return list_prefix(input_uri, storage_options)


def list_prefix(prefix_uri: str, storage_options: dict) -> Inputs:
    fs = storage.filesystem(prefix_uri, storage_options)
    proto = storage.protocol_of(prefix_uri)
    root = storage.strip_protocol(prefix_uri).rstrip("/")
    try:
        paths = sorted(fs.find(root))
        if not paths:
            what = "is empty" if fs.isdir(root) else "is a single object" if fs.exists(root) else "does not exist"
            raise ConfigError(f"input {prefix_uri}: the prefix {what} (no images to mask)")
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - access errors surface as one config line
        raise ConfigError(f"input {prefix_uri}: cannot list ({storage_error(exc)})") from None
    images = [p for p in paths if posixpath.splitext(p)[1].lower() in IMAGE_EXTENSIONS]
    keys = [relative_to_prefix(p, root) for p in images]
    sources = [storage.with_protocol(proto, p) for p in images]
    return Inputs(pa.table({"source": sources, "key": keys}), len(paths) - len(images), "prefix")


def read_uri_list(list_uri: str, storage_options: dict) -> list[str]:
    try:
        data = storage.read_bytes(list_uri, storage_options)
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"input list {list_uri}: cannot read ({storage_error(exc)})") from None
    lower = list_uri.lower()
    if lower.endswith(".txt"):
        lines = data.decode("utf-8").splitlines()
        return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    table = pq.read_table(io.BytesIO(data)) if lower.endswith(".parquet") else pacsv.read_csv(io.BytesIO(data))
    column = next((c for c in LIST_COLUMNS if c in table.column_names), None)
    if column is None:
        raise ConfigError(f"input list {list_uri}: needs a column named one of {', '.join(LIST_COLUMNS)}")
    return [str(v).strip() for v in table.column(column).to_pylist() if v is not None and str(v).strip()]


def _list_table(uris: list[str]) -> pa.Table:
    sources = [storage.with_protocol("file", storage.strip_protocol(u)) if storage.protocol_of(u) == "file" else u
               for u in uris]
    return pa.table({"source": sources, "key": [key_for_listed_uri(u) for u in sources]})


def storage_error(exc: BaseException) -> str:
    """One short line for a storage exception (client libraries put newlines and JSON in them)."""
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
