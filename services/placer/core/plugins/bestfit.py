"""BestFit (FGD paper baseline, perf-anchor section 4): the node left with least CPU and GPU.

``raw = int(100 * (1 - [0.5 (cpu_left - cpu_req) / 128000 + 0.5 (gpu_left - gpu_req) / 8000]))``
with GPU in total milli, then min-max rescaled to 0..100 over the feasible nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.placer.core.facts import PodFacts
from services.placer.core.shape import NodeShape

NAME = "bestfit"
CPU_SCALE = 128_000.0
GPU_SCALE = 8_000.0


def min_max(raw: Sequence[float]) -> list[float]:
    """Integer min-max rescale to 0..100 (all 0 when every value is equal)."""
    low, high = min(raw), max(raw)
    if high == low:
        return [0.0 for _ in raw]
    return [float(int((value - low) * 100 // (high - low))) for value in raw]


class BestFitScore:
    name = NAME

    def score(self, pod: PodFacts, shape: NodeShape) -> float:
        waste = 0.0
        waste += (shape.cpu_milli_free - pod.cpu_milli) / CPU_SCALE * 0.5
        waste += (shape.gpu_free_milli_total - pod.gpu_milli_total) / GPU_SCALE * 0.5
        return float(int((1.0 - waste) * 100))

    def normalize(self, raw: Sequence[float]) -> list[float]:
        return min_max(raw)
