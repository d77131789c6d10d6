"""Node binpack and spread: prefer the fullest (binpack) or emptiest (spread) node after placement.

Fill after placement = the mean of the node's CPU fraction in use and, when it has GPUs, its GPU
milli fraction in use, both counting the pod. ``binpack`` = 100 x fill, ``spread`` =
100 x (1 - fill).
"""

from __future__ import annotations

from services.placer.core.facts import PodFacts
from services.placer.core.model import GPU_MILLI
from services.placer.core.shape import NodeShape

NAME = "binpack"


def fill_after(pod: PodFacts, shape: NodeShape) -> float:
    """Fraction of the node in use once ``pod`` is on it (0..1)."""
    cpu = (
        1.0 - (shape.cpu_milli_free - pod.cpu_milli) / shape.cpu_milli_total
        if shape.cpu_milli_total
        else 1.0
    )
    if not shape.gpus:
        return min(1.0, max(0.0, cpu))
    capacity = GPU_MILLI * len(shape.gpus)
    gpu = 1.0 - (shape.gpu_free_milli_total - pod.gpu_milli_total) / capacity
    return min(1.0, max(0.0, (cpu + gpu) / 2))


class BinpackScore:
    name = NAME

    def score(self, pod: PodFacts, shape: NodeShape) -> float:
        return 100.0 * fill_after(pod, shape)
