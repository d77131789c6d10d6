"""Node capacities as the placer's view counts them (pure): each node's capacity when empty
(its *signature*), how many nodes have each, so that a pod too large for every node is told at
once; and whether a node's new state gives back room a waiting pod could use."""

from __future__ import annotations

from collections import Counter

from services.placer.core.facts import PodFacts
from services.placer.core.model import NodeState

Signature = tuple[int, int, tuple[tuple[str, int], ...]]
"""A node's capacity when empty: CPU, memory, and (model, memory) of each GPU."""


def signature_of(node: NodeState) -> Signature:
    return (
        node.cpu_milli_total,
        node.memory_mib_total,
        tuple(sorted((g.model, g.memory_total_mib) for g in node.gpus)),
    )


def gives_room(old: NodeState | None, new: NodeState) -> bool:
    """Whether ``new`` could take a pod that ``old`` could not (capacity given back)."""
    if not new.schedulable:
        return False
    if old is None or not old.schedulable:
        return True
    if new.cpu_milli_free > old.cpu_milli_free or new.memory_mib_free > old.memory_mib_free:
        return True
    before = {g.index: g for g in old.gpus}
    for gpu in new.gpus:
        was = before.get(gpu.index)
        if was is None:
            return True
        if gpu.healthy and not was.healthy:
            return True
        if gpu.healthy and (
            gpu.memory_free_mib > was.memory_free_mib
            or gpu.core_milli_free > was.core_milli_free
            or gpu.slots_reserved < was.slots_reserved
            or (was.exclusive and not gpu.exclusive)
            or gpu.groups != was.groups
        ):
            return True
    return new.groups != old.groups


class Capacities:
    """How many known nodes have each signature."""

    def __init__(self) -> None:
        self._counts: Counter[Signature] = Counter()

    def add(self, signature: Signature) -> None:
        self._counts[signature] += 1

    def remove(self, signature: Signature) -> None:
        self._counts[signature] -= 1
        if self._counts[signature] <= 0:
            del self._counts[signature]

    def too_large(self, pod: PodFacts) -> str:
        """Why no known node could hold ``pod`` even with nothing on it; empty when one could."""
        if not self._counts:
            return ""
        request = pod.request
        for cpu, memory, gpus in self._counts:
            if cpu < pod.cpu_milli or memory < pod.memory_mib:
                continue
            allowed = [mib for model, mib in gpus if request.allows_model(model)]
            if all(
                sum(1 for mib in allowed if ask.memory_on(mib) <= mib) >= ask.shares
                for ask in pod.asks
            ):
                return ""
        return "larger than any node can hold (CPU, memory, or GPUs of an allowed model)"
