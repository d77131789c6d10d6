"""The cluster statistics a placer publishes for the dashboard
(``services/placer/rules/stats.py``)."""

from __future__ import annotations

import msgspec
import pytest

from services.placer.core.fragmentation import FragmentationModel, TypicalTask
from services.placer.core.groups import TenantQuota
from services.placer.core.model import NodeState
from services.placer.rules import stats
from services.placer.rules.repairs import RecordFacts
from shared.messages.ledger import BookedContainer, BookedSlice, Booking, ClaimState, PodClaim
from shared.messages.stats import ClusterStats, TenantUsage
from shared.subjects import assignment_key
from tests.placer.builders import node

# One typical task: a half GPU with 4 cores. A GPU with less than 500 milli free strands it.
HALF_GPU = FragmentationModel(
    (TypicalTask(cpu_milli=4_000, gpu_count=1, gpu_milli=500, weight=1.0),)
)


def placed(uid: str, node: str, commit: str, state: ClaimState = "placed") -> PodClaim:
    booking = Booking(
        pod_uid=uid,
        namespace="ml",
        name=uid,
        node=node,
        commit=commit,
        decided_at=0.0,
        placer_id="p1",
    )
    return PodClaim(pod_uid=uid, state=state, booking=booking, updated_at=0.0)


def record_of(uid: str, node: str, commit: str) -> RecordFacts:
    return RecordFacts(
        key=assignment_key(node, uid),
        node=node,
        pod_uid=uid,
        state="bound",
        commit=commit,
        decided_at=0.0,
    )


@pytest.mark.parametrize(
    ("claims", "records", "reserved"),
    [
        pytest.param([placed("p", "a", "c1")], [], 1, id="placed-no-record"),
        pytest.param([placed("p", "a", "c1")], [record_of("p", "a", "c1")], 0, id="its-record"),
        pytest.param(
            [placed("p", "a", "c2")], [record_of("p", "a", "c1")], 1, id="an-older-commit-s-record"
        ),
        pytest.param([placed("p", "a", "c1", "requeued")], [], 0, id="requeued"),
        pytest.param([placed("p", "a", "c1", "deleted")], [], 0, id="deleted"),
    ],
)
def test_reserved_pods_are_placed_claims_with_no_record_of_their_commit(
    claims: list[PodClaim], records: list[RecordFacts], reserved: int
) -> None:
    assert (
        stats.reserved_pods({c.pod_uid: c for c in claims}, {r.key: r for r in records}) == reserved
    )


def figures(*nodes: NodeState) -> ClusterStats:
    return stats.cluster_stats(
        nodes,
        HALF_GPU,
        placer_id="p1",
        profile="tessera",
        typical_tasks=1,
        pending_pods=3,
        now=100.0,
    )


@pytest.mark.parametrize(
    ("nodes", "gpus", "capacity", "allocated", "fragmented"),
    [
        pytest.param((node("a").gpus(2).build(),), 2, 2000, 0, 0.0, id="idle-gpus-strand-nothing"),
        pytest.param(
            (node("a").gpu(used=700).gpu().build(),), 2, 2000, 700, 300.0, id="a-300-milli-hole"
        ),
        pytest.param(
            (node("a").gpu(exclusive=True).gpu(used=200).build(),),
            2,
            2000,
            1200,
            0.0,
            id="whole-gpu-counts-1000",
        ),
        pytest.param(
            (node("a").gpu(used=700).gpu(healthy=False).build(),),
            1,
            1000,
            700,
            300.0,
            id="unhealthy-gpus-are-not-capacity",
        ),
        pytest.param(
            (node("a").gpu(used=700).build(), node("b").gpu(used=700).cordoned().build()),
            1,
            1000,
            700,
            300.0,
            id="cordoned-nodes-are-left-out",
        ),
        pytest.param(
            (node("a").cpu(64_000, used=62_000).gpu(used=100).build(),),
            1,
            1000,
            100,
            900.0,
            id="gpus-no-typical-task-can-feed-are-fragments",
        ),
    ],
)
def test_capacity_allocation_and_fragmentation(
    nodes: tuple[NodeState, ...], gpus: int, capacity: int, allocated: int, fragmented: float
) -> None:
    result = figures(*nodes)
    assert (result.gpus, result.gpu_milli_capacity, result.gpu_milli_allocated) == (
        gpus,
        capacity,
        allocated,
    )
    assert result.fragmented_milli == pytest.approx(fragmented)
    assert result.fragmentation_pct == pytest.approx(100 * fragmented / capacity)
    assert sum(result.node_fragmented_milli.values()) == pytest.approx(fragmented)
    assert (result.placer_id, result.profile, result.pending_pods) == ("p1", "tessera", 3)


def test_a_share_counts_by_the_larger_of_its_compute_and_memory() -> None:
    gpu = node("a").gpu(mib=1000, cores_used=100).build().gpus[0]
    assert stats.booked_milli(gpu) == 100
    assert stats.booked_milli(msgspec.structs.replace(gpu, memory_reserved_mib=250)) == 250
    assert stats.booked_milli(msgspec.structs.replace(gpu, memory_reserved_mib=1)) == 100


def test_an_empty_cluster_has_no_fragmentation() -> None:
    result = figures()
    assert (result.nodes, result.gpu_milli_capacity, result.fragmentation_pct) == (0, 0, 0.0)


def test_tenant_usage_counts_shares_memory_and_compute_with_quotas() -> None:
    def booking(uid: str, tenant: str, *pieces: BookedSlice) -> Booking:
        return Booking(
            pod_uid=uid,
            namespace="ns-" + uid,
            name=uid,
            node="n1",
            commit="c-" + uid,
            tenant=tenant,
            containers=(BookedContainer(container="main", gpus=pieces),),
            decided_at=1.0,
            placer_id="p1",
        )

    def piece(index: int, memory: int, cores: int, exclusive: bool = False) -> BookedSlice:
        return BookedSlice(
            index=index, uuid=f"G{index}", memory_mib=memory, core_milli=cores, exclusive=exclusive
        )

    ledgers = {
        "n1": (
            booking("a", "ml", piece(0, 8192, 300)),
            booking("b", "ml", piece(1, 81920, 0, exclusive=True), piece(2, 81920, 0, True)),
        ),
        "n2": (booking("c", "", piece(0, 1024, 100)),),
    }
    usage = stats.tenant_usage(
        ledgers, [TenantQuota(tenant="ml", gpus=4), TenantQuota(tenant="idle", gpu_memory_mib=1)]
    )
    assert usage == (
        TenantUsage(tenant="idle", quota_gpu_memory_mib=1),
        TenantUsage(
            tenant="ml", pods=2, gpus=3, gpu_memory_mib=8192 + 2 * 81920, core_milli=2300,
            quota_gpus=4,
        ),
        TenantUsage(tenant="ns-c", pods=1, gpus=1, gpu_memory_mib=1024, core_milli=100),
    )  # fmt: skip
