"""Human-facing output of a run: the end-of-run table, and `maskray report` (_report.html)."""

from __future__ import annotations

import base64
import html
import io
import json
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

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

def analyse(rows: pd.DataFrame, summary: dict[str, Any], price_per_hour: float) -> dict[str, Any]:
    """The numbers behind the report, from the manifest and summary alone."""
    ok = rows[rows.status == "ok"].sort_values("finished_at")
    t0 = float(rows.started_at.min()) if len(rows) else 0.0
    span = float(rows.finished_at.max() - t0) if len(rows) else 0.0
    stage_cols = [c for c in rows.columns if c.endswith("_ms")]
    totals = {c[:-3]: float(ok[c].sum()) / 1000 for c in stage_cols}
    pool = (summary.get("cluster") or {}).get("pool_size") or 1
    # Inference runs on `pool` actors in parallel; the other stages share what is left. A stage is
    # the bottleneck when its work per parallel slot is the largest.
    per_slot = {s: v / (pool if s == "infer" else 1) for s, v in totals.items()}
    actor_busy = ok.groupby("actor").infer_ms.sum() / 1000 / span if span > 0 and "actor" in ok else pd.Series()
    first = float(ok.finished_at.iloc[0] - t0) if len(ok) else None
    hot = ok.iloc[len(ok) // 10:] if len(ok) > 10 else ok
    hot_span = float(hot.finished_at.iloc[-1] - hot.finished_at.iloc[0]) if len(hot) > 1 else 0.0
    hot_ips = (len(hot) - 1) / hot_span if hot_span > 0 else None
    cpus = (summary.get("cluster") or {}).get("cluster_cpus") or 1
    ips = summary.get("images_per_second") or 0
    return {
        "stage_totals_s": totals,
        "stage_mean_ms": {c[:-3]: float(ok[c].mean()) for c in stage_cols} if len(ok) else {},
        "bottleneck": max(per_slot, key=per_slot.get) if per_slot and any(per_slot.values()) else None,
        "actor_utilisation": {str(k): float(v) for k, v in actor_busy.items()},
        "per_node": {str(k)[:12]: int(v) for k, v in ok.groupby("node").size().items()} if len(ok) else {},
        "failures": rows[rows.status == "error"].error.fillna("unknown").map(lambda e: e.split(":")[0])
        .value_counts().to_dict(),
        "seconds_to_first_mask": first,
        "hot_images_per_second": hot_ips,
        "span_s": span,
        "cost_per_million_usd": price_per_hour / (ips * 3600) * 1e6 if ips else None,
        "price_per_hour": price_per_hour,
        "cpus": cpus,
    }


def _pyplot():
    """matplotlib only when a report is drawn: `maskray run` does not pay for importing it."""
    import matplotlib

    matplotlib.use("Agg")  # headless: the report is a file
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> str:
    plt = _pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def charts(rows: pd.DataFrame, facts: dict[str, Any]) -> dict[str, str]:
    plt = _pyplot()
    ok = rows[rows.status == "ok"].sort_values("finished_at")
    t0 = rows.started_at.min()
    out = {}
    fig, ax = plt.subplots(figsize=(7, 2.8))
    if len(ok):
        ax.plot(ok.finished_at - t0, range(1, len(ok) + 1), drawstyle="steps-post")
    ax.set_xlabel("seconds since the first image started")
    ax.set_ylabel("masks written")
    ax.set_title("Throughput over time")
    out["throughput"] = _png(fig)
    fig, ax = plt.subplots(figsize=(7, 2.8))
    stage_cols = [c for c in ok.columns if c.endswith("_ms")]
    bottom = np.zeros(len(ok))
    for col in stage_cols:
        ax.bar(range(len(ok)), ok[col].to_numpy(), bottom=bottom, label=col[:-3], width=1.0)
        bottom += ok[col].to_numpy()
    ax.set_xlabel("image (in completion order)")
    ax.set_ylabel("ms")
    ax.set_title("Stage time per image")
    ax.legend(fontsize=7, ncol=4)
    out["stages"] = _png(fig)
    return out


def render_html(summary: dict[str, Any], facts: dict[str, Any], images: dict[str, str]) -> str:
    def table(d: dict[str, Any], fmt: str = "{:.3f}") -> str:
        cells = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{fmt.format(v) if isinstance(v, float) else v}"
                        f"</td></tr>" for k, v in d.items())
        return f"<table>{cells or '<tr><td>none</td></tr>'}</table>"

    headline = {
        "inputs": summary["inputs"], "ok": summary["ok"], "failed": summary["failed"], "skipped": summary["skipped"],
        "seconds": summary["seconds"], "images/s (whole run)": summary["images_per_second"],
        "images/s (hot: after the first 10%)": facts["hot_images_per_second"],
        "seconds to first mask (cold)": facts["seconds_to_first_mask"],
        "bottleneck stage": facts["bottleneck"],
        "cost per 1M images (USD)": facts["cost_per_million_usd"],
    }
    price = f"at ${facts['price_per_hour']:.3f}/h for {facts['cpus']:g} CPUs"
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>maskray run {summary['run_id']}</title>
<style>body{{font-family:sans-serif;max-width:980px;margin:2em auto}}td{{padding:2px 10px;border-bottom:1px solid #ddd}}
h2{{margin-top:1.5em}}</style></head><body>
<h1>maskray run {html.escape(summary['run_id'])}</h1>
<h2>Summary</h2>{table(headline)}<p>cost {html.escape(price)}</p>
<h2 id="throughput">Throughput over time</h2><img alt="throughput" src="{images['throughput']}">
<h2 id="stages">Where the time goes</h2><img alt="stages" src="{images['stages']}">
<h3>Total seconds per stage (summed over images)</h3>{table(facts['stage_totals_s'])}
<h3>Mean ms per image</h3>{table(facts['stage_mean_ms'], '{:.1f}')}
<h2 id="actors">Actor utilisation (share of the run spent in inference)</h2>{table(facts['actor_utilisation'])}
<h2 id="nodes">Masks per node</h2>{table(facts['per_node'])}
<h2 id="failures">Failures by reason</h2>{table(facts['failures'])}
<h2>Config</h2><pre>{html.escape(json.dumps(summary.get('config'), indent=1))}</pre>
</body></html>"""


def write_report(output: str, storage_options: dict | None = None, price_per_hour: float | None = None) -> str:
    from operators import storage
    from pipeline.manifest import read_manifest, read_summary

    opts = storage_options or {}
    summary = read_summary(output, opts)
    rows = read_manifest(output, summary["run_id"], opts).to_pandas()
    cpus = (summary.get("cluster") or {}).get("cluster_cpus") or 1
    price = price_per_hour if price_per_hour is not None else PUBLISHED_PRICE_384 / 384 * cpus
    facts = analyse(rows, summary, price)
    page = render_html(summary, facts, charts(rows, facts))
    uri = storage.join_uri(output, "_report.html")
    storage.write_bytes_atomic(uri, page.encode(), opts)
    return uri
