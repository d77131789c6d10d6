"""A pod's gpu.tessera.dev claims -> the asks the placement core judges, or every reason Tessera
cannot honour them; and the device model's rounding the asks rely on."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shared.dra.claims import (
    ClaimAsk,
    ClaimPlan,
    ask_container,
    claim_of_container,
    constraint_problem,
    plan_claims,
)
from shared.dra.devices import (
    DEVICE_CLASS,
    DRIVER,
    Consumed,
    DeviceDescription,
    MemoryPolicy,
    consumed,
    memory_range,
    pci_bus_id,
    round_memory,
)
from shared.messages.resourceclaims import (
    AllocatedDevice,
    ClaimUse,
    DeviceConstraint,
    DeviceRequest,
    PodResourceClaim,
)
from shared.podspec import FieldError

POLICY = MemoryPolicy(step_mib=256, minimum_mib=512)
MODEL_A100 = 'device.attributes["gpu.tessera.dev"].model.startsWith("A100")'


def request(name: str = "gpu", **fields: Any) -> DeviceRequest:
    return DeviceRequest(name=name, device_class=DEVICE_CLASS, **fields)


def claim(*requests: DeviceRequest, name: str = "c", **fields: Any) -> PodResourceClaim:
    return PodResourceClaim(
        name=name,
        claim=fields.pop("claim", f"pod-{name}"),
        uid=f"uid-{name}",
        requests=requests or (request(),),
        **fields,
    )


def plan(*claims: PodResourceClaim, **options: Any) -> ClaimPlan | tuple[FieldError, ...]:
    return plan_claims(claims, policy=POLICY, **options)


def asks(*claims: PodResourceClaim) -> tuple[ClaimAsk, ...]:
    result = plan(*claims)
    assert isinstance(result, ClaimPlan), result
    return result.asks


def problems(*claims: PodResourceClaim, **options: Any) -> list[str]:
    result = plan(*claims, **options)
    assert isinstance(result, tuple), result
    return [str(error) for error in result]


@pytest.mark.parametrize(
    ("capacity", "memory", "compute"),
    [
        ({}, None, None),  # none: the whole GPU
        ({"memory": "8Gi", "compute": "25"}, 8192, 25),
        ({"memory": "8Gi"}, 8192, 100),  # an unrequested capacity is the whole of it
        ({"compute": "30"}, None, 30),  # memory left out: all of the GPU's
        ({"memory": "1000Mi", "compute": "25"}, 1024, 25),  # rounded up to the 256 MiB step
        ({"memory": "100Mi", "compute": "1"}, 512, 1),  # up to the minimum slice
        ({"memory": "1G", "compute": "2.5"}, 1024, 3),  # bytes and fractions round up
        ({"gpu.tessera.dev/memory": "2Gi", "gpu.tessera.dev/compute": "50"}, 2048, 50),
    ],
)
def test_capacity_requests_per_gpu(
    capacity: dict[str, str], memory: int | None, compute: int | None
) -> None:
    (ask,) = asks(claim(request(capacity=capacity)))
    assert (ask.memory_mib, ask.compute) == (memory, compute)
    assert ask.whole is (not capacity)
    assert ask.container == "resourceclaims/pod-c/gpu"
    assert claim_of_container(ask.container) == ("pod-c", "gpu")


def test_count_is_distinct_gpus_and_selectors_come_with_the_class() -> None:
    (ask,) = asks(
        claim(
            request(
                count=2, class_selectors=(f'device.driver == "{DRIVER}"',), selectors=(MODEL_A100,)
            )
        )
    )
    assert ask.count == 2
    assert ask.selectors == (f'device.driver == "{DRIVER}"', MODEL_A100)


def test_distinct_uuid_across_requests_of_one_shape_is_one_ask() -> None:
    shape = {"memory": "8Gi", "compute": "25"}
    (ask,) = asks(
        claim(
            request("a", capacity=shape),
            request("b", capacity=shape),
            constraints=(DeviceConstraint(distinct_attribute="uuid"),),
        )
    )
    assert (ask.requests, ask.count) == (("a", "b"), 2)


def test_requests_without_a_constraint_are_asked_apart() -> None:
    one, two = asks(claim(request("a"), request("b", capacity={"memory": "4Gi"})))
    assert (one.requests, two.requests) == (("a",), ("b",))
    assert one.whole and two.memory_mib == 4096


def test_an_allocated_claim_pins_the_node_and_asks_nothing() -> None:
    shared = claim(
        allocated=(AllocatedDevice(request="gpu", driver=DRIVER, pool="n1", device="gpu-0"),),
        allocated_node="n1",
        name="shared",
    )
    result = plan(shared, claim(name="own"))
    assert isinstance(result, ClaimPlan)
    assert result.node == "n1"
    assert [a.claim for a in result.asks] == ["pod-own"]
    assert result.claims == ("pod-shared", "pod-own")


def test_claims_of_other_classes_alone_are_not_tesseras() -> None:
    other = PodResourceClaim(
        name="nic", claim="nic", requests=(DeviceRequest(name="n", device_class="nic.example"),)
    )
    assert plan(other) == ClaimPlan()


@pytest.mark.parametrize(
    ("claims", "options", "expected"),
    [
        (
            (claim(request(first_available=2)),),
            {},
            "firstAvailable: Tessera allocates exact requests only",
        ),
        ((claim(request(allocation_mode="All")),), {}, "allocationMode All: ask for a count"),
        ((claim(request(admin_access=True)),), {}, "adminAccess is not supported"),
        ((claim(request(tolerations=1)),), {}, "Tessera taints only unhealthy GPUs"),
        ((claim(request(capacity={"cores": "3"})),), {}, "not a capacity of gpu.tessera.dev"),
        ((claim(request(capacity={"memory": "lots"})),), {}, "'lots' is not a quantity"),
        ((claim(request(capacity={"compute": "150"})),), {}, "150 is more than 100"),
        ((claim(request(capacity={"memory": "0"})),), {}, "must be positive"),
        ((claim(request(selectors=("device.x ==",))),), {}, "is not valid CEL"),
        ((claim(request(selectors=("cel.bind(x, 1, x == 1)",))),), {}, "does not implement bind"),
        (
            (claim(request(), DeviceRequest(name="n", device_class="nic.example")),),
            {},
            "nic.example: a pod Tessera schedules gets devices of DeviceClass gpu.tessera.dev",
        ),
        (
            (claim(constraints=(DeviceConstraint(distinct_attribute="model"),)),),
            {},
            "Tessera keeps GPUs distinct by uuid or index only",
        ),
        (
            (
                claim(
                    request("a"),
                    request("b", capacity={"memory": "1Gi"}),
                    constraints=(DeviceConstraint(distinct_attribute="uuid"),),
                ),
            ),
            {},
            "distinctAttribute across requests a, b of different sizes",
        ),
        (
            (claim(request("a"), request("b"), used_by=(ClaimUse(container="main"),)),),
            {},
            "uses 2 gpu.tessera.dev requests",
        ),
        ((claim(claim=""),), {}, "ResourceClaim not created yet"),
        ((claim(),), {"gpu_containers": ("main",)}, "asks for tessera.dev GPUs beside"),
        (
            tuple(
                claim(
                    name=n,
                    allocated=(AllocatedDevice(request="gpu", driver=DRIVER, pool=n, device="g"),),
                    allocated_node=n,
                )
                for n in ("n1", "n2")
            ),
            {},
            "claims are allocated on different nodes: n1, n2",
        ),
    ],
)
def test_what_tessera_cannot_honour_is_refused_with_the_field(
    claims: tuple[PodResourceClaim, ...], options: dict[str, Any], expected: str
) -> None:
    found = problems(*claims, **options)
    assert any(expected in p for p in found), found
    assert all(p.startswith("spec.") for p in found), found


def test_every_problem_is_reported_at_once() -> None:
    found = problems(claim(request("a", admin_access=True), request("b", capacity={"memory": "x"})))
    assert len(found) == 2
    assert "requests[0] (request 'a')" in found[0] and "requests[1] (request 'b')" in found[1]


def test_match_attribute_is_checked_on_the_chosen_gpus() -> None:
    result = plan(
        claim(
            request("a"),
            request("b"),
            constraints=(DeviceConstraint(match_attribute="resource.kubernetes.io/pcieRoot"),),
        )
    )
    assert isinstance(result, ClaimPlan)
    (check,) = result.constraints
    assert check.containers == (ask_container("pod-c", "a"), ask_container("pod-c", "b"))

    def gpu(root: str | None) -> DeviceDescription:
        attributes: dict[str, Any] = {} if root is None else {check.attribute: root}
        return DeviceDescription(name="gpu-0", attributes=attributes, capacity={})

    same = {check.containers[0]: [gpu("pci0000:00")], check.containers[1]: [gpu("pci0000:00")]}
    assert constraint_problem(result, same) is None
    apart = {check.containers[0]: [gpu("pci0000:00")], check.containers[1]: [gpu("pci0000:80")]}
    assert "does not hold" in (constraint_problem(result, apart) or "")
    unknown = {check.containers[0]: [gpu(None)]}
    assert constraint_problem(result, unknown) is not None


def test_memory_policy_rounding_and_ranges() -> None:
    assert round_memory(1, POLICY) == 512
    assert round_memory(513, POLICY) == 768
    assert round_memory(768, POLICY) == 768
    window = memory_range(81559, POLICY)  # a GPU whose memory is no multiple of the step
    assert (window.minimum, window.maximum, window.step) == (512, 81408, 256)
    assert memory_range(300, POLICY).minimum == 300  # the minimum never exceeds the GPU
    assert consumed({}, total_mib=81559, policy=POLICY) == Consumed(memory_mib=81408, compute=100)
    assert consumed({"memory": "8Gi", "compute": "25"}, total_mib=81559, policy=POLICY) == (
        Consumed(memory_mib=8192, compute=25)
    )
    assert "more than the GPU" in str(consumed({"memory": "90Gi"}, total_mib=81559, policy=POLICY))
    assert "not one of" in str(consumed({"cores": "1"}, total_mib=81559, policy=POLICY))


@pytest.mark.parametrize(
    ("nvml", "standard"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("0000:af:00.1", "0000:af:00.1"),
        ("3b:00.0", "0000:3b:00.0"),
        ("not a bus", None),
    ],
)
def test_pci_bus_ids_in_the_standard_notation(nvml: str, standard: str | None) -> None:
    assert pci_bus_id(nvml) == standard


def test_the_claims_travel_in_pod_pending() -> None:
    from shared.messages.pods import PodPending

    pod = PodPending(uid="u", namespace="n", name="p", containers=(), claims=(claim(),))
    decoded = msgspec.json.decode(msgspec.json.encode(pod), type=PodPending)
    assert decoded == pod
    old = msgspec.json.decode(
        b'{"uid":"u","namespace":"n","name":"p","containers":[]}', type=PodPending
    )
    assert old.claims == ()
