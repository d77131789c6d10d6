"""DotProd (Tetris-style FGD paper baseline): the node whose free capacity aligns least
with the ask.

``score = int(100 * (1 - (cpu_left * cpu_req / 128000^2 + gpu_left * gpu_req / 8000^2) / 2))``
with ``*_left`` the node's free CPU and total free GPU milli before placement.
"""

from __future__ import annotations

from services.placer.core.facts import PodFacts
from services.placer.core.plugins.bestfit import CPU_SCALE, GPU_SCALE
from services.placer.core.shape import NodeShape

NAME = "dotprod"


class DotProdScore:
    name = NAME

    def score(self, pod: PodFacts, shape: NodeShape) -> float:
        dot = (shape.cpu_milli_free / CPU_SCALE) * (pod.cpu_milli / CPU_SCALE)
        dot += (shape.gpu_free_milli_total / GPU_SCALE) * (pod.gpu_milli_total / GPU_SCALE)
        return float(int(100 * (1 - dot / 2)))
