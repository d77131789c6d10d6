"""The allocation metrics the dashboard exports: per GPU, node and tenant, Pending by reason."""

from __future__ import annotations

import msgspec
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.dashboard.core.state import (
    FactsChanged,
    InventoryChanged,
    PodFoundInvalid,
    PodQueued,
    PodRejected,
    RecordChanged,
    StatsChanged,
)
from services.dashboard.metrics import AllocationCollector
from shared import subjects
from shared.messages.placement import PodInvalid
from shared.messages.pods import PodPending
from shared.messages.stats import TenantUsage
from tests.dashboard.builders import NOW, facts, gpu, inventory, record, rejection, share, stats
from tests.dashboard.test_live import live_view, synced
from tests.harness.clock import FakeClock

MIB = 2**20


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_nothing_but_the_sync_flag_before_the_views_are_whole() -> None:
    clock = FakeClock(start=NOW)
    live = live_view(clock)
    registry = CollectorRegistry()
    registry.register(AllocationCollector(live, clock.now))
    live.apply(InventoryChanged(node="n1", inventory=inventory("n1", gpu("G0"))))
    assert scrape(registry) == {("tessera_dashboard_views_synced", ()): 0.0}


def test_allocation_per_gpu_node_tenant_and_pending_by_reason() -> None:
    clock = FakeClock(start=NOW + 30)
    live = live_view(clock)
    registry = CollectorRegistry()
    registry.register(AllocationCollector(live, clock.now))
    live.apply(
        InventoryChanged(
            node="n1",
            inventory=inventory(
                "n1", gpu("G0", 0, used=12000, utilization=55), gpu("G1", 1, health="unhealthy")
            ),
        )
    )
    live.apply(FactsChanged(node="n1", facts=facts("n1")))
    for uid, memory, cores in (("a", 10240, 25), ("b", 20480, 50)):
        key = subjects.assignment_key("n1", uid)
        live.apply(
            RecordChanged(
                key=key, record=record("n1", uid, share("G0", 0, memory=memory, cores=cores))
            )
        )
    usage = (
        TenantUsage(
            tenant="ml", pods=2, gpus=2, gpu_memory_mib=30720, core_milli=750, quota_gpus=4
        ),
    )
    live.apply(StatsChanged(key="placer-0", stats=msgspec.structs.replace(stats(), tenants=usage)))
    live.apply(
        PodRejected(rejection=rejection("p1", ("insufficient GPU memory", 3), ("GPU model", 1)))
    )
    live.apply(PodRejected(rejection=rejection("p2", decided_at=NOW - 600)))
    pending = PodPending(uid="q1", namespace="ml", name="q", containers=(), created_at=NOW)
    live.apply(PodQueued(pending=pending))
    invalid = PodInvalid(
        pod_uid="i1", namespace="ml", name="i", message="Tessera cannot...", at=NOW
    )
    live.apply(PodFoundInvalid(invalid=invalid))
    synced(live)
    found = scrape(registry)

    def value(name: str, **labels: str) -> float:
        return found[(name, tuple(sorted(labels.items())))]

    g0 = {"node": "n1", "gpu": "0"}
    assert value("tessera_dashboard_views_synced") == 1.0
    assert value("tessera_gpu_info", **g0, uuid="G0", model="A100-SXM4-80GB") == 1.0
    assert value("tessera_gpu_memory_capacity_bytes", **g0) == 81920 * MIB
    assert value("tessera_gpu_memory_allocated_bytes", **g0) == 30720 * MIB
    assert value("tessera_gpu_memory_used_bytes", **g0) == 12000 * MIB
    assert value("tessera_gpu_cores_allocated_ratio", **g0) == 0.75
    assert value("tessera_gpu_slices", **g0) == 2
    assert value("tessera_gpu_utilization_ratio", **g0) == 0.55
    assert value("tessera_gpu_healthy", **g0) == 1.0
    assert value("tessera_gpu_healthy", node="n1", gpu="1") == 0.0
    assert value("tessera_node_gpu_memory_capacity_bytes", node="n1") == 2 * 81920 * MIB
    assert value("tessera_node_gpu_memory_allocated_bytes", node="n1") == 30720 * MIB
    assert value("tessera_node_gpus", node="n1") == 2
    assert value("tessera_node_ready", node="n1") == 1.0
    assert value("tessera_node_inventory_age_seconds", node="n1") == 30.0
    assert value("tessera_node_fragmentation_ratio", node="n1") == 3.5 * 40 / 2000
    assert value("tessera_tenant_pods", tenant="ml") == 2
    assert value("tessera_tenant_gpus_allocated", tenant="ml") == 2
    assert value("tessera_tenant_gpu_memory_allocated_bytes", tenant="ml") == 30720 * MIB
    assert value("tessera_tenant_gpu_cores_allocated_ratio", tenant="ml") == 0.75
    assert value("tessera_tenant_quota_gpus", tenant="ml") == 4
    assert ("tessera_tenant_quota_gpu_memory_bytes", (("tenant", "ml"),)) not in found, "no quota"
    assert value("tessera_pods_pending", reason="insufficient GPU memory") == 2
    assert value("tessera_pods_pending", reason="not decided by a placer yet") == 1
    assert value("tessera_pods_pending", reason="invalid request") == 1
    assert value("tessera_pods_pending_oldest_seconds") == 630.0
    assert value("tessera_cluster_fragmentation_ratio") == 0.035
    assert value("tessera_placer_stats_age_seconds") == 30.0
    assert not [name for name, _ in found if name.endswith("_total") and "gpu" in name]
