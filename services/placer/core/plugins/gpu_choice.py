"""GPU choice inside the chosen node: which physical GPU each share lands on.

Every chooser gets only GPUs the share fits on and that its container does not use yet, and
returns one of them; ties always end on the lowest GPU index, so choices are deterministic.

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
- ``random``: a uniformly random candidate (the paper's Random policy), from the caller's RNG.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from services.placer.core.facts import PodFacts
from services.placer.core.fragmentation import FILL_TIE, FragmentationModel
from services.placer.core.model import GpuSlice, GpuState, NodeState
from services.placer.core.shape import gpu_free_milli


class Binpack:
    name = "binpack"

    def pick(
        self,
        pod: PodFacts,
        node: NodeState,
        working: Sequence[GpuState],
        candidates: Sequence[GpuState],
        placed: Sequence[GpuSlice],
        rng: random.Random,
    ) -> GpuState:
        return min(candidates, key=lambda g: (g.memory_free_mib, gpu_free_milli(g), g.index))


class Spread:
    name = "spread"

    def pick(
        self,
        pod: PodFacts,
        node: NodeState,
        working: Sequence[GpuState],
        candidates: Sequence[GpuState],
        placed: Sequence[GpuSlice],
        rng: random.Random,
    ) -> GpuState:
        return min(candidates, key=lambda g: (g.utilization_pct, -g.memory_free_mib, g.index))


class FirstFit:
    name = "first-fit"

    def pick(
        self,
        pod: PodFacts,
        node: NodeState,
        working: Sequence[GpuState],
        candidates: Sequence[GpuState],
        placed: Sequence[GpuSlice],
        rng: random.Random,
    ) -> GpuState:
        return min(candidates, key=lambda g: g.index)


class Colocate:
    name = "colocate"

    def pick(
        self,
        pod: PodFacts,
        node: NodeState,
        working: Sequence[GpuState],
        candidates: Sequence[GpuState],
        placed: Sequence[GpuSlice],
        rng: random.Random,
    ) -> GpuState:
        serving = {s.index for s in placed}
        uid = pod.request.uid
        return min(
            candidates,
            key=lambda g: (
                not (g.index in serving or (uid and uid in g.holders)),
                g.memory_free_mib,
                g.index,
            ),
        )


class Topology:
    name = "topology"

    def pick(
        self,
        pod: PodFacts,
        node: NodeState,
        working: Sequence[GpuState],
        candidates: Sequence[GpuState],
        placed: Sequence[GpuSlice],
        rng: random.Random,
    ) -> GpuState:
        if not placed:
            # Start where the most candidate peers are reachable over NVLink.
            pool = {g.index for g in candidates}
            return min(
                candidates,
                key=lambda g: (
                    -sum(1 for p in g.nvlink_peers if p in pool),
                    g.memory_free_mib,
                    g.index,
                ),
            )
        taken = {s.index for s in placed}
        first = next((g for g in working if g.index == placed[0].index), None)
        numa = first.numa_node if first is not None else -1
        return min(
            candidates,
            key=lambda g: (
                -sum(1 for p in g.nvlink_peers if p in taken),
                g.numa_node != numa,
                g.memory_free_mib,
                g.index,
            ),
        )


class Fgd:
    name = "fgd"

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

    def pick(
        self,
        pod: PodFacts,
        node: NodeState,
        working: Sequence[GpuState],
        candidates: Sequence[GpuState],
        placed: Sequence[GpuSlice],
        rng: random.Random,
    ) -> GpuState:
        ordered = sorted(candidates, key=lambda g: g.index)
        if not pod.fractional:
            return ordered[0]
        models = frozenset(g.model for g in working)
        free = [gpu_free_milli(g) for g in working]
        before = self.model.node(models, node.cpu_milli_free, node.memory_mib_free, free)
        cpu_after = node.cpu_milli_free - pod.cpu_milli
        memory_after = node.memory_mib_free - pod.memory_mib
        position = {g.index: i for i, g in enumerate(working)}
        best: GpuState | None = None
        best_score = -1.0
        for gpu in ordered:
            i = position[gpu.index]
            after_free = list(free)
            after_free[i] = max(0, after_free[i] - pod.share_milli)
            after = self.model.node(models, cpu_after, memory_after, after_free)
            score = 100 * sigmoid((before - after) / 1000)
            if not self.exact:
                score = float(int(score))
            if self.fill_waste is not None:
                score += FILL_TIE * (self.fill_waste[free[i]] - self.fill_waste[after_free[i]])
            if score > best_score:
                best, best_score = gpu, score
        assert best is not None
        return best


class Random:
    name = "random"

    def pick(
        self,
        pod: PodFacts,
        node: NodeState,
        working: Sequence[GpuState],
        candidates: Sequence[GpuState],
        placed: Sequence[GpuSlice],
        rng: random.Random,
    ) -> GpuState:
        return rng.choice(sorted(candidates, key=lambda g: g.index))


def sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)
