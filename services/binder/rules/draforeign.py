"""Pure state: the GPU capacity that ``gpu.tessera.dev`` ResourceClaims hold and no placement of
Tessera's holds, per node, carried in ``NodeFacts.claimed`` so that the placer counts it as used
(docs/design.md §14: claims allocated by anyone count in the ledger).

Another allocator (kube-scheduler for a pod of another scheduler, a controller, a user writing
the status) may allocate Tessera's devices despite the webhook; and a claim several pods share
keeps its GPUs after the pod whose placement holds them is gone. The claim informer's changes
(``draclaims.DraClaims``) keep each allocated claim's results of driver ``gpu.tessera.dev`` and
the pods it is reserved for. Whether a placement holds it is asked when the node's facts are made
(``ClusterSync`` calls :meth:`ForeignClaims.facts_with`), not when the claim changes: a claim one
of whose pods has a live assignment record naming it (its ``resourceclaims/<claim>/...``
containers) is held by that pod's booking already; any other is counted, until it is deallocated.
A node's facts are made again whenever one of its claims changes, and when a record on it is
released.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import msgspec

from services.binder.rules.draobjects import ResourceClaim, Result, allocated_node
from shared.commits import CORE_MILLI_PER_PERCENT
from shared.dra.devices import COMPUTE, DRIVER, MEMORY, device_index
from shared.messages.nodes import ClaimedGpu, NodeFacts
from shared.quantity import QuantityError, mebibytes, parse_quantity


def claimed_gpu(claim: str, result: Result) -> ClaimedGpu | None:
    """What one allocation result holds (None: not a device of this driver's)."""
    index = device_index(result.device)
    if result.driver != DRIVER or index is None:
        return None
    consumed = result.consumed_capacity or {}
    if MEMORY not in consumed and COMPUTE not in consumed:
        return ClaimedGpu(claim=claim, index=index, exclusive=True)
    try:
        memory = mebibytes(consumed.get(MEMORY, "0"))
        compute = parse_quantity(consumed.get(COMPUTE, "0"))
    except QuantityError:  # the API server validated it: count the whole GPU rather than guess
        return ClaimedGpu(claim=claim, index=index, exclusive=True)
    return ClaimedGpu(
        claim=claim,
        index=index,
        memory_mib=memory,
        core_milli=math.ceil(compute * CORE_MILLI_PER_PERCENT),
    )


class _Held(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    reserved_for: tuple[str, ...]
    gpus: tuple[ClaimedGpu, ...]


def held_by(claim: ResourceClaim) -> _Held | None:
    """The Tessera GPUs an allocated claim holds, and where (None: it holds none)."""
    allocation = claim.status.allocation
    if allocation is None:
        return None
    key = claim.metadata.key
    gpus = tuple(
        gpu
        for result in allocation.devices.results or ()
        if (gpu := claimed_gpu(key, result)) is not None
    )
    node = allocated_node(allocation) or next(
        (r.pool for r in allocation.devices.results or () if r.driver == DRIVER), ""
    )
    if not gpus or not node:
        return None
    return _Held(node=node, reserved_for=claim.reserved_uids, gpus=gpus)


class ForeignClaims:
    """Every allocated claim's Tessera GPUs, by node (see the module docstring)."""

    def __init__(
        self, *, placed: Callable[[str, str, str], bool], want_node: Callable[[str], None]
    ) -> None:
        self._placed = placed
        """(node, pod uid, claim key) -> whether a live placement of the pod there holds it."""
        self._want_node = want_node
        self._held: dict[str, _Held] = {}
        """Claim key -> what it holds."""
        self._by_node: dict[str, set[str]] = {}

    def claim_changed(self, old: ResourceClaim | None, new: ResourceClaim | None) -> None:
        claim = new or old
        if claim is None:
            return
        key = claim.metadata.key
        before = self._held.pop(key, None)
        after = held_by(new) if new is not None else None
        if before is not None:
            self._by_node.get(before.node, set()).discard(key)
        if after is not None:
            self._held[key] = after
            self._by_node.setdefault(after.node, set()).add(key)
        if before != after:
            for node in {h.node for h in (before, after) if h is not None}:
                self._want_node(node)

    def record_released(self, node: str) -> None:
        """A placement on ``node`` was released: its claims may be held by none now."""
        if self._by_node.get(node):
            self._want_node(node)

    def on(self, node: str) -> tuple[ClaimedGpu, ...]:
        """The GPU shares of ``node`` held by claims no placement of Tessera's holds."""
        found: list[ClaimedGpu] = []
        for key in sorted(self._by_node.get(node, ())):
            held = self._held[key]
            if not any(self._placed(node, uid, key) for uid in held.reserved_for):
                found.extend(held.gpus)
        return tuple(found)

    def facts_with(self, facts: NodeFacts) -> NodeFacts:
        claimed = self.on(facts.node)
        return msgspec.structs.replace(facts, claimed=claimed) if claimed else facts
