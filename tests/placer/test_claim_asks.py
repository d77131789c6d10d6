"""A DRA pod's claim asks are judged by the placement core as containers' shares are: slices of
the rounded size on a GPU, whole GPUs held exclusively, a count on distinct GPUs."""

from __future__ import annotations

import msgspec

from services.placer.core.cycle import decide
from services.placer.core.index import ClusterIndex
from services.placer.core.model import ContainerRequest, Decision, PodRequest, Rejection
from services.placer.core.profiles import build_profile
from services.placer.rules import translate
from shared.dra.claims import ClaimPlan, plan_claims
from shared.dra.devices import DEVICE_CLASS, DRA_API, NODE_API_LABEL, MemoryPolicy
from shared.messages.resourceclaims import DeviceRequest, PodResourceClaim
from tests.placer.builders import node


def claim_pod(*requests: DeviceRequest) -> PodRequest:
    plan = plan_claims(
        (PodResourceClaim(name="gpu", claim="p-gpu", uid="u", requests=requests),),
        policy=MemoryPolicy(step_mib=256, minimum_mib=256),
    )
    assert isinstance(plan, ClaimPlan), plan
    return PodRequest(
        uid="p", namespace="ns", name="p", containers=translate.claim_containers(plan)
    )


def placed(pod: PodRequest) -> dict[str, list[tuple[int, int, int, bool]]]:
    cluster = ClusterIndex([node("n1").gpus(4, mib=16_000).build()])
    outcome = decide(pod, cluster, build_profile("binpack"), now=0)
    assert isinstance(outcome, Decision), outcome
    return {
        c.container: [(g.index, g.memory_mib, g.core_milli, g.exclusive) for g in c.gpus]
        for c in outcome.reservation.containers
    }


def test_a_slice_is_placed_at_its_rounded_size() -> None:
    slices = placed(
        claim_pod(
            DeviceRequest(
                name="r", device_class=DEVICE_CLASS, capacity={"memory": "1000Mi", "compute": "25"}
            )
        )
    )
    ((index, memory, core_milli, exclusive),) = slices["resourceclaims/p-gpu/r"]
    assert (memory, core_milli, exclusive) == (1024, 250, False)
    assert 0 <= index < 4


def test_no_capacity_is_whole_gpus_on_distinct_gpus() -> None:
    slices = placed(claim_pod(DeviceRequest(name="r", device_class=DEVICE_CLASS, count=2)))
    held = slices["resourceclaims/p-gpu/r"]
    assert len({index for index, *_ in held}) == 2
    assert all(exclusive for *_, exclusive in held)


def test_memory_alone_takes_all_of_the_compute_as_dra_defaults_it() -> None:
    (container,) = claim_pod(
        DeviceRequest(name="r", device_class=DEVICE_CLASS, capacity={"memory": "2Gi"})
    ).containers
    assert (container.share_memory_mib, container.share_core_milli) == (2048, 1000)
    (container,) = claim_pod(
        DeviceRequest(name="r", device_class=DEVICE_CLASS, capacity={"compute": "10"})
    ).containers
    assert (container.share_memory_pct, container.share_core_milli) == (100, 100)


def test_device_plugin_gpus_are_kept_off_dra_nodes_and_claims_are_not() -> None:
    dra = msgspec.structs.replace(
        node("dra").gpus(4, mib=16_000).build(), labels={NODE_API_LABEL: DRA_API}
    )
    plugin = node("plugin").gpus(1, mib=16_000, used=900).build()
    full = node("plugin").gpus(1, mib=16_000, used=1000).build()
    profile = build_profile("binpack")
    slice_pod = PodRequest(
        uid="dp",
        namespace="ns",
        name="dp",
        containers=(ContainerRequest(name="main", shares=1, share_memory_mib=1024),),
    )
    placed_at = decide(slice_pod, ClusterIndex([dra, plugin]), profile, now=0)
    assert isinstance(placed_at, Decision) and placed_at.node == "plugin"  # not the emptier GPUs
    refused = decide(slice_pod, ClusterIndex([dra, full]), profile, now=0)
    assert isinstance(refused, Rejection)
    assert "1 node: node(s) offer GPUs through DRA only" in refused.message
    claimed = claim_pod(
        DeviceRequest(name="r", device_class=DEVICE_CLASS, capacity={"memory": "1Gi"})
    )
    on_dra = decide(claimed, ClusterIndex([dra, full]), profile, now=0)
    assert isinstance(on_dra, Decision) and on_dra.node == "dra"
    cpu_only = PodRequest(
        uid="c", namespace="ns", name="c", containers=(ContainerRequest(name="main"),)
    )
    assert isinstance(decide(cpu_only, ClusterIndex([dra]), profile, now=0), Decision)
