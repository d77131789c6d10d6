"""Fit: can the node take the pod at all? CPU, memory, and every GPU share on an allowed GPU.

``NodeFit`` is the filter every profile runs first. A pod's shares are tried on the node's GPUs
greedily, container by container, each share on a distinct GPU of its container (shares of
different containers of one pod may share a GPU), smallest fitting GPU first. GPUs the pod may not
use (``GpuFilter``: model, group) and unhealthy or exclusively held GPUs are never candidates.
Physical (whole) shares need an idle GPU; virtual shares need their memory (MiB or percent of the
GPU) and cores free, where memory held by processes Tessera did not place counts as used.

``GpuModel`` is the GPU filter for ``tessera.dev/gpu-model`` / ``gpu-model-exclude``.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.placer.core.facts import PodFacts, ShareAsk
from services.placer.core.framework import GpuFilter, gpu_admitted
from services.placer.core.shape import GpuShape, NodeShape

NAME = "fit"

INSUFFICIENT_CPU = "insufficient CPU"
INSUFFICIENT_MEMORY = "insufficient memory"
NO_IDLE_GPUS = "not enough idle GPUs"
NO_GPU_ROOM = "insufficient GPU memory or cores"
CAPACITY_REASONS = frozenset({INSUFFICIENT_CPU, INSUFFICIENT_MEMORY, NO_IDLE_GPUS, NO_GPU_ROOM})
"""Reasons that pods leaving the node can clear; every other reason is about the node or the
request itself (its GPUs, health, readiness, group), which no eviction changes."""


class GpuModel:
    """Admits GPUs whose model the pod allows and does not exclude."""

    name = "gpu-model"

    def admits_gpu(self, pod: PodFacts, gpu: GpuShape) -> bool:
        return pod.request.allows_model(gpu.model)


class _Room:
    """What is left of one GPU while a pod's shares are tried on it."""

    __slots__ = ("core", "exclusive", "idle", "memory", "slots", "total")

    def __init__(self, gpu: GpuShape) -> None:
        self.memory = gpu.memory_free_mib
        self.core = gpu.core_milli_free
        self.slots = gpu.slots_free
        self.idle = gpu.idle
        self.exclusive = gpu.exclusive or not gpu.healthy
        self.total = gpu.memory_total_mib

    def fits(self, ask: ShareAsk) -> bool:
        if self.exclusive or self.slots == 0:
            return False
        if ask.whole:
            return self.idle
        return self.core >= ask.core_milli and self.memory >= ask.memory_on(self.total)

    def take(self, ask: ShareAsk) -> None:
        if ask.whole:
            self.exclusive = True
        else:
            self.core -= ask.core_milli
            self.memory -= ask.memory_on(self.total)
        self.idle = False
        if self.slots > 0:
            self.slots -= 1


def fit_gpus(pod: PodFacts, gpus: Sequence[GpuShape], admitted: Sequence[bool]) -> list[int] | None:
    """Positions in ``gpus`` (one per share, in ask order) a greedy fit would use, or None."""
    rooms = [_Room(g) for g in gpus]
    chosen: list[int] = []
    for ask in pod.asks:
        used: set[int] = set()
        for _ in range(ask.shares):
            best = -1
            for i, room in enumerate(rooms):
                if not (admitted[i] and i not in used and room.fits(ask)):
                    continue
                if best < 0 or (room.memory, room.core) < (rooms[best].memory, rooms[best].core):
                    best = i
            if best < 0:
                return None
            rooms[best].take(ask)
            used.add(best)
            chosen.append(best)
    return chosen


class NodeFit:
    """The built-in filter: schedulable, CPU, memory and GPU fit (see the module docstring)."""

    name = NAME

    def __init__(self, gpu_filters: Sequence[GpuFilter] = ()) -> None:
        self.gpu_filters = tuple(gpu_filters)

    def filter(self, pod: PodFacts, shape: NodeShape) -> str | None:
        if not shape.schedulable:
            return "node unschedulable"
        if shape.cpu_milli_free < pod.cpu_milli:
            return INSUFFICIENT_CPU
        if shape.memory_mib_free < pod.memory_mib:
            return INSUFFICIENT_MEMORY
        if not pod.asks:
            return None
        if len(pod.asks) == 1 and pod.asks[0].shares == 1:
            ask = pod.asks[0]
            # Capacity first: it rules most GPUs out and costs less than the GPU filters.
            for gpu in shape.gpus:
                if ask.fits(gpu) and gpu_admitted(pod, gpu, self.gpu_filters):
                    return None
            admitted = [gpu_admitted(pod, g, self.gpu_filters) for g in shape.gpus]
        else:
            admitted = [gpu_admitted(pod, g, self.gpu_filters) for g in shape.gpus]
            if fit_gpus(pod, shape.gpus, admitted) is not None:
                return None
        return self._why_not(pod, shape, admitted)

    def _why_not(self, pod: PodFacts, shape: NodeShape, admitted: Sequence[bool]) -> str:
        needed = max(ask.shares for ask in pod.asks)
        if sum(admitted) < needed:
            return "too few GPUs of an allowed model or group" if shape.gpus else "no GPUs"
        healthy = sum(1 for ok, g in zip(admitted, shape.gpus, strict=True) if ok and g.healthy)
        if healthy < needed:
            return "unhealthy GPU"
        if all(ask.whole for ask in pod.asks):
            return NO_IDLE_GPUS
        return NO_GPU_ROOM
