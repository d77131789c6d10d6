"""Pure: the parts of a ``resource.k8s.io/v1`` ResourceClaim the binder reads, and a pod's claims
as the placer takes them (``PodPending.claims``, docs/design.md §14).

:func:`pod_claims` pairs each entry of a pod's ``spec.resourceClaims`` with the ResourceClaim
behind it: the one it names, or, for a template entry, the one kube-controller-manager made and
recorded in ``status.resourceClaimStatuses`` (absent until then: the placer explains it as "not
created yet" and the binder reads the pod again when the claim appears). Which containers use
each claim comes from their ``resources.claims``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from services.binder.rules.objects import ListMeta
from shared.kubeobjects import Pod
from shared.messages.resourceclaims import (
    AllocatedDevice,
    ClaimUse,
    DeviceConstraint,
    DeviceRequest,
    PodResourceClaim,
)

DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"


class OwnerReference(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool | None = None


class ClaimMeta(msgspec.Struct, frozen=True, gc=False, kw_only=True, rename="camel"):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    finalizers: tuple[str, ...] | None = None
    deletion_timestamp: str | None = None
    owner_references: tuple[OwnerReference, ...] | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class CelSelector(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    expression: str = ""


class Selector(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    cel: CelSelector | None = None


class CapacityRequests(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    requests: dict[str, str | int | float] | None = None


class ExactRequest(msgspec.Struct, frozen=True, gc=False, kw_only=True, rename="camel"):
    device_class_name: str = ""
    selectors: tuple[Selector, ...] | None = None
    allocation_mode: str | None = None
    count: int | None = None
    admin_access: bool | None = None
    tolerations: tuple[dict[str, Any], ...] | None = None
    capacity: CapacityRequests | None = None


class Request(msgspec.Struct, frozen=True, gc=False, kw_only=True, rename="camel"):
    name: str
    exactly: ExactRequest | None = None
    first_available: tuple[dict[str, Any], ...] | None = None


class Constraint(msgspec.Struct, frozen=True, gc=False, kw_only=True, rename="camel"):
    requests: tuple[str, ...] | None = None
    match_attribute: str | None = None
    distinct_attribute: str | None = None


class DeviceClaim(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    requests: tuple[Request, ...] | None = None
    constraints: tuple[Constraint, ...] | None = None


class ClaimSpec(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    devices: DeviceClaim = DeviceClaim()


class Result(msgspec.Struct, frozen=True, gc=False, kw_only=True, rename="camel"):
    request: str = ""
    driver: str = ""
    pool: str = ""
    device: str = ""
    share_id: str | None = msgspec.field(default=None, name="shareID")
    consumed_capacity: dict[str, str] | None = None


class AllocatedDevices(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    results: tuple[Result, ...] | None = None


class Allocation(msgspec.Struct, frozen=True, gc=False, kw_only=True, rename="camel"):
    devices: AllocatedDevices = AllocatedDevices()
    node_selector: dict[str, Any] | None = None


class Consumer(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    resource: str = ""
    name: str = ""
    uid: str = ""


class ClaimStatus(msgspec.Struct, frozen=True, gc=False, kw_only=True, rename="camel"):
    allocation: Allocation | None = None
    reserved_for: tuple[Consumer, ...] | None = None


class ResourceClaim(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    metadata: ClaimMeta
    spec: ClaimSpec = ClaimSpec()
    status: ClaimStatus = ClaimStatus()

    @property
    def reserved_uids(self) -> tuple[str, ...]:
        return tuple(c.uid for c in self.status.reserved_for or ())

    @property
    def made_for_a_pod(self) -> bool:
        """Made by kube-controller-manager from a template for one pod (its controller)."""
        return any(
            ref.kind == "Pod" and ref.controller for ref in self.metadata.owner_references or ()
        )


class TemplateSpec(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    spec: ClaimSpec = ClaimSpec()


class ResourceClaimTemplate(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    metadata: ClaimMeta
    spec: TemplateSpec = TemplateSpec()


class TemplateList(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    metadata: ListMeta = ListMeta()
    items: tuple[ResourceClaimTemplate, ...] | None = None


def device_classes(spec: ClaimSpec) -> tuple[str, ...]:
    """Every device class a claim's requests name (``firstAvailable`` subrequests too),
    sorted."""
    found: set[str] = set()
    for request in spec.devices.requests or ():
        if request.exactly is not None and request.exactly.device_class_name:
            found.add(request.exactly.device_class_name)
        for sub in request.first_available or ():
            name = sub.get("deviceClassName")
            if isinstance(name, str) and name:
                found.add(name)
    return tuple(sorted(found))


class ClaimList(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    metadata: ListMeta = ListMeta()
    items: tuple[ResourceClaim, ...] | None = None


def allocated_node(allocation: Allocation | None) -> str:
    """The node a node-local allocation's selector names ("" when none does)."""
    if allocation is None or not allocation.node_selector:
        return ""
    for term in allocation.node_selector.get("nodeSelectorTerms") or ():
        for field in term.get("matchFields") or ():
            if field.get("key") == "metadata.name" and field.get("values"):
                return str(field["values"][0])
    return ""


def _request(request: Request) -> DeviceRequest:
    exact = request.exactly or ExactRequest()
    return DeviceRequest(
        name=request.name,
        device_class=exact.device_class_name,
        allocation_mode="All" if exact.allocation_mode == "All" else "ExactCount",
        count=1 if exact.count is None else exact.count,
        selectors=tuple(s.cel.expression for s in exact.selectors or () if s.cel is not None),
        capacity={
            k: str(v) for k, v in ((exact.capacity or CapacityRequests()).requests or {}).items()
        },
        admin_access=bool(exact.admin_access),
        tolerations=len(exact.tolerations or ()),
        first_available=len(request.first_available or ()),
    )


def claim_name_of(pod: Pod, entry: str) -> str:
    """The ResourceClaim name behind the pod's claim ``entry`` ("": not created yet)."""
    for ref in pod.spec.resource_claims or ():
        if ref.name == entry and ref.resource_claim_name:
            return ref.resource_claim_name
    for status in pod.status.resource_claim_statuses or ():
        if status.name == entry and status.resource_claim_name:
            return status.resource_claim_name
    return ""


def pod_claims(
    pod: Pod, lookup: Callable[[str], ResourceClaim | None]
) -> tuple[PodResourceClaim, ...]:
    """Each of the pod's claims with the ResourceClaim behind it (``lookup``: by
    ``namespace/name``); one not created or not seen yet carries no claim name."""
    found = []
    namespace = pod.metadata.namespace
    for ref in pod.spec.resource_claims or ():
        used = tuple(
            ClaimUse(container=c.name, request=use.request)
            for c in pod.spec.containers
            for use in c.resources.claims or ()
            if use.name == ref.name
        )
        name = claim_name_of(pod, ref.name)
        claim = lookup(f"{namespace}/{name}") if name else None
        template = ref.resource_claim_template_name is not None
        if claim is None:
            found.append(PodResourceClaim(name=ref.name, template=template, used_by=used))
            continue
        allocation = claim.status.allocation
        found.append(
            PodResourceClaim(
                name=ref.name,
                claim=claim.metadata.name,
                uid=claim.metadata.uid,
                template=template,
                requests=tuple(_request(r) for r in claim.spec.devices.requests or ()),
                constraints=tuple(
                    DeviceConstraint(
                        requests=c.requests or (),
                        match_attribute=c.match_attribute or "",
                        distinct_attribute=c.distinct_attribute or "",
                    )
                    for c in claim.spec.devices.constraints or ()
                ),
                used_by=used,
                allocated=tuple(
                    AllocatedDevice(
                        request=r.request,
                        driver=r.driver,
                        pool=r.pool,
                        device=r.device,
                        share_id=r.share_id or "",
                        consumed=dict(r.consumed_capacity or {}),
                    )
                    for r in (allocation.devices.results or () if allocation else ())
                ),
                allocated_node=allocated_node(allocation),
                reserved_for=claim.reserved_uids,
                resource_version=claim.metadata.resource_version,
            )
        )
    return tuple(found)
