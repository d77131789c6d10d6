"""Node capacities as the placer's view counts them (pure): each node's capacity when empty
(its *signature*), how many nodes have each, so that a pod too large for every node is told at
once and the fed measure knows which hosts are scarce; and whether a node's new state gives
back room a waiting pod could use."""

from __future__ import annotations

from collections import Counter

from services.placer.core.facts import PodFacts
from services.placer.core.fragmentation import HostKind, counted_kinds
from services.placer.core.model import NodeState
from shared.capacity import GpuAsk, Models, NodeGpus, gpus_fit, never_fits

Signature = tuple[int, int, NodeGpus]
"""A node's capacity when empty: CPU, memory, and (model, memory) of each GPU."""

TOO_LARGE = "larger than any node can hold"
"""How the reason of a pod too large for every node begins; the dimension follows."""


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

    def host_kinds(self) -> tuple[HostKind, ...]:
        """The known GPU nodes grouped by capacity, as ``fragmentation.host_kinds`` groups a
        cluster's nodes (GPU memory aside): what the fed measure weighs scarce hosts by. A node
        whose facts have not come yet (no CPU or memory known) is left out, so a node that joins
        moves the kinds once."""
        counts: Counter[HostKind] = Counter()
        for (cpu, memory, gpus), count in self._counts.items():
            if gpus and cpu and memory:
                models = tuple(sorted({model for model, _ in gpus}))
                kind = HostKind(cpu_milli=cpu, memory_mib=memory, gpus=len(gpus), models=models)
                counts[kind] += count
        return counted_kinds(counts)

    def too_large(self, pod: PodFacts) -> str:
        """Why no known node could hold ``pod`` even with nothing on it, naming the dimension
        (CPU, memory, GPU model, MiB per GPU, GPU count); empty when one could."""
        if not self._counts:
            return ""
        request = pod.request
        models = Models(wanted=request.gpu_models, excluded=request.gpu_models_excluded)
        asks = [
            GpuAsk(
                container=ask.container,
                shares=ask.shares,
                memory_mib=ask.memory_mib,
                memory_pct=ask.memory_pct,
            )
            for ask in pod.asks
        ]
        for cpu, memory, gpus in self._counts:
            if cpu >= pod.cpu_milli and memory >= pod.memory_mib and gpus_fit(asks, gpus, models):
                return ""
        return f"{TOO_LARGE}: {self._dimension(pod, asks, models)}"

    def _dimension(self, pod: PodFacts, asks: list[GpuAsk], models: Models) -> str:
        """The first dimension no node has enough of."""
        cpu = max(signature[0] for signature in self._counts)
        if pod.cpu_milli > cpu:
            return f"asks {pod.cpu_milli}m CPU; the largest node here has {cpu}m"
        memory = max(signature[1] for signature in self._counts)
        if pod.memory_mib > memory:
            return f"asks {pod.memory_mib} MiB of memory; the largest node here has {memory} MiB"
        gpus = never_fits(asks, {signature[2] for signature in self._counts}, models)
        if gpus is not None:
            within = f" (container {gpus.container!r})" if gpus.container else ""
            return f"{gpus.problem}{within}"
        return "no node here has the CPU, memory and GPUs it asks for all together"
