"""A pod's DRA ResourceClaims as the binder reads them, carried in ``PodPending.claims``.

The binder is the only Kubernetes client, so it reads each claim a pod names (directly, or the one
kube-controller-manager made from a template) and hands the placer the parts it decides on: the
requests (class, count, selectors, capacity), the constraints, which containers use the claim,
and, for a claim already allocated (one shared by several pods), where and what. The placer turns
them into asks with ``shared.dra.claims``; nothing here is evaluated yet.
"""

from __future__ import annotations

from typing import Literal

from shared.messages.base import Message

AllocationMode = Literal["ExactCount", "All"]


class DeviceRequest(Message, frozen=True, kw_only=True):
    """One ``spec.devices.requests[]`` entry of a claim (its ``exactly`` form)."""

    name: str
    device_class: str = ""
    """``exactly.deviceClassName``."""
    class_selectors: tuple[str, ...] = ()
    """The DeviceClass's CEL selectors (every device must satisfy them too)."""
    allocation_mode: AllocationMode = "ExactCount"
    count: int = 1
    selectors: tuple[str, ...] = ()
    """The request's CEL expressions (``selectors[].cel.expression``)."""
    capacity: dict[str, str] = {}
    """``capacity.requests``: capacity name -> quantity, as written."""
    admin_access: bool = False
    tolerations: int = 0
    """How many device taint tolerations the request carries."""
    first_available: int = 0
    """How many ``firstAvailable`` subrequests it has instead of ``exactly`` (0: none)."""


class DeviceConstraint(Message, frozen=True, kw_only=True):
    """One ``spec.devices.constraints[]`` entry."""

    requests: tuple[str, ...] = ()
    """The requests it covers (empty: all of the claim's)."""
    match_attribute: str = ""
    distinct_attribute: str = ""


class ClaimUse(Message, frozen=True, kw_only=True):
    """A container that lists the claim in ``resources.claims`` (``request`` empty: all of it)."""

    container: str
    request: str = ""


class AllocatedDevice(Message, frozen=True, kw_only=True):
    """One ``status.allocation.devices.results[]`` entry."""

    request: str
    driver: str
    pool: str
    device: str
    share_id: str = ""
    consumed: dict[str, str] = {}
    """``consumedCapacity``: capacity name -> quantity."""


class PodResourceClaim(Message, frozen=True, kw_only=True):
    """One entry of the pod's ``spec.resourceClaims`` with the ResourceClaim behind it."""

    name: str
    """The pod's name for it (``spec.resourceClaims[].name``)."""
    claim: str = ""
    """The ResourceClaim's name ("": made from a template and not created yet)."""
    uid: str = ""
    template: bool = False
    """Made from a ResourceClaimTemplate for this pod alone."""
    requests: tuple[DeviceRequest, ...] = ()
    constraints: tuple[DeviceConstraint, ...] = ()
    used_by: tuple[ClaimUse, ...] = ()
    allocated: tuple[AllocatedDevice, ...] = ()
    """Its allocation's results (empty: not allocated)."""
    allocated_node: str = ""
    """The node its allocation's node selector names ("" when not allocated)."""
    reserved_for: tuple[str, ...] = ()
    """UIDs of the pods ``status.reservedFor`` names."""
    resource_version: str = ""
