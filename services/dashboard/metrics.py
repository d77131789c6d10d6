"""Allocation metrics: the dashboard's view of the cluster, as Prometheus gauges at each scrape.

Why the dashboard exports them (and not the placer): every placer replica holds the same ledger,
so each would export the same per-GPU series (two or more copies of every GPU, and alerts that
must deduplicate); a placer's Pending pods are only those it holds, and pods the binder found
invalid or no placer has taken are known to none. The dashboard is one process that already
folds every KV bucket and message into one view (the page shows exactly these figures), sees
every placer's rejections, the binder's invalid pods and the pods not decided yet, and is off
the placement path: a scrape of 80,000 GPU series costs no decision any latency. Tenants' usage
and quotas come from the placers' statistics (``ClusterStats.tenants``), which only a placer can
compute (it holds the tenancy file).

Base units (bytes, ratios, seconds); gauges carry no ``_total``. Until every KV bucket is
loaded only ``tessera_dashboard_views_synced 0`` is exported, so no alert fires on a half view.

Per GPU (labels ``node``, ``gpu`` = index; ``tessera_gpu_info`` adds ``uuid`` and ``model``):
``tessera_gpu_memory_capacity_bytes``, ``..._allocated_bytes``, ``..._used_bytes`` (live),
``tessera_gpu_cores_allocated_ratio`` (share of its SMs), ``tessera_gpu_slices``,
``tessera_gpu_utilization_ratio``, ``tessera_gpu_healthy``. Per node (``node``):
``tessera_node_gpu_memory_capacity_bytes``, ``..._allocated_bytes``, ``tessera_node_gpus``,
``tessera_node_ready``, ``tessera_node_inventory_age_seconds``,
``tessera_node_fragmentation_ratio``. Per tenant (``tenant``): ``tessera_tenant_pods``,
``tessera_tenant_gpus_allocated`` (shares), ``tessera_tenant_gpu_memory_allocated_bytes``,
``tessera_tenant_gpu_cores_allocated_ratio`` (GPUs' worth of SMs), ``tessera_tenant_quota_gpus``,
``tessera_tenant_quota_gpu_memory_bytes`` (only where a quota is set). Cluster:
``tessera_pods_pending{reason}`` (each pod once, under its main reason),
``tessera_pods_pending_oldest_seconds``, ``tessera_cluster_fragmentation_ratio``,
``tessera_placer_stats_age_seconds``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.dashboard.core.state import PendingPod
from services.dashboard.core.views import (
    FULL_CORES,
    fragmentation_view,
    pending_reasons,
    tenants_view,
)
from services.dashboard.live import LiveView

MIB = 2**20
GPU_MILLI = 1000


def main_reason(entry: PendingPod) -> str:
    """The one reason a Pending pod is counted under: the one most nodes gave."""
    if entry.kind != "rejected" or not entry.rejection.reasons:
        return min(pending_reasons(entry), default="unknown")
    return max(entry.rejection.reasons, key=lambda r: (r.nodes, r.reason)).reason


class AllocationCollector(Collector):
    """The gauges of the module docstring, computed from ``live`` at each scrape."""

    def __init__(self, live: LiveView, now: Callable[[], float]) -> None:
        self._live = live
        self._now = now

    def collect(self) -> Iterator[Metric]:
        synced = GaugeMetricFamily(
            "tessera_dashboard_views_synced",
            "1 once every KV bucket delivered its initial values (the figures below are whole).",
        )
        synced.add_metric([], 1.0 if self._live.synced else 0.0)
        yield synced
        if not self._live.synced:
            return
        yield from self._gpus_and_nodes()
        yield from self._tenants()
        yield from self._pending()

    def _gpus_and_nodes(self) -> Iterator[Metric]:
        now = self._now()
        gpu = ["node", "gpu"]
        info = GaugeMetricFamily(
            "tessera_gpu_info",
            "1 per GPU, with its UUID and model.",
            labels=[*gpu, "uuid", "model"],
        )
        families = {
            name: GaugeMetricFamily(name, text, labels=gpu)
            for name, text in (
                ("tessera_gpu_memory_capacity_bytes", "GPU memory the inventory reports."),
                ("tessera_gpu_memory_allocated_bytes", "GPU memory of the slices placed on it."),
                ("tessera_gpu_memory_used_bytes", "GPU memory processes hold now (inventory)."),
                ("tessera_gpu_cores_allocated_ratio", "Share of its SMs the slices placed hold."),
                ("tessera_gpu_slices", "Slices (container shares) placed on the GPU."),
                ("tessera_gpu_utilization_ratio", "Utilisation now (inventory), 0..1."),
                ("tessera_gpu_healthy", "1 when the inventory reports the GPU healthy."),
            )
        }
        node = ["node"]
        nodes = {
            name: GaugeMetricFamily(name, text, labels=node)
            for name, text in (
                ("tessera_node_gpu_memory_capacity_bytes", "GPU memory of the node's GPUs."),
                ("tessera_node_gpu_memory_allocated_bytes", "GPU memory placed on the node."),
                ("tessera_node_gpus", "GPUs the node's inventory lists."),
                ("tessera_node_ready", "1 when the node is Ready and not cordoned."),
                (
                    "tessera_node_inventory_age_seconds",
                    "Age of the node's latest GPU inventory (the inventory's heartbeat).",
                ),
                (
                    "tessera_node_fragmentation_ratio",
                    "GPU capacity the typical task mix cannot use on the node (FGD, from the "
                    "freshest placer statistics), of the node's GPU capacity.",
                ),
            )
        }
        for view in self._live.node_views():
            listed = [g for g in view.gpus if g.listed]
            for g in listed:
                labels = [view.name, str(g.index)]
                info.add_metric([*labels, g.uuid, g.model], 1.0)
                families["tessera_gpu_memory_capacity_bytes"].add_metric(
                    labels, g.memory_total_mib * MIB
                )
                families["tessera_gpu_memory_allocated_bytes"].add_metric(
                    labels, g.allocated_memory_mib * MIB
                )
                families["tessera_gpu_memory_used_bytes"].add_metric(
                    labels, g.memory_used_mib * MIB
                )
                families["tessera_gpu_cores_allocated_ratio"].add_metric(
                    labels, g.allocated_cores / FULL_CORES
                )
                families["tessera_gpu_slices"].add_metric(labels, len(g.slices))
                families["tessera_gpu_utilization_ratio"].add_metric(
                    labels, g.utilization_pct / 100
                )
                families["tessera_gpu_healthy"].add_metric(
                    labels, 1.0 if g.health == "healthy" else 0.0
                )
            capacity = sum(g.memory_total_mib for g in listed)
            nodes["tessera_node_gpu_memory_capacity_bytes"].add_metric([view.name], capacity * MIB)
            nodes["tessera_node_gpu_memory_allocated_bytes"].add_metric(
                [view.name], sum(g.allocated_memory_mib for g in listed) * MIB
            )
            nodes["tessera_node_gpus"].add_metric([view.name], len(listed))
            nodes["tessera_node_ready"].add_metric(
                [view.name], 1.0 if view.ready and view.schedulable else 0.0
            )
            if view.inventory_observed_at is not None:
                nodes["tessera_node_inventory_age_seconds"].add_metric(
                    [view.name], max(0.0, now - view.inventory_observed_at)
                )
            if view.fragmented_milli is not None and listed:
                nodes["tessera_node_fragmentation_ratio"].add_metric(
                    [view.name], view.fragmented_milli / (GPU_MILLI * len(listed))
                )
        yield info
        yield from families.values()
        yield from nodes.values()

    def _tenants(self) -> Iterator[Metric]:
        labels = ["tenant"]
        pods = GaugeMetricFamily("tessera_tenant_pods", "Pods placed, by tenant.", labels=labels)
        gpus = GaugeMetricFamily(
            "tessera_tenant_gpus_allocated",
            "GPU shares placed (a whole GPU and a slice count one), by tenant.",
            labels=labels,
        )
        memory = GaugeMetricFamily(
            "tessera_tenant_gpu_memory_allocated_bytes",
            "GPU memory placed, by tenant.",
            labels=labels,
        )
        cores = GaugeMetricFamily(
            "tessera_tenant_gpu_cores_allocated_ratio",
            "GPUs' worth of SMs placed (1 = all SMs of one GPU), by tenant.",
            labels=labels,
        )
        quota_gpus = GaugeMetricFamily(
            "tessera_tenant_quota_gpus", "The tenant's quota of GPU shares.", labels=labels
        )
        quota_memory = GaugeMetricFamily(
            "tessera_tenant_quota_gpu_memory_bytes",
            "The tenant's quota of GPU memory.",
            labels=labels,
        )
        for usage in tenants_view(self._live.state):
            name = [usage.tenant]
            pods.add_metric(name, usage.pods)
            gpus.add_metric(name, usage.gpus)
            memory.add_metric(name, usage.gpu_memory_mib * MIB)
            cores.add_metric(name, usage.core_milli / GPU_MILLI)
            if usage.quota_gpus is not None:
                quota_gpus.add_metric(name, usage.quota_gpus)
            if usage.quota_gpu_memory_mib is not None:
                quota_memory.add_metric(name, usage.quota_gpu_memory_mib * MIB)
        yield from (pods, gpus, memory, cores, quota_gpus, quota_memory)

    def _pending(self) -> Iterator[Metric]:
        now = self._now()
        state = self._live.state
        by_reason = Counter(main_reason(entry) for entry in state.pending.values())
        pending = GaugeMetricFamily(
            "tessera_pods_pending",
            "Tessera pods Pending, each once under its main reason (the one most nodes gave; "
            "'not decided by a placer yet'; 'invalid request').",
            labels=["reason"],
        )
        for reason, count in sorted(by_reason.items()):
            pending.add_metric([reason], count)
        yield pending
        oldest = GaugeMetricFamily(
            "tessera_pods_pending_oldest_seconds",
            "How long the longest-Pending Tessera pod has waited (0 when none waits).",
        )
        oldest.add_metric(
            [], max((now - e.first_rejected_at for e in state.pending.values()), default=0.0)
        )
        yield oldest
        figures = fragmentation_view(state, now=now, policy=self._live.policy)
        if figures.available and figures.fragmentation_pct is not None:
            fragmentation = GaugeMetricFamily(
                "tessera_cluster_fragmentation_ratio",
                "GPU capacity the typical task mix cannot use, of all GPU capacity (FGD).",
            )
            fragmentation.add_metric([], figures.fragmentation_pct / 100)
            yield fragmentation
            age = GaugeMetricFamily(
                "tessera_placer_stats_age_seconds", "Age of the freshest placer statistics."
            )
            age.add_metric([], figures.age_s or 0.0)
            yield age
