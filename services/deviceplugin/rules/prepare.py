"""Pure: the DRA side's NodePrepareResources as plain functions over assignment records
(docs/design.md §14).

The kubelet names the claim (namespace, name, uid), never its devices; the node plugin does not
read the ResourceClaim (only the binder talks to the Kubernetes API). What the claim holds on
this node is what a placer committed: a record on this node, ``bound`` or ``allocated``, in the
claim's namespace, whose containers include the claim's asks (``resourceclaims/<claim>/<request>``,
``shared.dra.claims``) and which stands for its commit (``shared.commits``, the rule Allocate
applies). A claim several pods share is in each of their records, with the same slices; records
that disagree are refused rather than one picked.

Once prepared, each ``bound`` record holding the claim moves on as an Allocate would move it
(:func:`advanced_by`): its claim's containers answered with their CDI device IDs, ``allocated``
once every GPU container is, so the placers' hand-off counts, the binder and the dashboard see
the pod's GPUs handed over when they are, as for a device-plugin pod.

The answer is one CDI spec per claim (``gpu.tessera.dev/gpu``, one CDI device per request of the
claim named ``<claim uid>-<request>``) whose env is what Allocate would hand a container holding
the same slices (``allocate.slice_environment``: UUIDs, memory limit and total, compute share,
the node's isolation provider, the compatibility variables), and per GPU a device for the kubelet
(``gpu-<index>`` of the node's pool, the request, the CDI name). A container that lists the claim
(or one of its requests) gets that env through the container runtime's CDI.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgspec

from services.deviceplugin.rules.allocate import (
    Refusal,
    ResponseOptions,
    slice_environment,
    uncommitted,
)
from shared.dra.claims import claim_of_container
from shared.dra.devices import DRIVER, device_name
from shared.messages.assignments import (
    AssignmentRecord,
    ContainerAllocation,
    RecordView,
    with_answers,
)
from shared.messages.base import ContainerSlices
from shared.messages.inventory import GpuTelemetry
from shared.messages.ledger import Booking

CDI_KIND: Final = f"{DRIVER}/gpu"
CDI_VERSION: Final = "0.6.0"
HEALTHY: Final = "healthy"
PREPARABLE: Final = frozenset({"bound", "allocated"})


class ClaimRef(msgspec.Struct, frozen=True, kw_only=True):
    """A claim as the kubelet names it."""

    namespace: str
    name: str
    uid: str


class PreparedDevice(msgspec.Struct, frozen=True, kw_only=True):
    """One device of the NodePrepareResources answer."""

    request: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]


class Prepared(msgspec.Struct, frozen=True, kw_only=True):
    """A claim made ready: its CDI spec (to write) and the devices to answer."""

    claim: ClaimRef
    spec: dict[str, Any]
    devices: tuple[PreparedDevice, ...]
    record: str
    """The key of the record it was prepared from."""


def cdi_name(claim_uid: str, request: str) -> str:
    return f"{claim_uid}-{request}"


def claim_asks(
    views: Iterable[RecordView], claim: ClaimRef
) -> list[tuple[RecordView, dict[str, ContainerSlices]]]:
    """The preparable records of the claim's namespace holding asks of it, with those asks by
    request."""
    found = []
    for view in views:
        record = view.record
        if record.state not in PREPARABLE or record.namespace != claim.namespace:
            continue
        asks: dict[str, ContainerSlices] = {}
        for container in record.containers:
            named = claim_of_container(container.container)
            if named is not None and named[0] == claim.name:
                asks[named[1]] = container
        if asks:
            found.append((view, asks))
    return found


def plan_prepare(
    claim: ClaimRef,
    views: Iterable[RecordView],
    *,
    node: str,
    gpus: Mapping[str, GpuTelemetry],
    options: ResponseOptions,
    bookings: Mapping[str, Booking],
) -> Prepared | Refusal:
    """The CDI spec and devices of ``claim``, or why it is not prepared (see the module
    docstring): no record holds it, none stands for a placer's commit, they disagree, or a GPU
    it was decided on is not in the inventory or not healthy."""
    candidates = claim_asks(views, claim)
    what = f"ResourceClaim {claim.namespace}/{claim.name} ({claim.uid})"
    if not candidates:
        return Refusal(
            kind="no_record",
            message=f"{what}: no bound assignment record on node {node} holds it",
        )
    committed = []
    first_refusal: Refusal | None = None
    for view, asks in candidates:
        refusal = uncommitted(view, bookings=bookings)
        if refusal is None:
            committed.append((view, asks))
        else:
            first_refusal = first_refusal or refusal
    if not committed:
        assert first_refusal is not None
        return Refusal(kind="uncommitted", message=f"{what}: {first_refusal.message}")
    view, asks = committed[0]
    for other, other_asks in committed[1:]:
        if {r: c.gpus for r, c in other_asks.items()} != {r: c.gpus for r, c in asks.items()}:
            return Refusal(
                kind="conflict",
                message=f"{what}: records {view.key} and {other.key} hold it on different GPUs",
            )
    record = view.record
    pod_mib = sum(s.memory_mib for c in record.containers for s in c.gpus)
    spec_devices: list[dict[str, Any]] = []
    devices: list[PreparedDevice] = []
    for request, container in sorted(asks.items()):
        missing = [s.uuid for s in container.gpus if s.uuid not in gpus]
        sick = [
            s.uuid for s in container.gpus if s.uuid in gpus and gpus[s.uuid].health != "healthy"
        ]
        if missing or sick or not container.gpus:
            return Refusal(
                kind="unavailable",
                message=f"{what}: request {request} was decided on GPU "
                f"{', '.join(missing + sick) or '(none)'}, which is not in node {node}'s "
                "inventory or not healthy",
            )
        totals = [gpus[s.uuid].memory_total_mib for s in container.gpus]
        envs, mounts = slice_environment(
            container.gpus, totals, options=options, pod_memory_mib=pod_mib
        )
        name = cdi_name(claim.uid, request)
        edits: dict[str, Any] = {"env": [f"{k}={v}" for k, v in sorted(envs.items())]}
        if mounts:
            edits["mounts"] = [
                {
                    "hostPath": m.host_path,
                    "containerPath": m.container_path,
                    "options": ["ro" if m.read_only else "rw", "bind"],
                }
                for m in mounts
            ]
        spec_devices.append({"name": name, "containerEdits": edits})
        devices.extend(
            PreparedDevice(
                request=request,
                pool=node,
                device=device_name(s.index),
                cdi_ids=(f"{CDI_KIND}={name}",),
            )
            for s in container.gpus
        )
    spec = {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": spec_devices}
    return Prepared(claim=claim, spec=spec, devices=tuple(devices), record=view.key)


def advanced_by(
    prepared: Iterable[Prepared],
    views: Iterable[RecordView],
    *,
    bookings: Mapping[str, Booking],
    now: float,
) -> list[tuple[RecordView, AssignmentRecord]]:
    """The ``bound`` records a placer committed that hold claims of ``prepared`` (one kubelet
    call's: a pod's claims come together), each with those claims' containers answered (their
    requests' CDI IDs, at ``now``) and ``allocated`` once no GPU container of the record waits;
    what to write, by compare-and-set on each view."""
    cdi_ids: dict[tuple[str, str, str], tuple[str, ...]] = {}
    for claim in prepared:
        for device in claim.devices:
            key = (claim.claim.namespace, claim.claim.name, device.request)
            cdi_ids[key] = tuple(dict.fromkeys((*cdi_ids.get(key, ()), *device.cdi_ids)))
    moves = []
    for view in views:
        record = view.record
        if record.state != "bound" or uncommitted(view, bookings=bookings) is not None:
            continue
        answered = {a.container for a in record.allocated}
        added = []
        for container in record.containers:
            named = claim_of_container(container.container)
            if named is None or not container.gpus or container.container in answered:
                continue
            ids = cdi_ids.get((record.namespace, *named))
            if ids is not None:
                added.append(
                    ContainerAllocation(
                        container=container.container, device_ids=ids, allocated_at=now
                    )
                )
        if added:
            moves.append((view, with_answers(record, tuple(added), now=now)))
    return moves
