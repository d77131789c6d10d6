"""Node facts from a Node and its pods; what kubectl describe shows of Tessera's work."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import msgspec
import pytest

from services.binder.rules import describe
from services.binder.rules.nodefacts import (
    Requested,
    gone_facts,
    node_facts,
    only_tessera_moved,
    pod_requested,
    same_facts,
)
from services.binder.rules.objects import Node
from shared.kubeobjects import Pod
from shared.messages.nodes import NodeFacts
from shared.podspec import FieldError, InvalidPod
from tests.binder.builders import container, node, pod, record, rejection, slices

K8S_VERSION = kubernetes_validate.utils.latest_version()


def as_pod(body: dict[str, Any]) -> Pod:
    return msgspec.convert(body, Pod)


def validate_strict(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    ("body", "cpu", "memory"),
    [
        pytest.param(
            pod("a", container(cpu="250m", ram="512Mi"), container(cpu="1", ram="1Gi")),
            1250,
            1536,
            id="sum-of-containers",
        ),
        pytest.param(
            pod(
                "b",
                container(cpu="100m", ram="64Mi"),
                init_containers=[container("init", cpu="2", ram="4Gi")],
            ),
            2000,
            4096,
            id="largest-init-container",
        ),
        pytest.param(pod("c", container(cpu=None, ram=None)), 0, 0, id="best-effort"),
    ],
)
def test_pod_requests_count_as_kube_scheduler_counts(
    body: dict[str, Any], cpu: int, memory: int
) -> None:
    assert pod_requested(as_pod(body), ours=True) == Requested(
        cpu_milli=cpu, memory_mib=memory, tessera_cpu_milli=cpu, tessera_memory_mib=memory
    )
    other = pod_requested(as_pod(body), ours=False)
    assert (other.cpu_milli, other.tessera_cpu_milli) == (cpu, 0)


def test_node_facts() -> None:
    body = node(
        "gpu-7",
        cpu="63500m",
        memory="255Gi",
        gpus=16,
        unschedulable=True,
        labels={"nvidia.com/gpu.product": "A100"},
        extra={"tessera.dev/gpu-memory": "81920", "nvidia.com/gpu": "4"},
    )
    facts = node_facts(
        msgspec.convert(body, Node),
        Requested(cpu_milli=1500, memory_mib=2048, tessera_cpu_milli=500, tessera_memory_mib=1024),
        now=12.5,
    )
    assert facts == NodeFacts(
        node="gpu-7",
        cpu_allocatable_milli=63500,
        memory_allocatable_mib=255 * 1024,
        cpu_requested_milli=1500,
        memory_requested_mib=2048,
        tessera_cpu_requested_milli=500,
        tessera_memory_requested_mib=1024,
        labels={"nvidia.com/gpu.product": "A100"},
        ready=True,
        schedulable=False,
        observed_at=12.5,
        extended_allocatable={"tessera.dev/gpu": 16, "tessera.dev/gpu-memory": 81920},
    )
    not_ready = node_facts(msgspec.convert(node("n", ready=False), Node), Requested(), now=1.0)
    assert not not_ready.ready
    assert same_facts(facts, msgspec.structs.replace(facts, observed_at=99.0))
    assert not same_facts(facts, msgspec.structs.replace(facts, cpu_requested_milli=1))
    assert gone_facts("gpu-7", now=3.0).deleted


PUBLISHED = NodeFacts(
    node="gpu-7",
    cpu_allocatable_milli=64000,
    memory_allocatable_mib=262144,
    cpu_requested_milli=3000,
    memory_requested_mib=4096,
    tessera_cpu_requested_milli=1000,
    tessera_memory_requested_mib=1024,
    observed_at=1.0,
)


@pytest.mark.parametrize(
    ("change", "held"),
    [
        pytest.param({"observed_at": 9.0}, True, id="nothing-but-the-time"),
        pytest.param(
            {
                "cpu_requested_milli": 3500,
                "tessera_cpu_requested_milli": 1500,
                "memory_requested_mib": 5120,
                "tessera_memory_requested_mib": 2048,
            },
            True,
            id="a-tessera-pod-bound",
        ),
        pytest.param(
            {"cpu_requested_milli": 2000, "tessera_cpu_requested_milli": 0},
            True,
            id="a-tessera-pod-gone",
        ),
        pytest.param({"cpu_requested_milli": 3500}, False, id="another-pod-s-cpu"),
        pytest.param(
            {"memory_requested_mib": 5120, "tessera_memory_requested_mib": 1536},
            False,
            id="both-moved-unequally",
        ),
        pytest.param({"schedulable": False}, False, id="cordoned"),
        pytest.param({"labels": {"zone": "b"}}, False, id="labels"),
        pytest.param(
            {"cpu_requested_milli": 3500, "tessera_cpu_requested_milli": 1500, "ready": False},
            False,
            id="tessera-pod-and-not-ready",
        ),
    ],
)
def test_only_tessera_s_own_pods_moving_can_wait(change: dict[str, Any], held: bool) -> None:
    assert only_tessera_moved(PUBLISHED, msgspec.structs.replace(PUBLISHED, **change)) is held


@pytest.mark.parametrize(
    ("reasons", "unresolvable", "message"),
    [
        pytest.param(
            [(9, "GPU model not allowed"), (3, "insufficient GPU memory")],
            False,
            "0/12 nodes are available: 3 insufficient GPU memory, 9 GPU model not allowed.",
            id="kube-scheduler-order",
        ),
        pytest.param(
            [(12, "insufficient CPU"), (3, "unhealthy GPU")],
            False,
            "0/15 nodes are available: 12 insufficient CPU, 3 unhealthy GPU.",
            id="sorted-as-strings",
        ),
        pytest.param(
            [(4, "too few GPUs of an allowed model or group")],
            True,
            "0/4 nodes are available: 4 too few GPUs of an allowed model or group. No change in "
            "the cluster can make this request fit; change the request.",
            id="unresolvable",
        ),
        pytest.param(
            [],
            False,
            "0/0 nodes are available: no node with Tessera GPUs is known yet.",
            id="no-nodes",
        ),
    ],
)
def test_unschedulable_message(
    reasons: list[tuple[int, str]], unresolvable: bool, message: str
) -> None:
    rejected = msgspec.structs.replace(rejection("u", "p", *reasons), unresolvable=unresolvable)
    assert describe.unschedulable_message(rejected) == message


def test_condition_patch_and_the_check_that_skips_repeating_it() -> None:
    message = "0/1 nodes are available: 1 insufficient GPU memory."
    patch = describe.unschedulable_patch(uid="u", message=message, now="2024-01-01T00:00:00Z")
    condition = patch["status"]["conditions"][0]
    body = pod("p")
    body["metadata"]["uid"] = "u"
    body["status"] = {"conditions": [condition]}
    assert describe.reports_unschedulable(as_pod(body), message)
    assert not describe.reports_unschedulable(as_pod(body), "something else")
    assert not describe.reports_unschedulable(as_pod(pod("q")), message)


def test_notes_read_well() -> None:
    rec = record("u", "train", slices("main", (2, 8192, 30)))
    assert describe.scheduled_note(rec) == (
        "Successfully assigned default/train to gpu-1 with GPU 2 GPU-0002 (8192 MiB, 30% SMs)"
    )
    two = record("u", "t", slices("a", (0, 1, 10)), slices("b", (1, 2, 20)))
    assert describe.describe_slices(two) == (
        "a: GPU 0 GPU-0000 (1 MiB, 10% SMs); b: GPU 1 GPU-0001 (2 MiB, 20% SMs)"
    )
    assert "has not allocated its GPUs yet" in describe.allocation_delayed_note(rec, 61.2)
    invalid = InvalidPod(
        uid="u", namespace="d", name="p", errors=(FieldError(field="f", problem="bad"),)
    )
    assert invalid.reason == "Tessera cannot place this pod as written: f: bad"


def test_event_bodies_are_valid_kubernetes_objects() -> None:
    event = describe.event_body(
        name="p.17a2b3c4d5e6f708",
        regarding=describe.regarding_pod(namespace="default", name="p", uid="u"),
        event_type="Warning",
        reason="FailedScheduling",
        action="Scheduling",
        note="x" * 3000,
        instance="host_abcd",
        now="2024-01-01T00:00:00.000000Z",
    )
    validate_strict(event)
    assert len(event["note"].encode()) <= 1024
    validate_strict(
        {
            **event,
            "series": describe.series_patch(count=3, last="2024-01-01T00:00:05.000000Z")["series"],
        }
    )
