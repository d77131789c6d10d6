"""Build Tessera's Grafana dashboard with grafana-foundation-sdk and write it as JSON.

    python deploy/monitoring/grafana_dashboard.py            # writes the chart's copy
    python deploy/monitoring/grafana_dashboard.py --check    # exit 1 when the copy is stale

The chart ships the output (deploy/helm/tessera/files/grafana-dashboard.json) in a ConfigMap
that Grafana's dashboard sidecar loads; tests/deploy checks the copy is what this script builds
and validates it. Every figure comes from the allocation metrics the dashboard service exports.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common, dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    BigValueColorMode,
    BigValueGraphMode,
    LegendDisplayMode,
    LegendPlacement,
)
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync, DataSourceRef

OUTPUT = (
    Path(__file__).resolve().parents[1] / "helm" / "tessera" / "files" / "grafana-dashboard.json"
)
UID = "tessera-gpu-allocation"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


def query(expr: str, legend: str = "", ref: str = "A") -> prometheus.Dataquery:
    built = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DATASOURCE)
    return built.legend_format(legend) if legend else built


def series(
    title: str, unit: str, *targets: prometheus.Dataquery, width: int = 12
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .unit(unit)
        .datasource(DATASOURCE)
        .height(8)
        .span(width)
        .legend(
            common.VizLegendOptions()
            .show_legend(True)
            .display_mode(LegendDisplayMode.TABLE)
            .placement(LegendPlacement.BOTTOM)
        )
    )
    for target in targets:
        panel = panel.with_target(target)
    return panel


def figure(title: str, unit: str, expr: str) -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .unit(unit)
        .datasource(DATASOURCE)
        .height(4)
        .span(6)
        .color_mode(BigValueColorMode.VALUE)
        .graph_mode(BigValueGraphMode.AREA)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]))
        .with_target(query(expr))
    )


def build() -> dict[str, Any]:
    board = (
        dashboard.Dashboard("Tessera: GPU allocation")
        .uid(UID)
        .tags(["tessera", "gpu"])
        .description(
            "GPU memory and compute allocated per GPU, node and tenant; Pending pods; "
            "fragmentation."
        )
        .refresh("30s")
        .time("now-1h", "now")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
        )
        .with_row(dashboard.Row("Cluster"))
        .with_panel(
            figure(
                "GPU memory allocated",
                "percentunit",
                "sum(tessera_node_gpu_memory_allocated_bytes)"
                " / sum(tessera_node_gpu_memory_capacity_bytes)",
            )
        )
        .with_panel(figure("Pods Pending", "short", "sum(tessera_pods_pending)"))
        .with_panel(
            figure("Fragmentation", "percentunit", "max(tessera_cluster_fragmentation_ratio)")
        )
        .with_panel(figure("Binders leading", "short", "sum(tessera_binder_leader)"))
        .with_panel(
            series(
                "Pending pods by reason",
                "short",
                query("sum by (reason) (tessera_pods_pending)", "{{reason}}"),
            )
        )
        .with_panel(
            series(
                "Oldest Pending pod",
                "s",
                query("max(tessera_pods_pending_oldest_seconds)", "oldest"),
            )
        )
        .with_row(dashboard.Row("Nodes"))
        .with_panel(
            series(
                "GPU memory allocated by node",
                "percentunit",
                query(
                    "tessera_node_gpu_memory_allocated_bytes"
                    " / tessera_node_gpu_memory_capacity_bytes",
                    "{{node}}",
                ),
            )
        )
        .with_panel(
            series(
                "Fragmentation by node",
                "percentunit",
                query("tessera_node_fragmentation_ratio", "{{node}}"),
            )
        )
        .with_panel(
            series(
                "Inventory age by node",
                "s",
                query("tessera_node_inventory_age_seconds", "{{node}}"),
            )
        )
        .with_panel(
            series(
                "Device plugins registered",
                "short",
                query("sum(tessera_deviceplugin_registered)", "registered"),
            )
        )
        .with_row(dashboard.Row("GPUs"))
        .with_panel(
            series(
                "GPU memory allocated by GPU",
                "bytes",
                query("tessera_gpu_memory_allocated_bytes", "{{node}} GPU {{gpu}}"),
            )
        )
        .with_panel(
            series(
                "SM share allocated by GPU",
                "percentunit",
                query("tessera_gpu_cores_allocated_ratio", "{{node}} GPU {{gpu}}"),
            )
        )
        .with_panel(
            series(
                "Utilisation by GPU",
                "percentunit",
                query("tessera_gpu_utilization_ratio", "{{node}} GPU {{gpu}}"),
            )
        )
        .with_panel(
            series(
                "Slices by GPU",
                "short",
                query("tessera_gpu_slices", "{{node}} GPU {{gpu}}"),
            )
        )
        .with_row(dashboard.Row("Tenants"))
        .with_panel(
            series(
                "GPU shares by tenant (and quota)",
                "short",
                query("tessera_tenant_gpus_allocated", "{{tenant}}", "A"),
                query("tessera_tenant_quota_gpus", "{{tenant}} quota", "B"),
            )
        )
        .with_panel(
            series(
                "GPU memory by tenant (and quota)",
                "bytes",
                query("tessera_tenant_gpu_memory_allocated_bytes", "{{tenant}}", "A"),
                query("tessera_tenant_quota_gpu_memory_bytes", "{{tenant}} quota", "B"),
            )
        )
        .with_row(dashboard.Row("Services"))
        .with_panel(
            series(
                "Event loop lag p99 by service",
                "s",
                query(
                    "histogram_quantile(0.99, sum by (le, job, instance)"
                    " (rate(tessera_event_loop_lag_seconds_bucket[5m])))",
                    "{{job}} {{instance}}",
                ),
            )
        )
    )
    encoded = json.dumps(board.build(), cls=JSONEncoder, sort_keys=True)
    built: dict[str, Any] = json.loads(encoded)
    for number, panel in enumerate(built["panels"], start=1):
        panel["id"] = number  # Grafana keys panels (links, edits) by a unique id
    return built


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 when the chart's copy differs")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT} is stale: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
