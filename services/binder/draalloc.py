"""Pure: the allocation the binder writes into a ``gpu.tessera.dev`` ResourceClaim for what a
placer committed (docs/design.md §14), and the checks around it.

A booking holds a claim's GPUs as containers named ``resourceclaims/<claim>/<request>``
(``shared.dra.claims.ask_container``); requests merged by a ``distinctAttribute`` share the
first one's container, and its slices go to them in order, each request taking its ``count``.
Each slice becomes one result: the node's pool, device ``gpu-<index>``, a ``shareID`` (a UUID
derived from the commit, so a write tried again writes the same one) and the full
``consumedCapacity`` (memory in MiB, compute in percent), with the node selector of a node-local
pool (``matchFields metadata.name``), as kube-scheduler's allocator writes it.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from typing import Any, Final, Protocol

import msgspec

from shared.dra.claims import (
    NOT_CREATED,
    ClaimPlan,
    ask_container,
    is_tessera_claim,
    plan_claims,
)
from shared.dra.devices import COMPUTE, DRIVER, MEMORY, MemoryPolicy, device_name
from shared.messages.ledger import BookedSlice, Booking
from shared.messages.pods import PodPending
from shared.messages.resourceclaims import PodResourceClaim
from shared.podspec import FieldError, InvalidPod

Body = dict[str, Any]

GPU_MILLI: Final = 1000
SHARE_IDS: Final = uuid.UUID("5f0c3e0e-7a53-4c1e-9d1c-746573736572")
"""The namespace of the share ids (uuid5 over commit, claim, request and GPU)."""


class ClaimAllocation(Protocol):
    """What :class:`~services.binder.binding.PlacementBinder` asks before it binds a pod."""

    async def allocate(self, booking: Booking) -> str:
        """Allocate and reserve the pod's Tessera claims as ``booking`` says; "" when done (or
        nothing to do), else why not (the bind fails back to the placer)."""
        ...


def with_claims(
    pending: PodPending, claims: tuple[PodResourceClaim, ...], *, policy: MemoryPolicy
) -> PodPending | InvalidPod:
    """``pending`` carrying its claims, or every reason its Tessera claims cannot be honoured
    (explained on the pod like any other invalid request)."""
    gpu_containers = tuple(c.name for c in pending.containers if c.gpu_shares)
    plan = plan_claims(claims, policy=policy, gpu_containers=gpu_containers)
    # A claim not created (or not seen) yet says nothing of its class: the pod waits for it.
    unseen = tuple(
        FieldError(
            field=f"spec.resourceClaims[{i}] (claim {c.name!r})",
            problem=NOT_CREATED,
        )
        for i, c in enumerate(claims)
        if not c.claim
    )
    errors = (plan if isinstance(plan, tuple) else ()) + unseen
    if errors:
        return InvalidPod(
            uid=pending.uid, namespace=pending.namespace, name=pending.name, errors=errors
        )
    return msgspec.structs.replace(pending, claims=claims)


def tessera_claims(claims: Sequence[PodResourceClaim]) -> list[PodResourceClaim]:
    return [c for c in claims if c.claim and is_tessera_claim(c)]


def _capacity(piece: BookedSlice) -> dict[str, str]:
    return {
        MEMORY: f"{piece.memory_mib}Mi",
        COMPUTE: str(max(1, math.ceil(piece.core_milli * 100 / GPU_MILLI))),
    }


def results(booking: Booking, claim: PodResourceClaim) -> list[Body] | str:
    """The allocation results of ``claim`` in ``booking``, or why it holds none."""
    plan = plan_claims([claim], policy=MemoryPolicy())
    if isinstance(plan, tuple):
        return problems_of(plan)
    return _results(booking, claim, plan)


def _results(booking: Booking, claim: PodResourceClaim, plan: ClaimPlan) -> list[Body] | str:
    counts = {r.name: r.count for r in claim.requests}
    held = {c.container: c.gpus for c in booking.containers}
    found: list[Body] = []
    for ask in plan.asks:
        pieces = list(held.get(ask_container(claim.claim, ask.requests[0]), ()))
        if len(pieces) != ask.count:
            return (
                f"the placement holds {len(pieces)} GPUs for request {ask.requests[0]} of "
                f"claim {claim.claim}, which asks for {ask.count}"
            )
        for request in ask.requests:
            taken, pieces = pieces[: counts.get(request, 1)], pieces[counts.get(request, 1) :]
            for piece in taken:
                share = uuid.uuid5(
                    SHARE_IDS, f"{booking.commit}/{claim.uid}/{request}/{piece.index}"
                )
                found.append(
                    {
                        "request": request,
                        "driver": DRIVER,
                        "pool": booking.node,
                        "device": device_name(piece.index),
                        "shareID": str(share),
                        "consumedCapacity": _capacity(piece),
                    }
                )
    return found


def allocation(node: str, found: list[Body]) -> Body:
    return {
        "devices": {"results": found},
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }


def consumer(booking: Booking) -> Body:
    return {"resource": "pods", "name": booking.name, "uid": booking.pod_uid}


def problems_of(errors: Sequence[FieldError]) -> str:
    return "; ".join(f"{e.field}: {e.problem}" for e in errors)
