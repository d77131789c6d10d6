"""Fit: can the node take the pod at all? CPU, memory, and every GPU share on an allowed GPU.

``NodeFit`` is the filter every profile runs first. Whether the pod's shares fit on the node's
GPUs is the search over GPUs (``search.py``: each share of a container on a distinct GPU, shares of
different containers of one pod may share a GPU), the same search the GPU choice runs, with the
ledger's fit rule. GPUs the pod may not use (``GpuFilter``: model, group) and unhealthy or
exclusively held GPUs are never candidates. Physical (whole) shares need an idle GPU; virtual
shares need their memory (MiB or percent of the GPU) and cores free, where memory held by
processes Tessera did not place counts as used.

``GpuModel`` is the GPU filter for ``tessera.dev/gpu-model`` / ``gpu-model-exclude``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from services.placer.core.facts import PodFacts
from services.placer.core.framework import GpuFilter, gpu_admitted
from services.placer.core.plugins.groups import GroupFilter
from services.placer.core.search import assign, share_fits
from services.placer.core.shape import GpuShape, NodeShape

NAME = "fit"

INSUFFICIENT_CPU = "insufficient CPU"
INSUFFICIENT_MEMORY = "insufficient memory"
NO_IDLE_GPUS = "not enough idle GPUs"
NO_GPU_ROOM = "insufficient GPU memory or cores"
NODE_UNSCHEDULABLE = "node unschedulable"
NO_GPUS = "no GPUs"
TOO_FEW_ALLOWED = "too few GPUs of an allowed model or group"
UNHEALTHY_GPU = "unhealthy GPU"
CAPACITY_REASONS = frozenset({INSUFFICIENT_CPU, INSUFFICIENT_MEMORY, NO_IDLE_GPUS, NO_GPU_ROOM})
"""Reasons that pods leaving the node can clear; every other reason is about the node or the
request itself (its GPUs, health, readiness, group), which no eviction changes."""


class GpuModel:
    """Admits GPUs whose model the pod allows and does not exclude."""

    name = "gpu-model"

    def admits_gpu(self, pod: PodFacts, gpu: GpuShape) -> bool:
        return pod.request.allows_model(gpu.model)


BY_MODEL_AND_GROUPS: Final = (GpuModel, GroupFilter)
"""GPU filters that read only ``GpuShape.model`` and ``GpuShape.groups``: a GPU's admission is
its model's and groups' (the GPUs of a node mostly share both)."""


def by_kind(gpu_filters: Sequence[GpuFilter]) -> bool:
    """Whether every one of ``gpu_filters`` reads only a GPU's model and groups."""
    return all(isinstance(f, BY_MODEL_AND_GROUPS) for f in gpu_filters)


def admitted_gpus(
    pod: PodFacts, gpus: Sequence[GpuShape], gpu_filters: Sequence[GpuFilter], kinds: bool
) -> list[bool]:
    """:func:`gpu_admitted` of each of ``gpus``; with ``kinds`` (:func:`by_kind`), asked once
    per model and groups."""
    if not kinds:
        return [gpu_admitted(pod, g, gpu_filters) for g in gpus]
    known: dict[tuple[str, tuple[str, ...]], bool] = {}
    admitted = []
    for gpu in gpus:
        kind = (gpu.model, gpu.groups)
        ok = known.get(kind)
        if ok is None:
            ok = known[kind] = gpu_admitted(pod, gpu, gpu_filters)
        admitted.append(ok)
    return admitted


class NodeFit:
    """The built-in filter: schedulable, CPU, memory and GPU fit (see the module docstring)."""

    name = NAME

    def __init__(self, gpu_filters: Sequence[GpuFilter] = ()) -> None:
        self.gpu_filters = tuple(gpu_filters)
        self._by_kind = by_kind(self.gpu_filters)

    def filter(self, pod: PodFacts, shape: NodeShape) -> str | None:
        if not shape.schedulable:
            return NODE_UNSCHEDULABLE
        if shape.cpu_milli_free < pod.cpu_milli:
            return INSUFFICIENT_CPU
        if shape.memory_mib_free < pod.memory_mib:
            return INSUFFICIENT_MEMORY
        if not pod.asks:
            return None
        if len(pod.asks) == 1 and pod.asks[0].shares == 1:
            ask = pod.asks[0]
            # Capacity first: it rules most GPUs out and costs less than the GPU filters. The
            # most free GPU first (the shape's are least free first): any one will do, and it
            # is the likeliest to fit (a whole GPU needs an idle one).
            for gpu in reversed(shape.gpus):
                if share_fits(ask, gpu) and gpu_admitted(pod, gpu, self.gpu_filters):
                    return None
            admitted = admitted_gpus(pod, shape.gpus, self.gpu_filters, self._by_kind)
        else:
            admitted = admitted_gpus(pod, shape.gpus, self.gpu_filters, self._by_kind)
            if assign(pod.asks, shape.gpus, admitted) is not None:
                return None
        return self._why_not(pod, shape, admitted)

    def _why_not(self, pod: PodFacts, shape: NodeShape, admitted: Sequence[bool]) -> str:
        needed = max(ask.shares for ask in pod.asks)
        if sum(admitted) < needed:
            return TOO_FEW_ALLOWED if shape.gpus else NO_GPUS
        healthy = sum(1 for ok, g in zip(admitted, shape.gpus, strict=True) if ok and g.healthy)
        if healthy < needed:
            return UNHEALTHY_GPU
        if all(ask.whole for ask in pod.asks):
            return NO_IDLE_GPUS
        return NO_GPU_ROOM
