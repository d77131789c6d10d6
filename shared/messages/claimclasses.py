"""KV ``tessera-claim-classes``: the device classes of the cluster's ResourceClaims and
ResourceClaimTemplates (binder -> webhook, docs/design.md §14).

The webhook cannot read Kubernetes (only the binder may), yet it must know whether a pod's
claims are of class ``gpu.tessera.dev`` to default the pod's scheduler to Tessera's and refuse
it on any other (one allocator per device). So the binder publishes, per ResourceClaimTemplate
and per ResourceClaim made by a user (not the ones kube-controller-manager makes from a
template for one pod: a pod names the template, never those), the classes its requests name,
and, under ``_listed``, its word that every one is there.
"""

from __future__ import annotations

from typing import Literal

from shared.messages.base import Message

ClaimKind = Literal["claim", "template"]


class ClaimClasses(Message, frozen=True, kw_only=True):
    """One ResourceClaim's or ResourceClaimTemplate's device classes (gone: a deleted key)."""

    kind: ClaimKind
    namespace: str
    name: str
    classes: tuple[str, ...] = ()
    """Every ``deviceClassName`` of its requests and their ``firstAvailable`` subrequests,
    sorted."""
    observed_at: float = 0.0


class ClaimClassesListed(Message, frozen=True, kw_only=True):
    """Every claim and template of the cluster has its entry, and the binder keeps them
    current."""

    objects: int
    """How many there were when this was written."""
    listed_at: float = 0.0
