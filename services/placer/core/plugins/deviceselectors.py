"""``DeviceSelectors``: a DRA claim's selectors that read more than a GPU's model, node by node.

A pod whose claims' selectors read only the model is judged shape by shape (the model is in a
shape; ``PodRequest.allows_model``), and this rule has nothing to do for it: the shape memo's
speed. One whose selectors read per-GPU attributes (``index``, ``uuid``, ``memoryMiB``, the
NUMA node, the capacities: ``core/devicesel.py``) is judged on each node's own GPUs, as the
node-aware rules of ``nodeaware.py`` are: its shape is judged as if every GPU were allowed, and
this rule refuses a node where

- a selector that reads only the model cannot be evaluated on the model of one of its GPUs
  (found for the cluster's models once per pod, so a pod without such a selector keeps the
  shape path), or another selector on a GPU: that reason, unresolvable (Kubernetes fails such an
  allocation too);
- fewer GPUs meet the selectors than a container's shares need: which selector they did not
  meet, unresolvable;
- the shares do not fit on the GPUs that meet them (and the pod's model and group allow): the fit
  filter's reason, after the fit (a shape that does not fit keeps its own reason).

A pod refused everywhere with selectors on the model alone is told which of them no GPU model of
the cluster meets (:func:`name_model_selectors`, from the placer's decider).

The GPU choice then takes only GPUs that meet them (``framework.place_on_node``), with the same
search on the same GPUs, so a node this rule passes always has its GPUs chosen.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from services.placer.core.devicesel import admitted, model_problem, unmet
from services.placer.core.facts import PodFacts
from services.placer.core.framework import NodeCheck, Refusal, gpu_admitted
from services.placer.core.index import ClusterIndex
from services.placer.core.model import (
    NodeState,
    RejectionReason,
    model_device,
    model_selectors,
)
from services.placer.core.plugins.fit import NO_GPU_ROOM, NO_IDLE_GPUS, TOO_FEW_ALLOWED, GpuModel
from services.placer.core.plugins.groups import GroupFilter
from services.placer.core.search import assign
from services.placer.core.shape import NodeShape, gpu_shape
from shared.dra import cel

NAME = "DeviceSelectors"
_FILTERS = (GpuModel(), GroupFilter())
"""The GPU filters a profile runs (model, group): a GPU the selectors admit must pass them too."""


class SelectorCheck(NodeCheck):
    def __init__(
        self, pod: PodFacts, selectors: tuple[str, ...], erring: frozenset[str] = frozenset()
    ) -> None:
        self._pod = pod
        self._selectors = selectors
        self._erring = erring
        self._needed = max((ask.shares for ask in pod.asks), default=0)

    def refused(self) -> Mapping[str, Refusal] | None:
        return None  # every node's GPUs are judged

    def refuse(self, node: NodeState) -> Refusal | None:
        pod, gpus = self._pod, node.gpus
        for gpu in gpus:
            if gpu.model in self._erring:
                problem = model_problem(pod.request.gpu_selectors, gpu.model)
                return Refusal(reason=str(problem), unresolvable=True)
        if not self._selectors:
            return None
        why = unmet(self._selectors, gpus, self._needed)
        if why is not None:
            return Refusal(reason=why, unresolvable=True)
        shapes = [gpu_shape(g) for g in gpus]
        meets = admitted(self._selectors, gpus)
        allowed = [
            ok and gpu_admitted(pod, s, _FILTERS) for ok, s in zip(meets, shapes, strict=True)
        ]
        if sum(allowed) < self._needed:
            return Refusal(
                reason=f"too few GPUs that meet the selectors are of an allowed model or group "
                f"({sum(allowed)}, {self._needed} needed)",
                unresolvable=True,
            )
        # The order the node's shape has (and the GPU choice falls back to): the same search.
        order = sorted(range(len(shapes)), key=shapes.__getitem__)
        if assign(pod.asks, [shapes[i] for i in order], [allowed[i] for i in order]) is None:
            whole = all(ask.whole for ask in pod.asks)
            reason = NO_IDLE_GPUS if whole else NO_GPU_ROOM
            return Refusal(
                reason=f"{reason} on the GPUs that meet the selectors",
                unresolvable=False,
                stage="after_fit",
            )
        return None


class DeviceSelectorRule:
    name = NAME
    weight = 0.0

    def __init__(self) -> None:
        self._models: tuple[list[NodeShape], int, frozenset[str]] = ([], 0, frozenset())
        """The GPU models of an index's shapes, kept with the list they were read from (held,
        so that no other list takes its identity) and its length: shapes are only appended to
        it (a compacted index makes a new list), so the same list as long holds the same."""

    def _models_of(self, cluster: ClusterIndex) -> frozenset[str]:
        shapes, seen, models = self._models
        if shapes is not cluster.shapes or seen != len(shapes):
            shapes = cluster.shapes
            models = frozenset(m for found in {s.models for s in shapes} for m in found)
            self._models = (shapes, len(shapes), models)
        return models

    def check(self, pod: PodFacts, cluster: ClusterIndex) -> NodeCheck | None:
        request = pod.request
        if not request.gpu_selectors or not pod.asks:
            return None
        erring = frozenset(
            m for m in self._models_of(cluster) if model_problem(request.gpu_selectors, m)
        )
        selectors = request.device_selectors
        if not selectors and not erring:
            return None  # judged by model alone, shape by shape
        return SelectorCheck(pod, selectors, erring)


def first_unmet(selectors: tuple[str, ...], model: str) -> str | None:
    """The first of ``selectors`` reading only the model that a GPU of ``model`` does not meet
    (or cannot be judged on); None when it meets them all."""
    device = model_device(model)
    for expression in model_selectors(selectors):
        if cel.select((expression,), device) is not True:
            return expression
    return None


def name_model_selectors(
    reasons: Sequence[RejectionReason], selectors: tuple[str, ...], models: Iterable[str]
) -> tuple[RejectionReason, ...]:
    """``reasons`` with the fit's "too few GPUs of an allowed model or group" saying which
    selector reading only the model no GPU model of the cluster (``models``) meets, when one
    does not: judged shape by shape, a node only knows its GPUs were not allowed."""
    unmet = {first_unmet(selectors, m) for m in models} if selectors else set()
    if not unmet or None in unmet:
        return tuple(reasons)
    named = ", ".join(repr(e) for e in model_selectors(selectors) if e in unmet)
    said = f"{TOO_FEW_ALLOWED} (no GPU model here meets selector {named})"
    return tuple(
        RejectionReason(reason=said, nodes=r.nodes) if r.reason == TOO_FEW_ALLOWED else r
        for r in reasons
    )
