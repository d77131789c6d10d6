"""Restoring a bound pod's placement from its annotations into a NATS store that lost it
(``services/binder/rules/restoreplan.py``, pure), table-driven."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from services.binder.rules.restoreplan import restore_of
from shared import annotations as names
from shared.kubeobjects import Pod
from shared.messages.base import ContainerSlices, GpuSlice
from shared.messages.pods import PodRestore
from tests.binder.builders import NODE, container, pod

SLICE = GpuSlice(uuid="GPU-0003", index=3, memory_mib=8192, cores=30)
BIND_TIME = "2026-11-24T10:00:00.000000Z"


def annotated(
    containers: tuple[ContainerSlices, ...] = (ContainerSlices(container="main", gpus=(SLICE,)),),
    *,
    node: str = NODE,
    commit: str = "placer-1.abc",
    assigned: bool = False,
) -> dict[str, str]:
    values = {
        names.ASSIGNMENT: names.assignment_value(
            node=node,
            containers=containers,
            decided_at=1_700_000_000.0,
            placer_id="placer-1",
            commit=commit,
        ),
        names.BIND_TIME: BIND_TIME,
    }
    if assigned:
        values[names.ASSIGNED] = "true"
    return values


def bound(annotations: dict[str, str] | None, *containers: dict[str, Any], **extra: Any) -> Pod:
    status = extra.pop("status", None)
    obj = pod(
        "train",
        *(containers or (container(gpu=1, memory=8192, cores=30),)),
        annotations=annotations,
        node=extra.pop("node", NODE),
        **extra,
    )
    obj["metadata"]["uid"] = "uid-1"
    if status is not None:
        obj["status"] = status
    return msgspec.convert(obj, Pod, strict=False)


def test_a_bound_pod_is_restored_as_it_was_bound() -> None:
    restore = restore_of(bound(annotated()), store_epoch="e2")
    assert isinstance(restore, PodRestore)
    assert (restore.node, restore.commit, restore.state, restore.epoch) == (
        NODE,
        "placer-1.abc",
        "bound",
        "e2",
    )
    (only,) = restore.containers
    assert only.gpus == (SLICE,)
    assert only.resources == {
        "tessera.dev/gpu": 1,
        "tessera.dev/gpu-memory": 8192,
        "tessera.dev/gpu-cores": 30,
    }
    assert restore.pod.uid == "uid-1" and restore.pod.containers[0].gpu_memory_mib == 8192
    assert restore.bound_at == pytest.approx(1795514400.0)


def test_an_allocated_pod_is_restored_allocated_and_an_old_annotation_gets_a_commit() -> None:
    restore = restore_of(bound(annotated(commit="", assigned=True)), store_epoch="e2")
    assert isinstance(restore, PodRestore)
    assert (restore.state, restore.commit) == ("allocated", "restored.uid-1")


def test_a_running_pod_not_yet_marked_allocated_is_restored_allocated() -> None:
    """The kubelet ran the pod, so its device plugin had allocated it; the store was lost before
    the binder marked it (``tessera.dev/assigned``). Restored ``bound``, its record held the
    node's ambiguity gate shut with no Allocate ever to come."""
    running = bound(annotated(), status={"phase": "Running"})
    restore = restore_of(running, store_epoch="e2")
    assert isinstance(restore, PodRestore) and restore.state == "allocated"


TWO = ContainerSlices(container="main", gpus=(SLICE, msgspec.structs.replace(SLICE, index=4)))


@pytest.mark.parametrize(
    ("annotations", "node", "says"),
    [
        pytest.param(annotated(), "", "not bound", id="not-bound"),
        pytest.param(None, NODE, "bound without a tessera.dev/assignment", id="no-annotation"),
        pytest.param({names.ASSIGNMENT: "{not json"}, NODE, "does not read", id="garbage"),
        pytest.param(annotated(node="gpu-9"), NODE, "names node gpu-9", id="other-node"),
        pytest.param(annotated((TWO,)), NODE, "2 GPU shares; its spec asks for 1", id="more"),
        pytest.param(
            annotated((ContainerSlices(container="sidecar", gpus=(SLICE,)),)),
            NODE,
            "container 'sidecar' 1 GPU shares; its spec asks for 0",
            id="no-such-container",
        ),
        pytest.param(annotated(()), NODE, "leaves GPU containers of the pod", id="none"),
    ],
)
def test_what_cannot_be_restored_says_why(
    annotations: dict[str, str] | None, node: str, says: str
) -> None:
    refused = restore_of(bound(annotations, node=node), store_epoch="e2")
    assert isinstance(refused, str) and says in refused, refused


def test_two_shares_on_one_gpu_are_refused() -> None:
    twice = ContainerSlices(container="main", gpus=(SLICE, SLICE))
    refused = restore_of(
        bound(annotated((twice,)), container(gpu=2, memory=4096)), store_epoch="e2"
    )
    assert refused == "tessera.dev/assignment puts two shares of 'main' on one GPU"
