"""GpuClustering (FGD paper baseline): put GPU pods of one kind together.

Kind = "share" (one partial GPU) or "<k>-gpu". ``base = 25 * (8000 - gpu_left) // 8000`` (GPU milli
free on the node), plus 75 when every GPU pod on the node is of this kind, 50 when this kind is one
of several there, 25 when the node runs no GPU pod, 0 otherwise. A pod without GPUs scores 0.
"""

from __future__ import annotations

from services.placer.core.facts import PodFacts
from services.placer.core.shape import NodeShape

NAME = "clustering"
MAX_SPEC_GPU = 8_000


class ClusteringScore:
    name = NAME

    def score(self, pod: PodFacts, shape: NodeShape) -> float:
        if not pod.kind:
            return 0.0
        base = 25 * (MAX_SPEC_GPU - shape.gpu_free_milli_total) // MAX_SPEC_GPU
        kinds = shape.gpu_task_kinds
        present = any(kind == pod.kind for kind, _ in kinds)
        if present:
            return float(base + (75 if len(kinds) == 1 else 50))
        return float(base + (25 if not kinds else 0))
