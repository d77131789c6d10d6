"""Claims allocated by another allocator: the binder reads the Tessera GPUs they hold and hands
them to the placer in the node's facts (``NodeFacts.claimed``). Pure rules first, then the binder
against the API double and a real nats-server."""

from __future__ import annotations

from typing import Any

import msgspec

from services.binder.rules.draforeign import ForeignClaims, claimed_gpu
from services.binder.rules.draobjects import ResourceClaim, Result
from shared import codec, subjects
from shared.messages.assignments import AssignmentRecord, AssignmentState
from shared.messages.base import ContainerSlices, GpuSlice
from shared.messages.nodes import ClaimedGpu, NodeFacts
from shared.runtime.nats import NatsBus
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.resources import NODE, POD, RESOURCE_CLAIM
from tests.binder.builders import node, pod
from tests.binder.conftest import BinderFactory
from tests.harness.wait import eventually

MERGE = "application/merge-patch+json"


def allocation(node_name: str, *results: dict[str, Any]) -> dict[str, Any]:
    return {
        "devices": {"results": list(results)},
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
            ]
        },
    }


def result(device: str, **consumed: str) -> dict[str, Any]:
    found = {"request": "gpu", "driver": "gpu.tessera.dev", "pool": "dra-1", "device": device}
    return found | ({"consumedCapacity": consumed} if consumed else {})


def claim(name: str, *, status: dict[str, Any] | None = None) -> ResourceClaim:
    return msgspec.convert(
        {"metadata": {"name": name, "namespace": "ml"}, "status": status or {}}, ResourceClaim
    )


def test_a_result_is_the_share_it_consumes_or_the_whole_gpu() -> None:
    share = msgspec.convert(result("gpu-3", memory="8Gi", compute="25"), Result)
    assert claimed_gpu("ml/c", share) == ClaimedGpu(
        claim="ml/c", index=3, memory_mib=8192, core_milli=250
    )
    whole = msgspec.convert(result("gpu-1"), Result)
    assert claimed_gpu("ml/c", whole) == ClaimedGpu(claim="ml/c", index=1, exclusive=True)
    other = msgspec.convert({**result("gpu-1"), "driver": "nic.example.com"}, Result)
    assert claimed_gpu("ml/c", other) is None


def test_only_claims_no_placement_holds_are_counted_and_their_node_is_told() -> None:
    placements = {("dra-1", "tessera-pod", "ml/shared")}
    wanted: list[str] = []
    foreign = ForeignClaims(placed=lambda *key: key in placements, want_node=wanted.append)
    allocated = {"allocation": allocation("dra-1", result("gpu-0", memory="4Gi", compute="10"))}
    kube = claim("kube", status={**allocated, "reservedFor": [{"resource": "pods", "uid": "x"}]})
    # Shared by two Tessera pods: the first one's placement holds its GPUs, the second asks none.
    reserved = [{"uid": "second-pod"}, {"uid": "tessera-pod"}]
    shared = claim("shared", status={**allocated, "reservedFor": reserved})
    foreign.claim_changed(None, claim("kube"))
    assert wanted == [] and foreign.on("dra-1") == ()
    foreign.claim_changed(claim("kube"), kube)
    foreign.claim_changed(None, shared)
    assert wanted == ["dra-1", "dra-1"]
    assert foreign.on("dra-1") == (
        ClaimedGpu(claim="ml/kube", index=0, memory_mib=4096, core_milli=100),
    )
    facts = NodeFacts(node="dra-1", cpu_allocatable_milli=1, memory_allocatable_mib=1)
    assert foreign.facts_with(facts).claimed == foreign.on("dra-1")
    # The first pod gone, its placement released: the claim still holds the GPU for the second.
    placements.clear()
    foreign.record_released("dra-1")
    assert len(wanted) == 3
    assert [gpu.claim for gpu in foreign.on("dra-1")] == ["ml/kube", "ml/shared"]
    foreign.record_released("cpu-node")
    foreign.claim_changed(kube, kube)
    assert len(wanted) == 3, "nothing it holds changed, and no claim on the other node"
    foreign.claim_changed(kube, None)
    foreign.claim_changed(shared, claim("shared"))
    assert foreign.on("dra-1") == () and len(wanted) == 5


def allocated_claim(api: ApiServer, name: str, device: str, consumer: dict[str, str]) -> None:
    api.create(
        RESOURCE_CLAIM,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}]
                }
            },
        },
        "ml",
    )
    status = {
        "allocation": allocation("dra-1", result(device, memory="8Gi", compute="25")),
        "reservedFor": [{"resource": "pods", **consumer}],
    }
    api.patch(RESOURCE_CLAIM, "ml", name, {"status": status}, MERGE, subresource="status")


def placement(pod_uid: str, claim_name: str, state: AssignmentState) -> bytes:
    """A placer's assignment record holding ``claim_name``'s GPU on dra-1."""
    slices = (GpuSlice(uuid="GPU-1", index=1, memory_mib=8192, cores=25),)
    return codec.encode(
        AssignmentRecord(
            pod_uid=pod_uid,
            namespace="ml",
            name="t-pod",
            node="dra-1",
            containers=(
                ContainerSlices(container=f"resourceclaims/{claim_name}/gpu", gpus=slices),
            ),
            state=state,
            decided_at=1.0,
            placer_id="placer-0",
            commit="k1",
        )
    )


async def test_the_binder_publishes_what_another_allocator_holds_in_the_node_facts(
    api: ApiServer, start_binder: BinderFactory, bus: NatsBus
) -> None:
    """kube-made: allocated by another allocator, counted; tessera-made: held by a Tessera pod's
    placement, not counted until that placement is released."""
    api.create(NODE, node("dra-1", gpus=None, labels={"tessera.dev/gpu-api": "dra"}))
    tessera_pod = api.create(POD, pod("t-pod", namespace="ml", node="dra-1"))
    uid = tessera_pod["metadata"]["uid"]
    allocated_claim(api, "kube-made", "gpu-0", {"name": "other", "uid": "u-other"})
    allocated_claim(api, "tessera-made", "gpu-1", {"name": "t-pod", "uid": uid})
    key = subjects.assignment_key("dra-1", uid)
    await bus.kv_put(subjects.KV_ASSIGNMENTS, key, placement(uid, "tessera-made", "allocated"))

    async def claimed() -> tuple[ClaimedGpu, ...] | None:
        entry = await bus.kv_get(subjects.KV_NODES, subjects.node_token("dra-1"))
        return None if entry is None else codec.decode(entry.value, NodeFacts).claimed

    async with start_binder(dra=True):
        held = ClaimedGpu(claim="ml/kube-made", index=0, memory_mib=8192, core_milli=250)

        async def counted() -> bool:
            return await claimed() == (held,)

        await eventually(counted, what="the claim's share in the node's facts")
        await bus.kv_put(subjects.KV_ASSIGNMENTS, key, placement(uid, "tessera-made", "released"))
        ours = ClaimedGpu(claim="ml/tessera-made", index=1, memory_mib=8192, core_milli=250)

        async def both() -> bool:
            return await claimed() == (held, ours)

        await eventually(both, what="a claim no live placement holds counted")
        gone = {"status": {"allocation": None, "reservedFor": None}}
        for name in ("kube-made", "tessera-made"):
            api.patch(RESOURCE_CLAIM, "ml", name, gone, MERGE, subresource="status")

        async def freed() -> bool:
            return await claimed() == ()

        await eventually(freed, what="the deallocated claims' shares given back")
