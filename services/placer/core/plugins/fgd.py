"""FGD node score (Weng et al., ATC '23): how much placing the pod reduces the node's fragmentation.

``score = int(100 * sigmoid((F_n - F_n') / 1000))`` where ``F_n`` is the node's expected fragmented
GPU milli under the typical task mix (``fragmentation.py``) and ``F_n'`` the same after the pod is
placed: for a GPU-sharing pod on its best GPU, for whole GPUs on the idle GPUs the fit takes, for a
CPU-only pod with only the CPU gone. ``exact=True`` drops the integer truncation, so nodes the paper
scores equal can still be told apart (a profile may ask for it with ``exact: true``; Tessera's own
profile keeps the truncation and changes the fragmentation measure instead, see ``fed_fgd.py``).
``fill_waste`` adds a tie-break below one point for GPU-sharing pods (``fragmentation.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from services.placer.core.facts import PodFacts
from services.placer.core.fragmentation import FILL_TIE, FragmentationModel
from services.placer.core.framework import GpuFilter, gpu_admitted
from services.placer.core.model import GPU_MILLI
from services.placer.core.plugins.fit import admitted_gpus, by_kind
from services.placer.core.plugins.gpu_choice import sigmoid
from services.placer.core.search import assign, share_fits
from services.placer.core.shape import GpuShape, NodeShape

NAME = "fgd"


class FgdScore:
    """FGD's node score over ``model``; with ``fill_waste`` (integer scores only), GPU-sharing
    pods break equal points by the fill waste their GPU loses (``fragmentation.fill_waste``)."""

    def __init__(
        self,
        model: FragmentationModel,
        *,
        gpu_filters: Sequence[GpuFilter] = (),
        exact: bool = False,
        step: int = 1,
        fill_waste: tuple[int, ...] | None = None,
        name: str = NAME,
    ) -> None:
        self.model = model
        self.gpu_filters = tuple(gpu_filters)
        self.exact = exact
        self.step = step
        self.fill_waste = fill_waste
        self.name = name
        self._by_kind = by_kind(self.gpu_filters)

    def _value(self, delta: float) -> float:
        value = 100.0 * sigmoid(delta / 1000.0)
        if self.exact:
            return value
        return float(int(value) // self.step * self.step)

    def score(self, pod: PodFacts, shape: NodeShape) -> float:
        model = self.model
        free = shape.free_milli
        before = model.node(shape.models, shape.cpu_milli_free, shape.memory_mib_free, free)
        cpu_after = shape.cpu_milli_free - pod.cpu_milli
        memory_after = shape.memory_mib_free - pod.memory_mib
        if pod.fractional:
            ask = pod.asks[0]
            best: float | None = None
            previous: GpuShape | None = None
            filters, by_kind = self.gpu_filters, self._by_kind
            kind: tuple[str, tuple[str, ...]] | None = None
            kind_admitted = True
            # The share's milli, by the GPU's memory (a node's GPUs mostly share one size).
            memory_total, milli = -1, 0
            fill_waste = self.fill_waste
            for i, gpu in enumerate(shape.gpus):
                # A GPU equal to the one before it (the shape's GPUs are sorted) scores the
                # same, wherever the share goes: only the first of them is judged.
                if gpu == previous:
                    continue
                previous = gpu
                if not share_fits(ask, gpu):
                    continue
                if filters:
                    if not by_kind:
                        if not gpu_admitted(pod, gpu, filters):
                            continue
                    else:
                        if (gpu.model, gpu.groups) != kind:
                            kind = (gpu.model, gpu.groups)
                            kind_admitted = gpu_admitted(pod, gpu, filters)
                        if not kind_admitted:
                            continue
                if gpu.memory_total_mib != memory_total:
                    memory_total = gpu.memory_total_mib
                    milli = ask.milli_on(memory_total)
                after = list(free)
                after[i] = max(0, after[i] - milli)
                value = self._value(
                    before - model.node(shape.models, cpu_after, memory_after, after)
                )
                if fill_waste is not None:
                    value += FILL_TIE * (fill_waste[free[i]] - fill_waste[after[i]])
                if best is None or value > best:
                    best = value
            return 0.0 if best is None else best
        after = list(free)
        if pod.asks:
            admitted = admitted_gpus(pod, shape.gpus, self.gpu_filters, self._by_kind)
            positions = assign(pod.asks, shape.gpus, admitted) or ()
            flat = [ask for ask in pod.asks for _ in range(ask.shares)]
            for ask, i in zip(flat, positions, strict=False):
                taken = GPU_MILLI if ask.whole else ask.milli_on(shape.gpus[i].memory_total_mib)
                after[i] = max(0, after[i] - taken)
        return self._value(before - model.node(shape.models, cpu_after, memory_after, after))
