"""The binder's side of DRA claims (docs/design.md §14): the ResourceClaim informer, each pod's
claims for ``PodPending.claims``, and the allocation written before a pod is bound.

The informer follows every claim; a claim that appears or whose allocation changes has the pods
that name it read again (a template's claim is made after its pod; a shared claim another pod got
allocated pins the next one to its node). Pods a claim is reserved for are not read again for it:
they are being bound, or run.

Before the Binding of a pod with Tessera claims (:meth:`DraClaims.allocate`), for each claim as
the informer holds it: the ``resource.kubernetes.io/delete-protection`` finalizer, then
``status.allocation`` (``draalloc.results``) with the pod in ``reservedFor``, in one write of the
status, each write conditional on the resourceVersion it starts from (the finalizer's answer is
the next one's; a claim written meanwhile, or an informer behind, is a 409, and the claim is read
fresh from the API). A claim already allocated (shared) gets the pod added to ``reservedFor``
when it is on the booking's node, and fails the bind when it is not. Deallocation is
kube-controller-manager's: once no pod is left in ``reservedFor`` it clears the allocation and
removes the finalizer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Final, Protocol

import msgspec

from services.binder import draalloc
from services.binder.gateway import Answer, Body, ClusterGateway
from services.binder.informer import Informer
from services.binder.metrics import BinderMetrics
from services.binder.rules.draobjects import (
    DELETE_PROTECTION,
    ResourceClaim,
    allocated_node,
    claim_name_of,
    pod_claims,
)
from shared.clock import Clock
from shared.dra.devices import DEFAULT_POLICY, MemoryPolicy
from shared.kubeobjects import Pod
from shared.messages.ledger import Booking
from shared.messages.pods import PodPending
from shared.messages.resourceclaims import PodResourceClaim
from shared.podspec import InvalidPod

log = logging.getLogger(__name__)

WRITE_TRIES: Final = 8


class ClaimApi(Protocol):
    """The claim calls the binder makes (``kubedra.KubeDra`` has them)."""

    async def read_claim(self, namespace: str, name: str) -> ResourceClaim | None: ...

    async def patch_claim(self, namespace: str, name: str, patch: Body) -> Answer: ...

    async def patch_claim_status(self, namespace: str, name: str, patch: Body) -> Answer: ...


class DraClaims:
    """Implements ``draalloc.ClaimAllocation``."""

    def __init__(
        self,
        *,
        gateway: ClusterGateway,
        api: ClaimApi,
        clock: Clock,
        metrics: BinderMetrics,
        pod_of: Callable[[str], Pod | None],
        want_pod: Callable[[str], None],
        fence: Callable[[str], None],
        policy: MemoryPolicy = DEFAULT_POLICY,
        listeners: Sequence[Callable[[ResourceClaim | None, ResourceClaim | None], None]] = (),
    ) -> None:
        self._api = api
        self._listeners = tuple(listeners)
        """Told of every claim change first (``draindex``, ``draforeign``)."""
        self._pod_of = pod_of
        self._want_pod = want_pod
        self._fence = fence
        self._policy = policy
        self._readers: dict[str, set[str]] = {}
        """Claim key -> uids of the pods that name it (as last read)."""
        self.informer: Informer[ResourceClaim] = Informer(
            name="resourceclaims",
            kind=ResourceClaim,
            gateway=gateway,
            on_change=self._changed,
            clock=clock,
            metrics=metrics,
        )

    # --- reading -------------------------------------------------------------------------------

    def claims_of(self, pod: Pod) -> tuple[PodResourceClaim, ...]:
        uid, namespace = pod.metadata.uid, pod.metadata.namespace
        for ref in pod.spec.resource_claims or ():
            name = claim_name_of(pod, ref.name)
            if name:
                self._readers.setdefault(f"{namespace}/{name}", set()).add(uid)
        return pod_claims(pod, self.informer.get)

    def pending(self, pod: Pod, parsed: PodPending | InvalidPod) -> PodPending | InvalidPod:
        """What ``ClusterSync`` publishes of a pod with claims: ``parsed`` carrying them, or
        why they cannot be honoured."""
        if isinstance(parsed, InvalidPod) or not pod.spec.resource_claims:
            return parsed
        return draalloc.with_claims(parsed, self.claims_of(pod), policy=self._policy)

    def _changed(self, old: ResourceClaim | None, new: ResourceClaim | None) -> None:
        for listener in self._listeners:
            listener(old, new)
        if new is None or (old is not None and old.status.allocation == new.status.allocation):
            return
        reserved = set(new.reserved_uids)
        for uid in self._readers.get(new.metadata.key, set()) - reserved:
            if self._pod_of(uid) is None:
                self._readers[new.metadata.key].discard(uid)
            else:
                self._want_pod(uid)

    # --- allocating ----------------------------------------------------------------------------

    async def allocate(self, booking: Booking) -> str:
        pod = self._pod_of(booking.pod_uid)
        if pod is None or not pod.spec.resource_claims:
            return ""
        for claim in draalloc.tessera_claims(self.claims_of(pod)):
            reason = await self._allocate_claim(booking, claim)
            if reason:
                log.warning(
                    "claim not allocated",
                    extra={"pod": f"{booking.namespace}/{booking.name}", "reason": reason},
                )
                return reason
        return ""

    async def _allocate_claim(self, booking: Booking, wanted: PodResourceClaim) -> str:
        namespace, name = booking.namespace, wanted.claim
        what = f"ResourceClaim {namespace}/{name}"
        # The informer's copy first, then what each write answered: a stale one is a 409 (the
        # writes are conditional on its resourceVersion), and only then is the claim read.
        claim = self.informer.get(f"{namespace}/{name}")
        fresh = False
        for _ in range(WRITE_TRIES):
            if claim is None or (claim.metadata.uid != wanted.uid and not fresh):
                claim, fresh = await self._api.read_claim(namespace, name), True
            if claim is None or claim.metadata.uid != wanted.uid:
                return f"{what} no longer exists"
            if claim.metadata.deletion_timestamp is not None:
                return f"{what} is being deleted"
            status = claim.status
            reserved = [
                {"resource": c.resource, "name": c.name, "uid": c.uid}
                for c in status.reserved_for or ()
            ]
            if booking.pod_uid in claim.reserved_uids:
                return ""
            patch: Body = {"metadata": {"resourceVersion": claim.metadata.resource_version}}
            if status.allocation is not None:
                node = allocated_node(status.allocation)
                if node != booking.node:
                    return f"{what} is allocated on node {node}, not {booking.node}"
                patch["status"] = {"reservedFor": [*reserved, draalloc.consumer(booking)]}
            elif DELETE_PROTECTION not in (claim.metadata.finalizers or ()):
                self._fence("add the claim's finalizer")
                patch["metadata"]["finalizers"] = [
                    *(claim.metadata.finalizers or ()),
                    DELETE_PROTECTION,
                ]
                answer = await self._api.patch_claim(namespace, name, patch)
                if not answer.ok and answer.code != 409:
                    return f"{what}: cannot add its finalizer: HTTP {answer.code} {answer.message}"
                claim, fresh = _written(answer), True
                continue
            else:
                found = draalloc.results(booking, wanted)
                if isinstance(found, str):
                    return f"{what}: {found}"
                patch["status"] = {
                    "allocation": draalloc.allocation(booking.node, found),
                    "reservedFor": [*reserved, draalloc.consumer(booking)],
                }
            self._fence("write the claim's allocation")
            answer = await self._api.patch_claim_status(namespace, name, patch)
            if answer.ok:
                return ""
            if answer.code != 409:
                return (
                    f"{what}: the API refused its allocation: HTTP {answer.code} {answer.message}"
                )
            claim = None
        return f"{what} kept changing under {WRITE_TRIES} writes"


def _written(answer: Answer) -> ResourceClaim | None:
    """The claim a successful write answered with (None: read it again)."""
    if not answer.ok:
        return None
    try:
        return msgspec.json.decode(answer.message, type=ResourceClaim)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
