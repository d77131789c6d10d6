"""Pure: what ``kubectl describe pod`` shows of Tessera's work, and the API bodies that carry it.

Pending pods get ``PodScheduled=False``, reason ``Unschedulable``, and a message in kube-scheduler's
style: ``0/12 nodes are available: 3 insufficient GPU memory, 9 GPU model not allowed.`` (counts
first, entries sorted as kube-scheduler sorts them), plus a Warning Event ``FailedScheduling`` with
the same text. A pod Tessera cannot take on at all (NATS does not store its placement request) gets
reason ``SchedulerError``, kube-scheduler's for its own failures, and the bus's error
(:func:`not_queued_message`). Bound pods get a Normal ``Scheduled`` Event naming the node and GPUs;
a pod bound but not allocated in time gets a Warning ``AllocationDelayed``.

Events are events.k8s.io/v1 objects; repeats of one event are a series (count and last time),
as client-go's event recorder writes them.
"""

from __future__ import annotations

from typing import Any, Final

from shared import annotations as names
from shared.kubeobjects import Pod
from shared.messages.assignments import AssignmentRecord, holds_gpus
from shared.messages.placement import PlacementRejected

SCHEDULED: Final = "PodScheduled"
UNSCHEDULABLE: Final = "Unschedulable"
GATED: Final = "SchedulingGated"
"""The reason of a pod held by scheduling gates (the API server's)."""
SCHEDULER_ERROR: Final = "SchedulerError"
"""The reason of a pod Tessera cannot take on at all (kube-scheduler's for its own failures)."""
REPORTING_CONTROLLER: Final = "tessera.dev/binder"
NOTE_LIMIT: Final = 1024
"""events.k8s.io/v1 rejects a note over 1 KiB."""

Obj = dict[str, Any]


def unschedulable_message(rejected: PlacementRejected) -> str:
    """The kube-scheduler style summary of a rejection."""
    if not rejected.reasons:
        text = rejected.message or "no node with Tessera GPUs is known yet"
        return f"0/0 nodes are available: {text}."
    total = sum(r.nodes for r in rejected.reasons)
    counted = sorted(f"{r.nodes} {r.reason}" for r in rejected.reasons)
    message = f"0/{total} nodes are available: {', '.join(counted)}."
    if rejected.unresolvable:
        message += " No change in the cluster can make this request fit; change the request."
    return message


def not_queued_message(error: BaseException) -> str:
    """Why a pod is not being placed at all: NATS did not take its placement request."""
    return (
        f"Tessera cannot queue this pod for placement: NATS did not store its request "
        f"({type(error).__name__}: {error}). The binder tries again; check NATS."
    )


def reports_unschedulable(pod: Pod, message: str, *, reason: str = UNSCHEDULABLE) -> bool:
    """Whether the pod already says ``PodScheduled=False/<reason>`` with ``message``."""
    condition = pod.condition(SCHEDULED)
    return (
        condition is not None
        and condition.status == "False"
        and condition.reason == reason
        and condition.message == message
    )


def unschedulable_patch(*, uid: str, message: str, now: str, reason: str = UNSCHEDULABLE) -> Obj:
    """A strategic merge patch of ``pods/status`` (conditions merge by type), guarded by uid."""
    return {
        "metadata": {"uid": uid},
        "status": {
            "conditions": [
                {
                    "type": SCHEDULED,
                    "status": "False",
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": now,
                }
            ]
        },
    }


def assigned_patch(*, uid: str) -> Obj:
    """A merge patch marking the pod ``tessera.dev/assigned: "true"``, guarded by uid."""
    return {"metadata": {"uid": uid, "annotations": {names.ASSIGNED: "true"}}}


def describe_slices(record: AssignmentRecord) -> str:
    """``GPU-1234 (8192 MiB, 30% SMs)`` per share, by container when there are several."""
    parts = []
    gpu_containers = [c for c in record.containers if c.gpus]
    for container in gpu_containers:
        shares = ", ".join(
            f"GPU {g.index} {g.uuid} ({g.memory_mib} MiB, {g.cores}% SMs)" for g in container.gpus
        )
        parts.append(f"{container.container}: {shares}" if len(gpu_containers) > 1 else shares)
    return "; ".join(parts)


def scheduled_note(record: AssignmentRecord) -> str:
    note = f"Successfully assigned {record.namespace}/{record.name} to {record.node}"
    slices = describe_slices(record)
    return f"{note} with {slices}" if slices else note


def status_time(at: float) -> str:
    """A condition's ``lastTransitionTime``: RFC 3339 UTC to the second."""
    return names.time_value(at)[:19] + "Z"


def allocation_delay(record: AssignmentRecord, *, now: float, warning_s: float) -> float | None:
    """How long ``record`` has been bound without its GPUs allocated, when that is
    ``warning_s`` or more; None otherwise (not bound, or nothing to allocate: no device plugin
    comes)."""
    if record.state != "bound" or record.bound_at is None or not holds_gpus(record):
        return None
    waited = now - record.bound_at
    return waited if waited >= warning_s else None


def allocation_delayed_note(record: AssignmentRecord, waited_s: float) -> str:
    return (
        f"bound to node {record.node} {waited_s:.0f} s ago, but the Tessera device plugin on "
        f"{record.node} has not allocated its GPUs yet; check the tessera-deviceplugin pod and "
        f"the kubelet on {record.node}"
    )


def regarding_pod(*, namespace: str, name: str, uid: str) -> dict[str, str]:
    return {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid}


def truncate_note(note: str) -> str:
    data = note.encode()
    if len(data) <= NOTE_LIMIT:
        return note
    return data[: NOTE_LIMIT - 3].decode(errors="ignore") + "..."


def event_body(
    *,
    name: str,
    regarding: dict[str, str],
    event_type: str,
    reason: str,
    action: str,
    note: str,
    instance: str,
    now: str,
) -> Obj:
    """A new events.k8s.io/v1 Event."""
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": regarding["namespace"]},
        "eventTime": now,
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": instance[:128],
        "action": action,
        "reason": reason,
        "regarding": regarding,
        "note": truncate_note(note),
        "type": event_type,
    }


def series_patch(*, count: int, last: str) -> Obj:
    """A merge patch recording that an event happened ``count`` times, the last at ``last``."""
    return {"series": {"count": count, "lastObservedTime": last}}
