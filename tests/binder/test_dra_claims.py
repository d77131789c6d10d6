"""The binder's DRA claim reading and allocation planning (pure): a pod's claims from its spec
and status, the allocation results a booking stands for, and the request the placer takes."""

from __future__ import annotations

import uuid
from pathlib import Path

import msgspec
from prometheus_client import CollectorRegistry

from services.binder import draalloc
from services.binder.draclaims import DraClaims
from services.binder.kube import KubeGateway, load_configuration, new_configuration
from services.binder.kubedra import KubeDra
from services.binder.metrics import BinderMetrics
from services.binder.rules.draobjects import ResourceClaim, allocated_node, pod_claims
from services.placer.rules import translate
from shared.clock import SystemClock
from shared.dra.devices import DEFAULT_POLICY, DRA_API, NODE_API_LABEL
from shared.kubeobjects import Pod
from shared.messages.ledger import BookedContainer, BookedSlice, Booking
from shared.messages.pods import PodPending
from shared.podspec import InvalidPod
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.resources import RESOURCE_CLAIM

MODEL_A100 = 'device.attributes["gpu.tessera.dev"].model == "A100"'
CLAIM = {
    "metadata": {"name": "p-gpu-x1", "namespace": "team", "uid": "c-1", "resourceVersion": "7"},
    "spec": {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "gpu.tessera.dev",
                        "count": 2,
                        "capacity": {"requests": {"memory": "8Gi", "compute": "25"}},
                        "selectors": [{"cel": {"expression": MODEL_A100}}],
                    },
                }
            ],
            "constraints": [{"distinctAttribute": "gpu.tessera.dev/uuid"}],
        }
    },
}
POD = {
    "metadata": {"name": "p", "namespace": "team", "uid": "pod-1"},
    "spec": {
        "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "two-slices"}],
    },
    "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x1"}]},
}


def booked() -> Booking:
    return Booking(
        pod_uid="pod-1",
        namespace="team",
        name="p",
        node="node-a",
        commit="k1",
        decided_at=1.0,
        placer_id="placer-0",
        containers=(
            BookedContainer(
                container="resourceclaims/p-gpu-x1/gpu",
                gpus=tuple(
                    BookedSlice(index=i, uuid=f"GPU-{i}", memory_mib=8192, core_milli=250)
                    for i in (3, 5)
                ),
            ),
        ),
    )


def decoded() -> tuple[Pod, ResourceClaim]:
    return (
        msgspec.convert(POD, Pod),
        msgspec.convert(CLAIM, ResourceClaim),
    )


def test_a_template_claim_is_read_through_the_pod_status() -> None:
    pod, claim = decoded()
    (read,) = pod_claims(pod, {"team/p-gpu-x1": claim}.get)
    assert (read.claim, read.uid, read.template) == ("p-gpu-x1", "c-1", True)
    assert read.requests[0].count == 2
    assert read.requests[0].capacity == {"memory": "8Gi", "compute": "25"}
    assert read.used_by[0].container == "main"
    (missing,) = pod_claims(pod, lambda _: None)
    assert missing.claim == ""


def test_a_claim_not_created_yet_is_explained_and_a_read_one_is_carried() -> None:
    pod, claim = decoded()
    pending = PodPending(uid="pod-1", namespace="team", name="p", containers=())
    waiting = draalloc.with_claims(pending, pod_claims(pod, lambda _: None), policy=DEFAULT_POLICY)
    assert isinstance(waiting, InvalidPod)
    assert "not created yet" in waiting.message
    carried = draalloc.with_claims(
        pending, pod_claims(pod, {"team/p-gpu-x1": claim}.get), policy=DEFAULT_POLICY
    )
    assert isinstance(carried, PodPending)
    asked = translate.pod_request(carried)
    assert [
        (c.name, c.shares, c.share_memory_mib, c.share_core_milli) for c in asked.containers
    ] == [("resourceclaims/p-gpu-x1/gpu", 2, 8192, 250)]
    assert asked.constraints is not None
    assert (NODE_API_LABEL, DRA_API) in asked.constraints.node_selector
    assert asked.allows_model("A100") and not asked.allows_model("H100")


def test_the_allocation_holds_one_result_per_booked_gpu_with_its_full_capacity() -> None:
    pod, claim = decoded()
    (read,) = pod_claims(pod, {"team/p-gpu-x1": claim}.get)
    booking = booked()
    found = draalloc.results(booking, read)
    assert isinstance(found, list)
    assert [(r["device"], r["pool"], r["consumedCapacity"]) for r in found] == [
        ("gpu-3", "node-a", {"memory": "8192Mi", "compute": "25"}),
        ("gpu-5", "node-a", {"memory": "8192Mi", "compute": "25"}),
    ]
    assert all(uuid.UUID(r["shareID"]).version == 5 for r in found)
    assert draalloc.results(booking, read) == found  # tried again: the same share ids
    allocation = msgspec.convert(
        {"status": {"allocation": draalloc.allocation("node-a", found)}, "metadata": {}},
        ResourceClaim,
    )
    assert allocated_node(allocation.status.allocation) == "node-a"
    short = msgspec.structs.replace(booking, containers=booking.containers[:0])
    assert "holds 0 GPUs" in str(draalloc.results(short, read))


async def test_allocation_and_reservation_are_written_through_the_api(
    api: ApiServer, kubeconfig: Path
) -> None:
    """Through the real client against the API double (every write validated against the
    strict 1.37 schemas by the ``api`` fixture): the finalizer, then the allocation with the pod
    reserved; a second pod sharing the claim on the same node is only reserved (the informer's
    copy is stale by then: the write's 409 has it read again); one on another node is
    refused."""
    pod, _ = decoded()
    created = api.create(
        RESOURCE_CLAIM,
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", **CLAIM},
        "team",
    )
    configuration = new_configuration()
    await load_configuration(configuration, kubeconfig=str(kubeconfig), environ={})
    gateway = KubeGateway.create(
        configuration, BinderMetrics.create(CollectorRegistry()), clock=SystemClock(), timeout_s=5.0
    )
    try:
        claim = await KubeDra(gateway).read_claim("team", "p-gpu-x1")
        assert claim is not None and claim.metadata.uid == created["metadata"]["uid"]
        others: dict[str, Pod] = {"pod-1": pod}
        wanted: list[str] = []
        claims = DraClaims(
            gateway=gateway,
            api=KubeDra(gateway),
            clock=SystemClock(),
            metrics=BinderMetrics.create(CollectorRegistry()),
            pod_of=others.get,
            want_pod=wanted.append,
            fence=lambda _: None,
        )
        claims.informer.cache["team/p-gpu-x1"] = claim
        booking = booked()
        reads = api.requests[("get", "resourceclaims")]
        assert await claims.allocate(booking) == ""
        # The informer's copy, then each write's answer: no read when nobody wrote meanwhile.
        assert api.requests[("get", "resourceclaims")] == reads
        stored = api.get(RESOURCE_CLAIM, "team", "p-gpu-x1")
        assert stored["metadata"]["finalizers"] == ["resource.kubernetes.io/delete-protection"]
        results = stored["status"]["allocation"]["devices"]["results"]
        assert [r["device"] for r in results] == ["gpu-3", "gpu-5"]
        assert [c["uid"] for c in stored["status"]["reservedFor"]] == ["pod-1"]
        assert await claims.allocate(booking) == ""  # seen again: nothing more written
        twin = msgspec.structs.replace(
            pod, metadata=msgspec.structs.replace(pod.metadata, uid="pod-2", name="q")
        )
        others["pod-2"] = twin
        second = msgspec.structs.replace(booking, pod_uid="pod-2", name="q")
        assert await claims.allocate(second) == ""
        stored = api.get(RESOURCE_CLAIM, "team", "p-gpu-x1")
        assert [c["uid"] for c in stored["status"]["reservedFor"]] == ["pod-1", "pod-2"]
        assert stored["status"]["allocation"]["devices"]["results"] == results
        others["pod-3"] = msgspec.structs.replace(
            pod, metadata=msgspec.structs.replace(pod.metadata, uid="pod-3", name="r")
        )
        elsewhere = msgspec.structs.replace(booking, pod_uid="pod-3", name="r", node="node-b")
        assert "allocated on node node-a, not node-b" in await claims.allocate(elsewhere)
    finally:
        await gateway.close()
