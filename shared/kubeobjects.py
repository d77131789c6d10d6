"""Pure: the parts of a Kubernetes Pod that Tessera reads, decoded straight from API JSON.

msgspec Structs over the JSON the API server (or kube-scheduler, calling the extender) sends:
unknown fields are skipped, so decoding is fast and a newer API server's additions never break
it. Quantities stay as the API wrote them (text, or a number from a lenient server);
``shared.quantity`` turns them into numbers. The binder reads pods from its informer, the placer's
scheduler extender from kube-scheduler's requests; both parse them with ``shared.podspec``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

Quantity = str | int | float


class ObjectMeta(msgspec.Struct, frozen=True, gc=False, kw_only=True, rename="camel"):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None

    @property
    def key(self) -> str:
        """``namespace/name`` (just ``name`` for cluster-scoped objects)."""
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


class ClaimReference(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A container's ``resources.claims[]`` entry: a pod claim (and one request of it)."""

    name: str
    request: str = ""


class ResourceRequirements(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    limits: dict[str, Quantity] | None = None
    requests: dict[str, Quantity] | None = None
    claims: tuple[ClaimReference, ...] | None = None


class PodResourceClaim(msgspec.Struct, frozen=True, gc=False, kw_only=True, rename="camel"):
    """A ``spec.resourceClaims[]`` entry: a ResourceClaim by name, or one made from a
    ResourceClaimTemplate for the pod."""

    name: str
    resource_claim_name: str | None = None
    resource_claim_template_name: str | None = None


class PodResourceClaimStatus(msgspec.Struct, frozen=True, gc=False, kw_only=True, rename="camel"):
    """A ``status.resourceClaimStatuses[]`` entry: the claim made from a template."""

    name: str
    resource_claim_name: str | None = None


class Container(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    name: str = ""
    resources: ResourceRequirements = ResourceRequirements()


class PodSpec(msgspec.Struct, frozen=True, gc=False, kw_only=True, rename="camel"):
    node_name: str | None = None
    scheduler_name: str | None = None
    priority: int | None = None
    containers: tuple[Container, ...] = ()
    init_containers: tuple[Container, ...] | None = None
    overhead: dict[str, Quantity] | None = None
    node_selector: dict[str, str] | None = None
    affinity: dict[str, Any] | None = None
    """The scheduling constraints as the API wrote them: ``shared.scheduling`` reads them
    strictly (a field it does not know is refused, never skipped)."""
    tolerations: tuple[dict[str, Any], ...] | None = None
    topology_spread_constraints: tuple[dict[str, Any], ...] | None = None
    scheduling_gates: tuple[dict[str, Any], ...] | None = None
    resource_claims: tuple[PodResourceClaim, ...] | None = None


class Condition(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    type: str
    status: str = ""
    reason: str | None = None
    message: str | None = None


class PodStatus(msgspec.Struct, frozen=True, gc=False, kw_only=True, rename="camel"):
    phase: str | None = None
    conditions: tuple[Condition, ...] | None = None
    resource_claim_statuses: tuple[PodResourceClaimStatus, ...] | None = None


class Pod(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    metadata: ObjectMeta
    spec: PodSpec = PodSpec()
    status: PodStatus = PodStatus()

    @property
    def node(self) -> str:
        return self.spec.node_name or ""

    @property
    def terminating(self) -> bool:
        return self.metadata.deletion_timestamp is not None

    @property
    def terminal(self) -> bool:
        return self.status.phase in ("Succeeded", "Failed")

    def condition(self, kind: str) -> Condition | None:
        return next((c for c in self.status.conditions or () if c.type == kind), None)


def epoch(stamp: str | None) -> float:
    """Seconds since the epoch of an RFC 3339 API timestamp (0.0 when absent or unreadable)."""
    if not stamp:
        return 0.0
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return 0.0
