"""Pure: the DRA part of a ``tessera up`` summary, read from the API's ResourceClaims.

- **Claims**: how many ``gpu.tessera.dev`` claims there are, allocated, reserved, and pending
  (not allocated yet).
- **What a DRA container must hold**: a container that lists claims in ``resources.claims``
  gets its GPUs from the claims' ``status.allocation`` as the binder wrote it, one slice per
  result of Tessera's driver (device ``gpu-<index>`` of the node's pool, ``consumedCapacity``
  memory and compute), for the request it names or every request of the claim. The report
  compares that with the environment the simulated kubelet resolved from the node plugin's CDI
  spec: an independent check of binder and node plugin against each other.
- **Held once**: a claim several pods (or containers) share is one allocation of its GPUs; what
  it holds counts once, by claim (:func:`claim_key`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from shared.dra.devices import COMPUTE, DRIVER, MEMORY, device_index
from shared.quantity import MIB, QuantityError, parse_quantity

Obj = Mapping[str, Any]
CLAIM_RESOURCE_PREFIX: Final = "resourceclaims/"
"""How the simulated kubelet names what a container got from a claim."""


def claim_key(namespace: str, resource: str) -> str | None:
    """The claim a kubelet record of ``resource`` stands for (None: a device-plugin one)."""
    if not resource.startswith(CLAIM_RESOURCE_PREFIX):
        return None
    return f"{namespace}/{resource[len(CLAIM_RESOURCE_PREFIX) :]}"


def is_tessera(claim: Obj) -> bool:
    """A claim of Tessera's class, or allocated by its driver."""
    spec = (claim.get("spec") or {}).get("devices") or {}
    if any(
        ((r.get("exactly") or {}).get("deviceClassName")) == DRIVER
        for r in spec.get("requests") or []
    ):
        return True
    return any(r.get("driver") == DRIVER for r in _results(claim))


def _results(claim: Obj) -> list[Obj]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or [])


def claim_counts(claims: Sequence[Obj]) -> dict[str, int]:
    """Tessera's claims: total, allocated, reserved (allocated and in use), pending."""
    ours = [c for c in claims if is_tessera(c)]
    allocated = [c for c in ours if (c.get("status") or {}).get("allocation")]
    reserved = [c for c in allocated if (c.get("status") or {}).get("reservedFor")]
    return {
        "total": len(ours),
        "allocated": len(allocated),
        "reserved": len(reserved),
        "pending": len(ours) - len(allocated),
    }


def pod_claim_name(pod: Obj, name: str) -> str:
    """The ResourceClaim a pod's ``spec.resourceClaims`` entry ``name`` stands for ("": none
    yet: a template's claim not created)."""
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        if entry.get("name") == name and entry.get("resourceClaimName"):
            return str(entry["resourceClaimName"])
    for entry in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if entry.get("name") == name:
            return str(entry.get("resourceClaimName") or "")
    return ""


def claims_created(pod: Obj) -> bool:
    """Whether every claim the pod asks of a template has been made (its name is in the pod's
    status): until then a pod is waiting for the claim controller, not for Tessera."""
    made = {e.get("name") for e in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    return all(
        entry.get("resourceClaimName") or entry.get("name") in made
        for entry in (pod.get("spec") or {}).get("resourceClaims") or []
    )


def uses_claims(container: Obj) -> bool:
    return bool((container.get("resources") or {}).get("claims"))


def _mib(value: object) -> int:
    return math.ceil(parse_quantity(str(value)) / MIB)


def container_slices(
    pod: Obj,
    container: Obj,
    claims: Mapping[str, Obj],
    uuids: Mapping[tuple[str, int], str],
) -> list[tuple[str, int, int]] | str:
    """``(uuid, MiB, percent of SMs)`` per GPU the container's claims were allocated, in the
    allocation's order; or why they cannot be told (a claim missing or not allocated, a result
    on a GPU the node does not have, a capacity that is not a quantity).

    ``claims``: ``namespace/name`` -> ResourceClaim; ``uuids``: (node, GPU index) -> UUID.
    """
    namespace = (pod.get("metadata") or {}).get("namespace") or "default"
    found: list[tuple[str, int, int]] = []
    for use in (container.get("resources") or {}).get("claims") or []:
        name = pod_claim_name(pod, str(use.get("name") or ""))
        claim = claims.get(f"{namespace}/{name}") if name else None
        if claim is None:
            return f"claim {use.get('name')!r} not found"
        if not (claim.get("status") or {}).get("allocation"):
            return f"claim {name} is not allocated"
        request = use.get("request") or ""
        for result in _results(claim):
            if result.get("driver") != DRIVER or (request and result.get("request") != request):
                continue
            index = device_index(str(result.get("device") or ""))
            uuid = uuids.get((str(result.get("pool") or ""), index if index is not None else -1))
            if uuid is None:
                return f"claim {name}: device {result.get('pool')}/{result.get('device')} unknown"
            consumed = result.get("consumedCapacity") or {}
            try:
                memory = _mib(consumed[MEMORY])
                compute = math.ceil(parse_quantity(str(consumed.get(COMPUTE, 100))))
            except (KeyError, QuantityError) as error:
                return f"claim {name}: consumedCapacity {consumed}: {error}"
            found.append((uuid, memory, compute))
    return found
