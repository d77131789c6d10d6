"""Node spread: prefer the emptiest node after placement (100 x (1 - fill), see ``binpack.py``)."""

from __future__ import annotations

from services.placer.core.facts import PodFacts
from services.placer.core.plugins.binpack import fill_after
from services.placer.core.shape import NodeShape

NAME = "spread"


class SpreadScore:
    name = NAME

    def score(self, pod: PodFacts, shape: NodeShape) -> float:
        return 100.0 * (1.0 - fill_after(pod, shape))
