"""Seed 002's node scores, with the formulas the seed lost (images) defined here.

For a pod *without* GPUs (Score1), with ``w1``, ``w2``::

    balance = 1 - |cpu_frac - mem_frac|        # node's used fractions after placement
    gpu_busy = 1 - idle_gpu_milli / total_gpu_milli   (1 on a node without GPUs)
    Score1 = 100 * (w1 * balance + w2 * gpu_busy) / (w1 + w2)

so CPU pods keep away from idle GPU nodes and keep CPU and memory in step.

For a pod *with* GPUs (Score2), with ``w3``, ``w4``, ``w5``, over the GPU a best fit would use::

    quality = (1 - utilisation / 100) * free_memory / total_memory   # the GPU's condition
    memory_fit = asked_memory_milli / free_milli                      # 1 = exact fit
    Score2 = 100 * (w3 * quality + w4 * memory_fit + w5 * balance) / (w3 + w4 + w5)

Every term lies in 0..1. The seed's clock and power terms are not in the node model; utilisation
stands in for the GPU's load.
"""

from __future__ import annotations

import msgspec

from services.placer.core.facts import PodFacts
from services.placer.core.model import GPU_MILLI
from services.placer.core.search import share_fits
from services.placer.core.shape import NodeShape

NAME = "balanced"


class BalanceArgs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    w1: float = 1.0
    w2: float = 1.0
    w3: float = 1.0
    w4: float = 1.0
    w5: float = 1.0


def balance_after(pod: PodFacts, shape: NodeShape) -> float:
    if not shape.cpu_milli_total or not shape.memory_mib_total:
        return 0.0
    cpu = 1 - (shape.cpu_milli_free - pod.cpu_milli) / shape.cpu_milli_total
    mem = 1 - (shape.memory_mib_free - pod.memory_mib) / shape.memory_mib_total
    return max(0.0, 1.0 - abs(cpu - mem))


class BalanceScore:
    name = NAME

    def __init__(self, args: BalanceArgs | None = None) -> None:
        self.args = args or BalanceArgs()

    def score(self, pod: PodFacts, shape: NodeShape) -> float:
        a = self.args
        balance = balance_after(pod, shape)
        if not pod.asks:
            capacity = GPU_MILLI * len(shape.gpus)
            busy = 1.0 - shape.gpu_free_milli_total / capacity if capacity else 1.0
            return 100.0 * (a.w1 * balance + a.w2 * busy) / (a.w1 + a.w2)
        ask = pod.asks[0]
        fitting = [g for g in shape.gpus if share_fits(ask, g)]
        if not fitting:
            return 0.0
        gpu = min(fitting, key=lambda g: (g.free_milli, g.memory_free_mib))
        quality = (1 - gpu.utilization_pct / 100) * (
            gpu.memory_free_mib / gpu.memory_total_mib if gpu.memory_total_mib else 0.0
        )
        asked = ask.milli_on(gpu.memory_total_mib)
        memory_fit = min(1.0, asked / gpu.free_milli) if gpu.free_milli else 0.0
        return 100.0 * (a.w3 * quality + a.w4 * memory_fit + a.w5 * balance) / (a.w3 + a.w4 + a.w5)
