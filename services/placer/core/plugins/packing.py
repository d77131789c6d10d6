"""GpuPacking (FGD paper baseline): shared GPUs first, then used nodes, then empty nodes.

From highest to lowest (integers, as the paper's simulator computes them):

- the pod fits on already-used GPUs only: ``max(100 - sum_i floor(free_i * 100 / 1000) // 10, 50)``
  over the GPUs a least-free-first fit would use;
- the node is partly used but the pod needs fully free GPUs: ``max(50 - fully_free_used, 33)``;
- every GPU on the node is free: ``max(33 - gpus, gpus)``;
- a pod without GPUs: 0 everywhere.
"""

from __future__ import annotations

from services.placer.core.facts import PodFacts
from services.placer.core.model import GPU_MILLI
from services.placer.core.shape import NodeShape

NAME = "packing"


class PackingScore:
    name = NAME

    def score(self, pod: PodFacts, shape: NodeShape) -> float:
        milli = pod.share_milli
        if milli <= 0:
            return 0.0
        free = shape.free_milli  # ascending: least free first
        fully_free = sum(1 for f in free if f == GPU_MILLI)
        if fully_free == len(free):
            return float(max(33 - fully_free, fully_free))
        wanted = pod.gpu_count
        used: list[int] = []
        fully_free_used = 0
        for f in free:
            if wanted == 0:
                break
            if milli <= f:
                wanted -= 1
                used.append(f)
                if f == GPU_MILLI:
                    fully_free_used += 1
        if wanted:
            return 0.0
        if fully_free_used:
            return float(max(50 - fully_free_used, 33))
        ratio = sum(f * 100 // GPU_MILLI for f in used)
        return float(max(100 - ratio // 10, 50))
