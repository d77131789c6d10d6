"""GPU choice inside the chosen node: the order in which a share tries the node's GPUs.

A chooser only orders; the search over GPUs (``search.py``) places each share on the first GPU in
that order that leaves the pod's later shares room, so for a pod of one share the first GPU is the
choice. Every chooser orders only GPUs the share fits on that its container does not use yet, and
ties always end on the lowest GPU index, so choices are deterministic.

- ``binpack`` (seed 004): the fitting GPU with the least free memory.
- ``spread`` (seed 000, flag 1): the least-loaded GPU by live utilisation, then the most free
  memory.
- ``first-fit`` (seed 003): the lowest index.
- ``colocate`` (seed 000, flag 2): a GPU already serving this pod (an earlier container, or a
  share it already holds there), else binpack.
- ``topology``: for multi-GPU shares, the GPU with the most NVLinks to the GPUs this pod already
  took, then the same NUMA node as the first of them, then binpack.
- ``fgd``: the GPU whose use leaves the node least fragmented for the typical task mix (the FGD
  paper's choice, first index on equal integer scores, or the fill-waste tie-break first when
  given); whole GPUs by lowest index.
- ``random``: a uniformly random candidate first (the paper's Random policy), from the caller's
  RNG, then the others by index.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from services.placer.core.facts import PodFacts
from services.placer.core.fragmentation import FILL_TIE, FragmentationModel
from services.placer.core.model import NodeState
from services.placer.core.shape import GpuShape


class Binpack:
    name = "binpack"
    draws = False

    def order(
        self,
        pod: PodFacts,
        node: NodeState,
        gpus: Sequence[GpuShape],
        candidates: Sequence[int],
        chosen: Sequence[int],
        rng: random.Random | None,
    ) -> list[int]:
        return sorted(
            candidates,
            key=lambda i: (gpus[i].memory_free_mib, gpus[i].free_milli, node.gpus[i].index),
        )


class Spread:
    name = "spread"
    draws = False

    def order(
        self,
        pod: PodFacts,
        node: NodeState,
        gpus: Sequence[GpuShape],
        candidates: Sequence[int],
        chosen: Sequence[int],
        rng: random.Random | None,
    ) -> list[int]:
        return sorted(
            candidates,
            key=lambda i: (gpus[i].utilization_pct, -gpus[i].memory_free_mib, node.gpus[i].index),
        )


class FirstFit:
    name = "first-fit"
    draws = False

    def order(
        self,
        pod: PodFacts,
        node: NodeState,
        gpus: Sequence[GpuShape],
        candidates: Sequence[int],
        chosen: Sequence[int],
        rng: random.Random | None,
    ) -> list[int]:
        return sorted(candidates, key=lambda i: node.gpus[i].index)


class Colocate:
    name = "colocate"
    draws = False

    def order(
        self,
        pod: PodFacts,
        node: NodeState,
        gpus: Sequence[GpuShape],
        candidates: Sequence[int],
        chosen: Sequence[int],
        rng: random.Random | None,
    ) -> list[int]:
        serving = set(chosen)
        uid = pod.request.uid
        return sorted(
            candidates,
            key=lambda i: (
                not (i in serving or (uid and uid in node.gpus[i].holders)),
                gpus[i].memory_free_mib,
                node.gpus[i].index,
            ),
        )


class Topology:
    name = "topology"
    draws = False

    def order(
        self,
        pod: PodFacts,
        node: NodeState,
        gpus: Sequence[GpuShape],
        candidates: Sequence[int],
        chosen: Sequence[int],
        rng: random.Random | None,
    ) -> list[int]:
        static = node.gpus
        if not chosen:
            # Start where the most candidate peers are reachable over NVLink.
            pool = {static[i].index for i in candidates}
            return sorted(
                candidates,
                key=lambda i: (
                    -sum(1 for p in static[i].nvlink_peers if p in pool),
                    gpus[i].memory_free_mib,
                    static[i].index,
                ),
            )
        taken = {static[i].index for i in chosen}
        numa = static[chosen[0]].numa_node
        return sorted(
            candidates,
            key=lambda i: (
                -sum(1 for p in static[i].nvlink_peers if p in taken),
                static[i].numa_node != numa,
                gpus[i].memory_free_mib,
                static[i].index,
            ),
        )


class Fgd:
    name = "fgd"
    draws = False

    def __init__(
        self,
        model: FragmentationModel,
        *,
        exact: bool = False,
        fill_waste: tuple[int, ...] | None = None,
    ) -> None:
        self.model = model
        self.exact = exact
        """Compare GPUs on the untruncated score (the paper truncates to an integer)."""
        self.fill_waste = fill_waste
        """Break equal points by the fill waste the GPU loses (as ``FgdScore`` does)."""

    def order(
        self,
        pod: PodFacts,
        node: NodeState,
        gpus: Sequence[GpuShape],
        candidates: Sequence[int],
        chosen: Sequence[int],
        rng: random.Random | None,
    ) -> list[int]:
        index = [g.index for g in node.gpus]
        ordered = sorted(candidates, key=index.__getitem__)
        if not pod.fractional:
            return ordered
        models = frozenset(g.model for g in node.gpus)
        free = [g.free_milli for g in gpus]
        before = self.model.node(models, node.cpu_milli_free, node.memory_mib_free, free)
        cpu_after = node.cpu_milli_free - pod.cpu_milli
        memory_after = node.memory_mib_free - pod.memory_mib
        scores: dict[int, float] = {}
        for i in ordered:
            after_free = list(free)
            after_free[i] = max(0, after_free[i] - pod.share_milli)
            after = self.model.node(models, cpu_after, memory_after, after_free)
            score = 100 * sigmoid((before - after) / 1000)
            if not self.exact:
                score = float(int(score))
            if self.fill_waste is not None:
                score += FILL_TIE * (self.fill_waste[free[i]] - self.fill_waste[after_free[i]])
            scores[i] = score
        return sorted(ordered, key=lambda i: -scores[i])  # stable: equal scores by index


class Random:
    name = "random"
    draws = True

    def order(
        self,
        pod: PodFacts,
        node: NodeState,
        gpus: Sequence[GpuShape],
        candidates: Sequence[int],
        chosen: Sequence[int],
        rng: random.Random | None,
    ) -> list[int]:
        if rng is None:
            raise AssertionError("the random GPU choice draws, so place_on_node seeds an RNG")
        ordered = sorted(candidates, key=lambda i: node.gpus[i].index)
        first = rng.choice(ordered)
        return [first, *(i for i in ordered if i != first)]


def sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)
