"""What a re-run reads from earlier runs, as re-runs pile up (why evidence is ok rows only, from
the parts that recorded masks).

Builds an output folder as maskray leaves it after one run that masked N inputs and K re-runs
that skipped all of them (parts of ``manifest.ROWS_PER_PART`` rows written by
``manifest.part_bytes``), twice: parts named by ``manifest.part_name`` as now, and every part
plainly ``.parquet`` as stop 22 wrote them. Then, on a local 2-CPU Ray in this process and
interleaving round by round, times:

* the evidence read as it was before stop 22 (ok and skipped rows both counted as records, Ray's
  default pool of 32 Parquet footer-reader actors); and a run's own read (``plan.earlier_evidence``
  under ``execution.footer_readers_for``: ok rows only, footer readers sized to the cluster) of
  the plainly named parts, which opens every part as stop 22 did, and of the parts named as now,
  where those holding no mask are left out at listing;
* the resolve's shuffle of the next re-run (the N listed inputs, read first, grouped with that
  evidence, read first) before and now: the part that grows with the evidence's rows.

    .venv/bin/python bench/evidence_growth.py --inputs 100000 --reruns 0 5 20 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from maskray.pipeline import manifest, plan  # noqa: E402
from maskray.pipeline.rows import MANIFEST_SCHEMA, OK, SKIPPED, TIME_COLUMNS  # noqa: E402

FP = "bench-fingerprint"


def run_rows(sources: list[str], status: str, finished_at: float) -> pa.Table:
    k = len(sources)
    none = pa.nulls(k, pa.string())
    cols = {
        "source": pa.array(sources),
        "output": none,
        "cutout": none,
        "status": pa.array([status] * k),
        "error_kind": pa.array([None if status == OK else "done"] * k, pa.string()),
        "error": none,
        "fingerprint": pa.array([FP] * k),
        **{c: pa.array(np.ones(k, np.float32)) for c in TIME_COLUMNS},
        "started_at": pa.array(np.full(k, finished_at - 1.0)),
        "finished_at": pa.array(np.full(k, finished_at)),
    }
    return pa.table(
        {f.name: cols[f.name].cast(f.type) if f.name in cols else pa.nulls(k, f.type) for f in MANIFEST_SCHEMA}
    )


def write_run(out: Path, run_id: str, sources: list[str], status: str, finished_at: float, named: bool) -> None:
    """One run's parts; ``named``: as maskray names them now (``-nomasks`` when no row is ok),
    else every part plain ``.parquet``, as stop 22 wrote them."""
    folder = out / "_manifest" / run_id
    folder.mkdir(parents=True)
    step = manifest.ROWS_PER_PART
    for i in range(0, len(sources), step):
        table = run_rows(sources[i : i + step], status, finished_at)
        name = manifest.part_name("a", i // step, manifest.records_masks(table) or not named)
        (folder / name).write_bytes(manifest.part_bytes(table))


def evidence_as_before(output: str):
    """The read before stop 22: ok and skipped rows both counted as records, 32 footer readers."""
    import ray

    def both(batch: pa.Table) -> pa.Table:
        status = batch.column("status")
        return plan.evidence_rows(batch.set_column(1, "status", pc.if_else(pc.equal(status, SKIPPED), OK, status)), FP)

    ds = ray.data.read_parquet(plan.manifest_root(output), partitioning=None).select_columns(plan.EVIDENCE_COLUMNS)
    return ds.map_batches(both, batch_format="pyarrow", batch_size=None)


def evidence_now(output: str):
    """As a run reads it (``plan.earlier_evidence``), footer readers sized to 2 CPUs."""
    from maskray.pipeline.execution import footer_readers_for

    with footer_readers_for(2.0):
        return plan.earlier_evidence(output, {}, FP)


# (name, read, which folder): "every part" is today's read of parts named as stop 22 named them,
# so it opens every part, as stop 22's read did.
CONTENDERS = (
    ("before", evidence_as_before, "plain"),
    ("every part", evidence_now, "plain"),
    ("now", evidence_now, "named"),
)


def timed(make):
    t = time.perf_counter()
    ds = make().materialize()
    return time.perf_counter() - t, ds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inputs", type=int, default=100_000)
    ap.add_argument("--reruns", type=int, nargs="+", default=[0, 2, 5])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    from maskray.pipeline import execution
    from maskray.pipeline.config import RunConfig

    n = args.inputs
    sources = [f"gs://shop/images/c{i % 97}/img{i:07d}.jpg" for i in range(n)]
    print(f"{n} inputs, parts of {manifest.ROWS_PER_PART} rows; seconds per round", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        listing = Path(tmp) / "list.txt"
        listing.write_text("\n".join(sources) + "\n")
        for k in args.reruns:
            outs = {how: Path(tmp) / f"out{k}-{how}" for how in ("named", "plain")}
            for how, out in outs.items():
                write_run(out, "first", sources, OK, 1000.0, how == "named")
                for r in range(k):
                    write_run(out, f"rerun{r}", sources, SKIPPED, 2000.0 + r, how == "named")
            execution.configure_data_context(RunConfig(input=str(listing), output=str(outs["named"])))
            spec = plan.check_input(str(listing), str(outs["named"]), {})
            results: dict[str, list] = {}
            for _ in range(args.rounds):
                for name, evidence, how in CONTENDERS:
                    secs, read = timed(lambda e=evidence, o=str(outs[how]): e(o))
                    results.setdefault(f"read {name}", []).append((round(secs, 2), read.count()))
                    if name == "every part":
                        continue  # the same rows as "now": the same shuffle
                    raw = plan.raw_inputs(spec).materialize()
                    secs, _ = timed(lambda r=raw, e=read, s=spec: plan.resolve(r, s, e, 4, n))
                    results.setdefault(f"shuffle {name}", []).append((round(secs, 2), read.count() + raw.count()))
            for name, values in results.items():
                secs = [s for s, _ in values]
                print(f"{k:>2} re-runs  {name:<19} rows {values[0][1]:>8}  s: {secs}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
