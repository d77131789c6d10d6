"""Every wire message round-trips through the codec, and evolves additively."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shared import codec
from shared.messages.assignments import AssignmentRecord, ContainerAllocation, moves_forward
from shared.messages.base import ContainerSlices, GpuSlice
from shared.messages.bindings import BindingResult
from shared.messages.deadletter import DeadLetter
from shared.messages.extender import PodLookup, PodLookupReply
from shared.messages.inventory import GpuLink, GpuProcess, GpuTelemetry, NodeInventory
from shared.messages.namespaces import NamespaceLabels, NamespacesListed
from shared.messages.nodes import NodeFacts
from shared.messages.placement import PlacementRejected, RejectionReason
from shared.messages.pods import ContainerRequest, PlacementHints, PodDeleted, PodPending
from shared.messages.stats import ClusterStats

NOW = 1_700_000_000.5

GPU = GpuTelemetry(
    uuid="GPU-aaaa",
    index=0,
    model="A100-SXM4-80GB",
    memory_total_mib=81920,
    memory_used_mib=1024,
    memory_free_mib=80896,
    utilization_pct=37,
    temperature_c=55,
    power_w=212.5,
    sm_clock_mhz=1410,
    sm_clock_max_mhz=1410,
    pci_bus_id="00000000:07:00.0",
    numa_node=0,
    nvlink_peers=("GPU-bbbb",),
    links=(GpuLink(peer_uuid="GPU-bbbb", level="single", nvlinks=12),),
    mig_enabled=False,
    processes=(GpuProcess(pid=4242, used_memory_mib=1000),),
    health="unhealthy",
    health_reason="XID 79: GPU has fallen off the bus",
)
SLICES = (
    ContainerSlices(
        container="trainer",
        gpus=(GpuSlice(uuid="GPU-aaaa", index=0, memory_mib=20480, cores=30),),
        resources={"tessera.dev/gpu": 1, "tessera.dev/gpu-memory": 20480},
    ),
)

EXAMPLES: list[Any] = [
    GPU,
    NodeInventory(node="n1", gpus=(GPU,), observed_at=NOW, sequence=7, driver_version="550.54"),
    NodeFacts(
        node="n1",
        cpu_allocatable_milli=64000,
        memory_allocatable_mib=262144,
        cpu_requested_milli=1000,
        memory_requested_mib=2048,
        labels={"tessera.dev/group": "team-a"},
        ready=True,
        schedulable=False,
        observed_at=NOW,
        extended_allocatable={"tessera.dev/gpu": 16},
        tessera_cpu_requested_milli=500,
        tessera_memory_requested_mib=1024,
    ),
    PodPending(
        uid="uid-1",
        namespace="ml",
        name="train-0",
        priority=1000,
        containers=(
            ContainerRequest(
                name="trainer",
                gpu_shares=2,
                gpu_memory_mib=20480,
                gpu_cores=30,
                cpu_milli=4000,
                memory_mib=8192,
                resources={"tessera.dev/gpu": 2},
            ),
            ContainerRequest(name="sidecar", cpu_milli=100),
        ),
        hints=PlacementHints(
            gpu_policy="colocate",
            node_policy="fgd",
            gpu_models=("A100", "H100"),
            gpu_models_excluded=("T4",),
            gpu_type="virtual",
            group="team-a",
            tenant="research",
            priority_label=5,
        ),
        created_at=NOW,
        resource_version="42",
    ),
    PodDeleted(uid="uid-1", namespace="ml", name="train-0", node="n1", deleted_at=NOW),
    PodLookup(uid="uid-1", namespace="ml", name="train-0"),
    PodLookupReply(
        uid="uid-1",
        pod=PodPending(
            uid="uid-1",
            namespace="ml",
            name="train-0",
            containers=(ContainerRequest(name="trainer", gpu_shares=1, gpu_memory_mib=4096),),
            extender=True,
        ),
    ),
    PodLookupReply(uid="uid-2", node="n1"),
    NamespaceLabels(namespace="shop", labels={"team": "web"}, observed_at=NOW),
    NamespacesListed(namespaces=12, listed_at=NOW),
    PodLookupReply(uid="uid-3", error="the pod no longer exists"),
    PlacementRejected(
        pod_uid="uid-2",
        namespace="ml",
        name="big",
        reasons=(
            RejectionReason(reason="insufficient GPU memory", nodes=3),
            RejectionReason(reason="unhealthy GPU", nodes=1),
        ),
        message="0/4 nodes fit",
        decided_at=NOW,
        placer_id="placer-0",
    ),
    AssignmentRecord(
        pod_uid="uid-1",
        namespace="ml",
        name="train-0",
        node="n1",
        containers=SLICES,
        state="allocated",
        decided_at=NOW,
        placer_id="placer-0",
        bound_at=NOW + 1,
        allocated=(
            ContainerAllocation(
                container="trainer", device_ids=("GPU-aaaa::0",), allocated_at=NOW + 2
            ),
        ),
        allocated_at=NOW + 2,
    ),
    BindingResult(
        pod_uid="uid-1", namespace="ml", name="train-0", node="n1", outcome="bound", at=NOW
    ),
    ClusterStats(
        placer_id="placer-0",
        computed_at=NOW,
        profile="tessera",
        nodes=2,
        gpus=16,
        gpu_milli_capacity=16000,
        gpu_milli_allocated=9500,
        fragmented_milli=620.5,
        fragmentation_pct=3.878,
        node_fragmented_milli={"n1": 400.0, "n2": 220.5},
        typical_tasks=2000,
        pending_pods=3,
    ),
    DeadLetter(
        family="pods",
        subject="tessera.pods.pending",
        reason="invalid PodPending: Expected `str`, got `int` - at `$.uid`",
        service="placer",
        payload='{"uid": 1}',
        received_at=NOW,
    ),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(message: Any) -> None:
    data = codec.encode(message)
    assert codec.decode(data, type(message)) == message


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_messages_are_readable_json(message: Any) -> None:
    as_dict = msgspec.json.decode(codec.encode(message))
    assert isinstance(as_dict, dict)
    assert set(as_dict) == set(msgspec.structs.asdict(message))


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_unknown_extra_fields_decode(message: Any) -> None:
    """A newer producer may add fields; an older consumer ignores them."""
    as_dict = msgspec.json.decode(codec.encode(message))
    as_dict["field_from_the_future"] = {"nested": [1, 2, 3]}
    assert codec.decode(msgspec.json.encode(as_dict), type(message)) == message


def test_missing_optional_fields_take_their_defaults() -> None:
    """An older producer omits fields added later; they decode to their defaults."""
    minimal = b'{"uid": "u", "namespace": "ns", "name": "p", "containers": [{"name": "c"}]}'
    pod = codec.decode(minimal, PodPending)
    assert pod.priority == 0
    assert pod.hints == PlacementHints()
    assert pod.containers == (ContainerRequest(name="c"),)

    gpu = codec.decode(
        b'{"uuid": "GPU-1", "index": 0, "model": "T4", "memory_total_mib": 15360,'
        b' "memory_used_mib": 0, "memory_free_mib": 15360}',
        GpuTelemetry,
    )
    assert gpu.health == "healthy"
    assert gpu.numa_node is None
    assert gpu.links == ()


@pytest.mark.parametrize(
    ("payload", "message_type", "expected"),
    [
        pytest.param(b"not json", PodPending, "malformed JSON", id="not-json"),
        pytest.param(
            b'{"uid": 5}', PodPending, "Expected `str`, got `int` - at `$.uid`", id="wrong-type"
        ),
        pytest.param(
            b'{"uid": "u"}', PodPending, "missing required field `namespace`", id="missing-required"
        ),
        pytest.param(
            b'{"uid": "u", "namespace": "n", "name": "p", "containers": [],'
            b' "hints": {"gpu_policy": "sideways"}}',
            PodPending,
            "Invalid enum value 'sideways' - at `$.hints.gpu_policy`",
            id="bad-enum",
        ),
        pytest.param(b"[1, 2]", NodeFacts, "Expected `object`, got `array`", id="not-an-object"),
    ],
)
def test_decode_failures_are_typed_errors_with_reasons(
    payload: bytes, message_type: type[Any], expected: str
) -> None:
    with pytest.raises(codec.DecodeError) as caught:
        codec.decode(payload, message_type)
    assert expected in caught.value.reason
    assert caught.value.message_type is message_type
    assert str(caught.value).startswith(f"invalid {message_type.__name__}: ")


def test_messages_are_frozen() -> None:
    with pytest.raises(AttributeError):
        GPU.index = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("current", "new", "allowed"),
    [
        ("reserved", "reserved", True),
        ("reserved", "bound", True),
        ("reserved", "allocated", True),
        ("reserved", "released", True),
        ("bound", "reserved", False),
        ("bound", "bound", True),
        ("bound", "allocated", True),
        ("bound", "released", True),
        ("allocated", "reserved", False),
        ("allocated", "bound", False),
        ("allocated", "allocated", True),
        ("allocated", "released", True),
        ("released", "reserved", False),
        ("released", "bound", False),
        ("released", "allocated", False),
        ("released", "released", True),
    ],
)
def test_assignment_states_only_move_forward(current: Any, new: Any, allowed: bool) -> None:
    """The one rule of a record's states within its commit, every pair of states: the same or a
    later one, never an earlier one (``reserved -> bound -> allocated -> released``)."""
    assert moves_forward(current, new) is allowed
