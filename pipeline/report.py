"""Human-facing output of a run: the end-of-run table, and `maskray report` (_report.html)."""

from __future__ import annotations

import base64
import html
import io
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.table import Table

from maskray.pipeline.config import ConfigError
from maskray.pipeline.manifest import value_counts
from maskray.pipeline.rows import TIME_COLUMNS

PUBLISHED_PRICE_384 = 5.20  # $/h for a 384-vCPU c4d node (published); scaled per vCPU


def print_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"maskray run {summary['run_id']}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    cluster = summary.get("cluster") or {}
    rows = [
        ("inputs", summary["inputs"]),
        ("ok", summary["ok"]),
        ("failed", summary["failed"]),
        ("skipped", summary["skipped"]),
        ("seconds", f"{summary['seconds']:.2f}"),
        ("images/s", f"{summary['images_per_second']:.3f}"),
        ("seconds to first mask", summary.get("seconds_to_first_mask")),
        ("pool size", cluster.get("pool_size")),
        ("cluster CPUs", cluster.get("cluster_cpus")),
    ]
    for kind, n in sorted((summary.get("errors_by_kind") or {}).items()):
        rows.append((f"failed: {kind}", n))
    stage = summary.get("stage_seconds_total") or {}
    if stage:
        rows.append(("stage seconds (sum over images)", " ".join(f"{k}={v:.1f}" for k, v in stage.items() if v)))
    for name, value in rows:
        table.add_row(name, "-" if value is None else str(value))
    console.print(table)
    console.print(f"manifest: {summary['manifest']}")


# ---------------------------------------------------------------- maskray report: _report.html

TIME_BINS = 60
# Log-spaced stage-time histogram edges, 0.01 ms .. 1000 s: percentiles within ~7% of the value.
MS_EDGES = np.concatenate([[0.0], np.logspace(-2, 6, 161)])
PERCENTILES = (50, 95, 99)


class ManifestAggregate:
    """Everything the report shows, accumulated one manifest part at a time (memory bounded by a
    part, whatever the run's size): throughput in time bins, stage-time histograms, sums per
    time bin, per-node and per-actor figures, error counts with a few example sources."""

    def __init__(self, t0: float, t1: float) -> None:
        self.t0, self.t1 = t0, max(t1, t0 + 1e-6)
        self.edges = np.linspace(self.t0, self.t1, TIME_BINS + 1)
        self.ok_per_bin = np.zeros(TIME_BINS, dtype=np.int64)
        self.stage_hist = {c: np.zeros(len(MS_EDGES) - 1, dtype=np.int64) for c in TIME_COLUMNS}
        self.stage_sum = dict.fromkeys(TIME_COLUMNS, 0.0)
        self.stage_sum_per_bin = {c: np.zeros(TIME_BINS) for c in TIME_COLUMNS}
        self.ok = 0
        self.rows = 0
        self.first_ok: float | None = None
        self.per_node: dict[str, int] = {}
        self.infer_by_actor: dict[str, float] = {}
        self.errors: dict[str, int] = {}
        self.examples: dict[str, list[tuple[str, str]]] = {}

    def add(self, part: pa.Table) -> None:
        self.rows += part.num_rows
        ok = part.filter(pc.equal(part.column("status"), "ok"))
        if ok.num_rows:
            finished = ok.column("finished_at").to_numpy()
            self.first_ok = min(self.first_ok or np.inf, float(finished.min()))
            bins = np.clip(np.searchsorted(self.edges, finished, side="right") - 1, 0, TIME_BINS - 1)
            self.ok_per_bin += np.bincount(bins, minlength=TIME_BINS)
            self.ok += ok.num_rows
            for c in TIME_COLUMNS:
                ms = ok.column(c).to_numpy(zero_copy_only=False).astype(np.float64)
                self.stage_sum[c] += float(ms.sum())
                self.stage_sum_per_bin[c] += np.bincount(bins, weights=ms, minlength=TIME_BINS)
                idx = np.clip(np.searchsorted(MS_EDGES, ms, side="right") - 1, 0, len(MS_EDGES) - 2)
                self.stage_hist[c] += np.bincount(idx, minlength=len(MS_EDGES) - 1)
            _add_counts(self.per_node, ok.column("node"))
            actors = ok.group_by("actor").aggregate([("infer_ms", "sum")])
            for a, v in zip(actors.column("actor").to_pylist(), actors.column("infer_ms_sum").to_pylist(), strict=True):
                if a:
                    self.infer_by_actor[a] = self.infer_by_actor.get(a, 0.0) + v
        failed = part.filter(pc.equal(part.column("status"), "error"))
        _add_counts(self.errors, failed.column("error_kind"))
        for kind, source, error in zip(
            *(failed.column(c).to_pylist() for c in ("error_kind", "source", "error")), strict=True
        ):
            mine = self.examples.setdefault(kind or "unknown", [])
            if len(mine) < 3:
                mine.append((source, error or ""))

    def percentile(self, column: str, q: float) -> float | None:
        hist = self.stage_hist[column]
        total = int(hist.sum())
        if not total:
            return None
        i = int(np.searchsorted(np.cumsum(hist), q / 100 * total))
        return float(MS_EDGES[min(i + 1, len(MS_EDGES) - 1)])


def _add_counts(into: dict[str, int], column: pa.ChunkedArray) -> None:
    for key, n in value_counts(column).items():
        into[key] = into.get(key, 0) + n


def analyse(agg: ManifestAggregate, summary: dict[str, Any], price_per_hour: float) -> dict[str, Any]:
    """The numbers behind the report, from the aggregate and the summary alone."""
    stage_cols = list(TIME_COLUMNS)
    totals = {c[:-3]: agg.stage_sum[c] / 1000 for c in stage_cols}
    pool = (summary.get("cluster") or {}).get("pool_size") or 1
    # Inference runs on `pool` actors in parallel; the other stages share what is left. A stage is
    # the bottleneck when its work per parallel slot is the largest.
    per_slot = {s: v / (pool if s == "infer" else 1) for s, v in totals.items()}
    span = agg.t1 - agg.t0
    cpus = (summary.get("cluster") or {}).get("cluster_cpus") or 1
    ips = summary.get("images_per_second") or 0
    hot_bins = agg.ok_per_bin[TIME_BINS // 10 :]
    hot_span = span * len(hot_bins) / TIME_BINS
    return {
        "stage_totals_s": totals,
        "stage_mean_ms": {c[:-3]: agg.stage_sum[c] / agg.ok for c in stage_cols} if agg.ok else {},
        "stage_percentiles_ms": {c[:-3]: {f"p{q}": agg.percentile(c, q) for q in PERCENTILES} for c in stage_cols},
        "bottleneck": max(per_slot, key=lambda k: per_slot[k]) if per_slot and any(per_slot.values()) else None,
        "actor_utilisation": {a: v / 1000 / span for a, v in agg.infer_by_actor.items()} if span > 0 else {},
        "per_node": {k[:12]: v for k, v in sorted(agg.per_node.items())},
        "failures": dict(sorted(agg.errors.items(), key=lambda kv: -kv[1])),
        "failure_examples": agg.examples,
        "seconds_to_first_mask": (agg.first_ok - agg.t0) if agg.first_ok is not None else None,
        "hot_images_per_second": float(hot_bins.sum()) / hot_span if hot_span > 0 and hot_bins.sum() else None,
        "span_s": span,
        "cost_per_million_usd": price_per_hour / (ips * 3600) * 1e6 if ips else None,
        "price_per_hour": price_per_hour,
        "cpus": cpus,
    }


def _pyplot():
    """matplotlib only when a report is drawn: `maskray run` does not pay for importing it."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ConfigError("report: the charts need matplotlib: pip install 'maskray[report]'") from exc

    matplotlib.use("Agg")  # headless: the report is a file
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> str:
    plt = _pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def charts(agg: ManifestAggregate) -> dict[str, str]:
    plt = _pyplot()
    centres = (agg.edges[:-1] + agg.edges[1:]) / 2 - agg.t0
    width = (agg.t1 - agg.t0) / TIME_BINS
    out = {}
    fig, ax = plt.subplots(figsize=(7, 2.8))
    ax.bar(centres, agg.ok_per_bin / width, width=width)
    ax.set_xlabel("seconds since the first image started")
    ax.set_ylabel("masks per second")
    ax.set_title(f"Throughput over time ({TIME_BINS} bins)")
    out["throughput"] = _png(fig)
    fig, ax = plt.subplots(figsize=(7, 2.8))
    per_bin = np.maximum(agg.ok_per_bin, 1)
    bottom = np.zeros(TIME_BINS)
    for col in TIME_COLUMNS:
        mean = agg.stage_sum_per_bin[col] / per_bin
        ax.bar(centres, mean, bottom=bottom, width=width, label=col[:-3])
        bottom += mean
    ax.set_xlabel("seconds since the first image started")
    ax.set_ylabel("ms per image (mean in the bin)")
    ax.set_title("Stage time per image over the run")
    ax.legend(fontsize=7, ncol=4)
    out["stages"] = _png(fig)
    return out


def render_html(summary: dict[str, Any], facts: dict[str, Any], images: dict[str, str]) -> str:
    def table(d: dict[str, Any], fmt: str = "{:.3f}") -> str:
        cells = "".join(
            f"<tr><td>{html.escape(str(k))}</td><td>{fmt.format(v) if isinstance(v, float) else v}</td></tr>"
            for k, v in d.items()
        )
        return f"<table>{cells or '<tr><td>none</td></tr>'}</table>"

    headline = {
        "inputs": summary["inputs"],
        "ok": summary["ok"],
        "failed": summary["failed"],
        "skipped": summary["skipped"],
        "seconds": summary["seconds"],
        "images/s (whole run)": summary["images_per_second"],
        "images/s (hot: after the first 10%)": facts["hot_images_per_second"],
        "seconds to first mask (cold)": facts["seconds_to_first_mask"],
        "bottleneck stage": facts["bottleneck"],
        "cost per 1M images (USD)": facts["cost_per_million_usd"],
    }
    price = f"at ${facts['price_per_hour']:.3f}/h for {facts['cpus']:g} CPUs"
    percentiles = table(
        {
            s: " / ".join("-" if v is None else f"{v:.1f}" for v in p.values())
            for s, p in facts["stage_percentiles_ms"].items()
        }
    )
    examples = (
        "".join(
            f"<p><b>{html.escape(k)}</b>: " + "; ".join(html.escape(f"{src} ({err})") for src, err in v) + "</p>"
            for k, v in facts["failure_examples"].items()
        )
        or "<p>none</p>"
    )
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>maskray run {summary["run_id"]}</title>
<style>body{{font-family:sans-serif;max-width:980px;margin:2em auto}}td{{padding:2px 10px;border-bottom:1px solid #ddd}}
h2{{margin-top:1.5em}}</style></head><body>
<h1>maskray run {html.escape(summary["run_id"])}</h1>
<h2>Summary</h2>{table(headline)}<p>cost {html.escape(price)}</p>
<h2 id="throughput">Throughput over time</h2><img alt="throughput" src="{images["throughput"]}">
<h2 id="stages">Where the time goes</h2><img alt="stages" src="{images["stages"]}">
<h3>Total seconds per stage (summed over images)</h3>{table(facts["stage_totals_s"])}
<h3>Mean ms per image</h3>{table(facts["stage_mean_ms"], "{:.1f}")}
<h3>Percentiles, ms per image (from {len(MS_EDGES) - 1}-bin log histograms)</h3>{percentiles}
<h2 id="actors">Actor utilisation (share of the run spent in inference)</h2>{table(facts["actor_utilisation"])}
<h2 id="nodes">Masks per node</h2>{table(facts["per_node"])}
<h2 id="failures">Failures by reason</h2>{table(facts["failures"])}
<h3>Examples</h3>{examples}
<h2>Config</h2><pre>{html.escape(json.dumps(summary.get("config"), indent=1))}</pre>
</body></html>"""


def aggregate_run(output: str, summary: dict[str, Any], storage_options: dict) -> ManifestAggregate:
    from maskray.pipeline.manifest import iter_manifest

    t0 = summary.get("first_row_started_at") or 0.0
    t1 = summary.get("last_row_finished_at") or t0
    agg = ManifestAggregate(t0, t1)
    columns = ["status", "error_kind", "error", "source", "node", "actor", "finished_at", *TIME_COLUMNS]
    for part in iter_manifest(output, summary, storage_options, columns=columns):
        agg.add(part)
    return agg


def write_report(output: str, storage_options: dict | None = None, price_per_hour: float | None = None) -> str:
    from maskray.operators import storage
    from maskray.pipeline.manifest import read_summary

    opts = storage_options or {}
    summary = read_summary(output, opts)
    agg = aggregate_run(output, summary, opts)
    cpus = (summary.get("cluster") or {}).get("cluster_cpus") or 1
    price = price_per_hour if price_per_hour is not None else PUBLISHED_PRICE_384 / 384 * cpus
    facts = analyse(agg, summary, price)
    page = render_html(summary, facts, charts(agg))
    uri = storage.join_uri(output, "_report.html")
    storage.write_bytes_atomic(uri, page.encode(), opts)
    return uri
