"""Plan a run on the cluster: find the inputs, and decide for each what this run must do.

The driver only checks that the input can be reached (one request) and builds a Ray Data plan;
every per-input step runs in Ray tasks, so the driver's work and memory do not grow with the
catalog:

* **A list file** (``.txt``, ``.csv``, ``.parquet``, or a glob of shards such as
  ``lists/list-*.parquet``) is read with Ray Data's own readers (``read_text`` / ``read_csv`` /
  ``read_parquet``). Relative entries resolve against the list's own folder.
* **A prefix** is listed by Ray tasks: one task lists the top level with a delimiter, then each
  sub-prefix is listed recursively in its own task, keeping every object's size from the listing
  (so no input needs a HEAD for it). Ray 2.60's distributed listing (``ListFiles``) serves only
  ``read_parquet``; ``read_binary_files`` lists on the driver and would also fetch every byte in
  the read, before the skip decision, so listing is done here instead.
* **Resolve**: when inputs may repeat (lists) or earlier runs left a manifest under
  ``<output>/_manifest/``, the inputs and the earlier manifests' ok rows (``earlier_evidence``:
  skipped rows are not needed, so re-runs do not grow it) are grouped by source with one
  shuffle (``groupby(...).aggregate`` on Ray Data). For each source that gives the number of
  times it is listed and whether its newest recorded output was made with this run's
  fingerprint (Ray Data's default shuffle, or its sort shuffle for a plan of a few thousand rows,
  where aggregator actors would cost more than the work). No per-input request goes to storage.
  Ray Data's ``CheckpointConfig`` is not used: it drops finished ids from the dataset (this run
  must still write a ``skipped`` row for each), it knows nothing of fingerprints, and it loads
  every checkpointed id into each filter actor.

The result is a ``decision`` per input: ``todo``, ``done`` (skipped: its output exists with this
fingerprint), ``duplicate`` (skipped: listed again), ``unsafe`` (a list entry under the output
prefix: an error row) or ``ignored`` (a listed object without an image extension: counted, no row).
"""

from __future__ import annotations

import io
import math
import posixpath
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from maskray.operators import storage
from maskray.operators.errors import one_line
from maskray.operators.keys import MANIFEST_DIR, key_for_listed_uri, relative_to_prefix
from maskray.pipeline.config import ConfigError
from maskray.pipeline.manifest import may_record_masks
from maskray.pipeline.rows import OK

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".jpe", ".png", ".webp", ".bmp", ".dib", ".tif", ".tiff", ".gif", ".mpo"}
)
LIST_EXTENSIONS = (".txt", ".csv", ".parquet")
LIST_COLUMNS = ("source", "path", "uri")
# Rows per block that the listing tasks emit, and how many listing tasks share the sub-prefixes.
LISTING_ROWS_PER_BLOCK = 50_000
LISTING_TASKS = 64

RAW_SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("size", pa.int64()),
        ("ignored", pa.int8()),
        ("n", pa.int64()),
        ("t_any", pa.float64()),
        ("t_same", pa.float64()),
    ]
)
RESOLVED_SCHEMA = pa.schema(
    [("source", pa.string()), ("key", pa.string()), ("size", pa.int64()), ("decision", pa.string())]
)
TODO, DONE, DUPLICATE, UNSAFE, IGNORED = "todo", "done", "duplicate", "unsafe", "ignored"
LOCAL, SCHEME = "local", "scheme"  # a local path in a list read from a bucket; a scheme we cannot read


@dataclass(frozen=True)
class InputSpec:
    """Where the inputs come from; small enough to ship to every planning task."""

    uri: str
    kind: str  # "prefix" | "list"
    output: str  # the output prefix with its scheme (file paths bare and absolute)
    storage_options: dict[str, Any]
    list_column: str = ""  # the URI column of a .csv / .parquet list
    allow_local_sources: bool = False  # a list read from a bucket may name local paths

    @property
    def local_entries_refused(self) -> bool:
        """A list in a bucket naming node-local files reads whatever each worker has there."""
        return self.kind == "list" and storage.protocol_of(self.uri) != "file" and not self.allow_local_sources

    @property
    def root(self) -> str:
        return storage.strip_protocol(self.uri).rstrip("/")


def is_list_file(uri: str) -> bool:
    return uri.lower().endswith(LIST_EXTENSIONS)


def normalise_uri(uri: str) -> str:
    """Local paths absolute and without a scheme, object-store URIs as given."""
    return storage.strip_protocol(uri) if storage.protocol_of(uri) == "file" else uri


# ---------------------------------------------------------------- fail fast, on the driver


def check_input(uri: str, output: str, storage_options: dict) -> InputSpec:
    """One request to prove the input is reachable; a list's header is read to find its column."""
    kind = "list" if is_list_file(uri) else "prefix"
    spec = InputSpec(uri, kind, normalise_uri(output.rstrip("/")), storage_options)
    fs = storage.filesystem(uri, storage_options)
    what = "input list" if kind == "list" else "input"
    try:
        if kind == "list":
            paths = list_shards(spec)
            if not paths:
                raise ConfigError(f"input list {uri}: not found")
            return InputSpec(uri, kind, spec.output, storage_options, list_column(paths[0], spec))
        info = fs.info(spec.root)
    except ConfigError:
        raise
    except FileNotFoundError:
        raise ConfigError(f"{what} {uri}: does not exist" if kind == "prefix" else f"{what} {uri}: not found") from None
    except Exception as exc:  # noqa: BLE001 - access errors surface as one config line
        raise ConfigError(f"{what} {uri}: cannot read ({one_line(exc)})") from None
    if info.get("type") != "directory":
        raise ConfigError(f"input {uri}: the prefix is a single object (no images to mask)")
    return spec


def list_shards(spec: InputSpec) -> list[str]:
    """A list file, or the shards a glob names (bounded: one entry per shard file, not per input)."""
    fs = storage.filesystem(spec.uri, spec.storage_options)
    path = storage.strip_protocol(spec.uri)
    if any(c in spec.uri for c in "*?["):
        return sorted(fs.glob(path))
    return [path] if fs.exists(path) else []


def list_column(path: str, spec: InputSpec) -> str:
    """The URI column of a .csv or .parquet list, from its header or footer alone."""
    lower = path.lower()
    if lower.endswith(".txt"):
        return "text"
    fs = storage.filesystem(spec.uri, spec.storage_options)
    if lower.endswith(".parquet"):
        with fs.open(path, "rb") as fh:
            names = pq.read_schema(fh).names
    else:
        head = fs.cat_file(path, start=0, end=64 * 1024)
        names = pacsv.read_csv(io.BytesIO(head.split(b"\n", 1)[0] + b"\n")).column_names
    column = next((c for c in LIST_COLUMNS if c in names), None)
    if column is None:
        raise ConfigError(f"input list {spec.uri}: needs a column named one of {', '.join(LIST_COLUMNS)}")
    return column


# ---------------------------------------------------------------- the raw inputs, as Ray Data


def raw_inputs(spec: InputSpec):
    """``source, size, ignored`` (+ resolve columns) for every listed input, built by Ray tasks."""
    return read_list(spec) if spec.kind == "list" else list_prefix(spec)


def _reader_target(spec: InputSpec) -> tuple[list[str], Any]:
    paths = list_shards(spec)
    if storage.protocol_of(spec.uri) == "file":
        return paths, None
    return paths, storage.filesystem(spec.uri, spec.storage_options)


def read_list(spec: InputSpec):
    import ray

    paths, fs = _reader_target(spec)
    lower = spec.uri.lower()
    if lower.endswith(".txt"):
        ds = ray.data.read_text(paths, filesystem=fs)
    elif lower.endswith(".csv"):
        ds = ray.data.read_csv(paths, filesystem=fs)
    else:
        ds = ray.data.read_parquet(paths, filesystem=fs).select_columns([spec.list_column])
    return ds.map_batches(list_entries, fn_kwargs={"spec": spec}, batch_format="pyarrow", batch_size=None)


def list_entries(batch: pa.Table, spec: InputSpec) -> pa.Table:
    """A block of list lines -> raw input rows (comments and blanks dropped, paths normalised)."""
    values = pc.utf8_trim_whitespace(pc.cast(batch.column(spec.list_column), pa.string()))
    keep = pc.and_(pc.is_valid(values), pc.greater(pc.utf8_length(values), 0))
    if spec.list_column == "text":
        keep = pc.and_(keep, pc.invert(pc.starts_with(values, "#")))
    entries = pc.filter(values, pc.fill_null(keep, False)).to_pylist()
    base = posixpath.dirname(spec.uri.rstrip("/"))
    return raw_table([resolve_entry(e, base) for e in entries], [-1] * len(entries), [0] * len(entries))


def resolve_entry(entry: str, list_folder: str) -> str:
    """A list entry as a normalised URI; a relative one is taken from the list's own folder."""
    if storage.protocol_of(entry) == "file" and not entry.startswith(("/", "~", "file:")):
        entry = storage.join_uri(list_folder, entry)
    return normalise_uri(entry)


def raw_table(sources: list[str], sizes: list[int], ignored: list[int]) -> pa.Table:
    n = len(sources)
    nulls = pa.nulls(n, pa.float64())
    return pa.table(
        [
            pa.array(sources, pa.string()),
            pa.array(sizes, pa.int64()),
            pa.array(ignored, pa.int8()),
            pa.array(np.ones(n, dtype=np.int64)),
            nulls,
            nulls,
        ],
        schema=RAW_SCHEMA,
    )


def list_prefix(spec: InputSpec):
    """Top level in one task; each sub-prefix in its own task, in parallel over the cluster."""
    import ray

    top = (
        ray.data.from_items([{"path": spec.root}])
        .map_batches(
            list_top_level,
            fn_kwargs={"spec": spec},
            batch_format="pyarrow",
            batch_size=None,
            num_cpus=0.25,
        )
        .materialize()
    )  # small: the root's own objects and sub-prefixes, in the object store
    subdirs = top.map_batches(_entries, fn_kwargs={"dirs": True}, batch_format="pyarrow", batch_size=None).materialize()
    files = top.map_batches(_entries, fn_kwargs={"dirs": False}, batch_format="pyarrow", batch_size=None)
    n_dirs = subdirs.count()
    if not n_dirs:
        return files
    # Sub-prefixes spread over a bounded number of listing tasks (streaming repartition: the
    # split kind passes every block through the driver).
    per_task = math.ceil(n_dirs / min(n_dirs, LISTING_TASKS))
    nested = subdirs.repartition(target_num_rows_per_block=per_task).map_batches(
        list_recursively,
        fn_kwargs={"spec": spec},
        batch_format="pyarrow",
        batch_size=None,
        num_cpus=0.25,
    )
    return files.union(nested)


def _entries(t: pa.Table, dirs: bool) -> pa.Table:
    return t.filter(pc.equal(t.column("is_dir"), 1 if dirs else 0)).drop(["is_dir"]).cast(RAW_SCHEMA)


def list_top_level(batch: pa.Table, spec: InputSpec):
    """One delimiter listing of the root: its objects (as raw rows) and its sub-prefixes."""
    fs = storage.filesystem(spec.uri, spec.storage_options)
    entries = storage.with_retries(lambda: fs.ls(spec.root, detail=True))
    dirs = [e["name"] for e in entries if e.get("type") == "directory"]  # paths without a scheme
    files = [e for e in entries if e.get("type") != "directory"]
    for chunk in _chunks(files):
        yield _listed(chunk, spec).append_column("is_dir", pa.array(np.zeros(len(chunk), np.int8)))
    if dirs:
        t = raw_table(dirs, [-1] * len(dirs), [0] * len(dirs))
        yield t.append_column("is_dir", pa.array(np.ones(len(dirs), np.int8)))


def list_recursively(batch: pa.Table, spec: InputSpec):
    """Every object under each sub-prefix of the batch, with its size, in blocks."""
    fs = storage.filesystem(spec.uri, spec.storage_options)
    pending: list[dict[str, Any]] = []
    for path in batch.column("source").to_pylist():
        found = storage.with_retries(partial(fs.find, path, detail=True))
        pending += [{"name": k, **v} for k, v in found.items() if v.get("type") != "directory"]
        while len(pending) >= LISTING_ROWS_PER_BLOCK:
            yield _listed(pending[:LISTING_ROWS_PER_BLOCK], spec)
            pending = pending[LISTING_ROWS_PER_BLOCK:]
    if pending:
        yield _listed(pending, spec)


def _chunks(items: list[Any]):
    for i in range(0, len(items), LISTING_ROWS_PER_BLOCK):
        yield items[i : i + LISTING_ROWS_PER_BLOCK]


def _listed(entries: list[dict[str, Any]], spec: InputSpec) -> pa.Table:
    proto = storage.protocol_of(spec.uri)
    names = [storage.with_protocol(proto, e["name"].split("://", 1)[-1]) for e in entries]
    ignored = [0 if posixpath.splitext(n)[1].lower() in IMAGE_EXTENSIONS else 1 for n in names]
    return raw_table(names, [int(e.get("size") or 0) for e in entries], ignored)


# ---------------------------------------------------------------- resolve against earlier runs


def manifest_root(output: str) -> str:
    return storage.join_uri(output, MANIFEST_DIR)


def earlier_evidence(output: str, storage_options: dict, fp: str):
    """Rows of earlier manifests that say what made an output: ``source, t_any, t_same``.

    An ok row records at ``finished_at`` that the output was written with ``fingerprint``; the
    newest per source says what is in the file now (a later run with other settings may have
    replaced it). Skipped rows are not read: a row skipped as done was decided because the newest
    write already had its fingerprint, so it would raise ``t_any`` and that fingerprint's
    ``t_same`` to the same time and change no later decision. So the evidence grows with the
    masks written, not with the number of re-runs; the filter is pushed into the Parquet scan,
    and parts keep ok rows in their own row groups (``manifest.part_bytes``). Parts named as
    holding no ok row (most of a done re-run's) are left out when the files are listed, before
    any footer is read, so a re-run opens the parts that recorded masks, however many re-runs came
    between. None when no earlier run left a manifest part.
    """
    import ray
    from ray.data.datasource import PathPartitionFilter
    from ray.data.expressions import col

    fs = None if storage.protocol_of(output) == "file" else storage.filesystem(output, storage_options)
    root = storage.strip_protocol(manifest_root(output))
    try:
        # Ray applies a partition filter to each listed path before reading its footer, as
        # filter(parser(path)); the parser here returns the file's name (Ray's own read hive or
        # folder partitions, which a part's name is not). tests/test_scale.py corrupts a
        # -nomasks part to check that it is never opened.
        parts = PathPartitionFilter(file_name_of, records_evidence)
        ds = ray.data.read_parquet(
            root, filesystem=fs, file_extensions=["parquet"], partitioning=None, partition_filter=parts
        )
        # Only the columns the join needs (a tenth of a part's bytes); parts from before the
        # fingerprint column read it as null.
        ds = ds.select_columns(EVIDENCE_COLUMNS).filter(expr=col("status") == OK)
    except (ValueError, FileNotFoundError) as exc:
        if isinstance(exc, FileNotFoundError) or "no files found" in str(exc).lower():
            return None
        raise
    return ds.map_batches(evidence_rows, fn_kwargs={"fp": fp}, batch_format="pyarrow", batch_size=None)


EVIDENCE_COLUMNS = ["source", "status", "fingerprint", "finished_at"]


def file_name_of(path: str) -> dict[str, str]:
    return {"file": posixpath.basename(path)}


def records_evidence(partition: dict[str, str]) -> bool:
    return may_record_masks(partition["file"])


def evidence_rows(batch: pa.Table, fp: str) -> pa.Table:
    names = batch.column_names
    n = batch.num_rows
    if "fingerprint" not in names:  # a manifest from before fingerprints: nothing is known to match
        return RAW_SCHEMA.empty_table()
    status = batch.column("status")
    recorded = pc.fill_null(pc.and_(pc.is_valid(batch.column("fingerprint")), pc.equal(status, OK)), False)
    t = batch.filter(recorded)
    same = pc.fill_null(pc.equal(t.column("fingerprint"), fp), False)
    finished = pc.cast(t.column("finished_at"), pa.float64())
    n = t.num_rows
    return pa.table(
        [
            t.column("source"),
            pa.array(np.full(n, -1, np.int64)),
            pa.array(np.zeros(n, np.int8)),
            pa.array(np.zeros(n, np.int64)),
            finished,
            pc.if_else(same, finished, pa.scalar(None, pa.float64())),
        ],
        schema=RAW_SCHEMA,
    )


# Up to this many rows (inputs plus earlier evidence) the resolve uses Ray Data's task-based sort
# shuffle; above it, the default shuffle (``shuffle_v2``), whose aggregator actors take seconds
# to start but scale (`bench/resolve_strategies.py`: the sort shuffle wins at 5k rows, loses at
# 20k).
SMALL_PLAN_ROWS = 4096


def resolve(raw, spec: InputSpec, evidence=None, partitions: int = 2, expected_rows: int | None = None):
    """Group inputs (and earlier evidence) by source: one shuffle, then a decision per input.

    A plan that may be small (``expected_rows``, the last complete run's inputs, is unknown or
    small) is materialized first and counted from its blocks' metadata, so that a re-run of a few
    inputs resolves without waiting for aggregator actors. A plan known to be large streams into
    the default shuffle, so its listing and the shuffle's map side overlap.
    """
    from ray.data.context import ShuffleStrategy

    ds = raw if evidence is None else raw.union(evidence)
    if expected_rows is None or expected_rows <= SMALL_PLAN_ROWS:
        ds = ds.materialize()
        if ds.count() <= SMALL_PLAN_ROWS:
            ds.context.shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED  # this dataset only
    return decided_by_source(ds, spec, partitions)


def decided_by_source(ds, spec: InputSpec, partitions: int):
    """The shuffle itself (with ``ds``'s own context): rows grouped by source, then decided."""
    from ray.data.aggregate import Max, Sum

    grouped = ds.groupby("source", num_partitions=partitions).aggregate(
        Sum("n", alias_name="n"),
        Max("size", alias_name="size"),
        Max("ignored", alias_name="ignored"),
        Max("t_any", alias_name="t_any"),
        Max("t_same", alias_name="t_same"),
    )
    return grouped.map_batches(decide, fn_kwargs={"spec": spec}, batch_format="pyarrow", batch_size=None)


def plain(raw, spec: InputSpec):
    """No earlier run and no possible repeats (a listed prefix): every image is to do."""
    return raw.map_batches(decide, fn_kwargs={"spec": spec}, batch_format="pyarrow", batch_size=None)


def decide(batch: pa.Table, spec: InputSpec) -> pa.Table:
    """Grouped rows -> one resolved row per listing of each source (repeats become duplicates)."""
    n = batch.column("n").to_numpy(zero_copy_only=False)
    batch = batch.filter(pa.array(n > 0))  # sources only earlier runs knew
    n = n[n > 0]
    sources = batch.column("source")
    t_any = pc.cast(batch.column("t_any"), pa.float64())
    t_same = pc.cast(batch.column("t_same"), pa.float64())
    done = pc.fill_null(pc.and_(pc.is_valid(t_same), pc.greater_equal(t_same, t_any)), False)
    src = sources.to_pylist()
    no = pa.array(np.zeros(len(n), bool))
    local, scheme = no, no
    if spec.kind == "list":
        unsafe = pc.or_(pc.equal(sources, spec.output), pc.starts_with(sources, spec.output + "/"))
        protocols = [storage.protocol_of(s) for s in src]
        scheme = pa.array([p not in storage.SOURCE_PROTOCOLS for p in protocols])
        if spec.local_entries_refused:
            local = pa.array([p == "file" for p in protocols])
    else:  # a listed prefix never overlaps the output (refused up front)
        unsafe = no
    ignored = pc.equal(batch.column("ignored"), 1)
    decision = pc.if_else(done, DONE, TODO)
    for flag, value in ((unsafe, UNSAFE), (local, LOCAL), (scheme, SCHEME), (ignored, IGNORED)):
        decision = pc.if_else(flag, value, decision)
    keys = [key_of(s, spec) for s in src]
    first = pa.table([sources, pa.array(keys, pa.string()), batch.column("size"), decision], schema=RESOLVED_SCHEMA)
    extra = np.repeat(np.arange(len(n)), n - 1)
    if not len(extra):
        return first
    dup = first.take(pa.array(extra)).set_column(3, "decision", pa.array([DUPLICATE] * len(extra), pa.string()))
    return pa.concat_tables([first, dup])


def key_of(source: str, spec: InputSpec) -> str:
    """The output key: relative to the listed prefix, or the whole URI for list entries."""
    if spec.kind == "prefix":
        proto = storage.protocol_of(spec.uri)
        path = source if proto == "file" else storage.strip_protocol(source)
        try:
            return relative_to_prefix(path, spec.root)
        except ValueError:
            return ""
    return key_for_listed_uri(source)
