"""Human-facing output of a run: the end-of-run summary table."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


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
