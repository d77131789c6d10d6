"""Pure: a pod's DRA claims as the admission webhook judges them (docs/design.md §14).

A pod names its claims in ``spec.resourceClaims``: a ResourceClaim by name
(``resourceClaimName``) or a ResourceClaimTemplate (``resourceClaimTemplateName``). Whether one is
of class ``gpu.tessera.dev`` is read from the index the binder publishes (``claimindex.py``: each
claim's and template's device classes), looked up through a :data:`Lookup`. A pod with such a
claim is Tessera's to place, whatever it asks otherwise: the webhook defaults its scheduler to
Tessera's and refuses it on any other, extender schedulers included (kube-scheduler would allocate
the same devices itself, and a GPU would be booked twice). A name the index does not know (not
listed yet, or created an instant ago) is reported as unknown: the shell waits a little for it,
then lets the pod through as written, with a warning.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from shared.dra.devices import DEVICE_CLASS
from shared.kubeobjects import Pod
from shared.messages.claimclasses import ClaimKind

Lookup = Callable[[ClaimKind, str, str], tuple[str, ...] | None]
"""(kind, namespace, name) -> the object's device classes; None: not known (yet)."""

KIND_NAMES: dict[ClaimKind, str] = {
    "claim": "ResourceClaim",
    "template": "ResourceClaimTemplate",
}


def knows_nothing(kind: ClaimKind, namespace: str, name: str) -> tuple[str, ...] | None:
    """The lookup of a webhook that has no index (no NATS): every name unknown."""
    return None


class ClaimRef(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of ``spec.resourceClaims`` and what it names."""

    index: int
    kind: ClaimKind
    name: str

    def describe(self) -> str:
        return f'spec.resourceClaims[{self.index}] ({KIND_NAMES[self.kind]} "{self.name}")'


class PodClaims(msgspec.Struct, frozen=True, kw_only=True):
    tessera: tuple[ClaimRef, ...] = ()
    """Entries whose object asks for ``gpu.tessera.dev`` devices."""
    unknown: tuple[ClaimRef, ...] = ()
    """Entries whose object the index does not know."""


def pod_claims(pod: Pod, lookup: Lookup, namespace: str) -> PodClaims:
    """The pod's claim entries of class ``gpu.tessera.dev``, and those not known (the pod's
    claims are in ``namespace``, its own)."""
    tessera: list[ClaimRef] = []
    unknown: list[ClaimRef] = []
    for index, entry in enumerate(pod.spec.resource_claims or ()):
        if entry.resource_claim_name:
            ref = ClaimRef(index=index, kind="claim", name=entry.resource_claim_name)
        elif entry.resource_claim_template_name:
            ref = ClaimRef(index=index, kind="template", name=entry.resource_claim_template_name)
        else:
            continue  # the API server refuses an entry naming neither
        classes = lookup(ref.kind, namespace, ref.name)
        if classes is None:
            unknown.append(ref)
        elif DEVICE_CLASS in classes:
            tessera.append(ref)
    return PodClaims(tessera=tuple(tessera), unknown=tuple(unknown))


def wrong_scheduler(scheduler: str, claims: PodClaims, own: str) -> str:
    """Why a pod with Tessera claims may not be placed by ``scheduler`` ("" when it may)."""
    if not claims.tessera or scheduler == own:
        return ""
    named = ", ".join(ref.describe() for ref in claims.tessera)
    return (
        f'spec.schedulerName: "{scheduler}" may not place this pod: {named} '
        f"{'asks' if len(claims.tessera) == 1 else 'ask'} for devices of class {DEVICE_CLASS}, "
        f"which Tessera alone allocates (two allocators would book one GPU twice); "
        f'set spec.schedulerName to "{own}" or leave it unset'
    )


def unknown_warnings(claims: PodClaims, own: str) -> tuple[str, ...]:
    """The warnings of a pod let through with claims the index does not know."""
    return tuple(
        f"{ref.describe()} is not known to Tessera yet: if it asks for {DEVICE_CLASS} "
        f'devices, set spec.schedulerName to "{own}"'
        for ref in claims.unknown
    )
