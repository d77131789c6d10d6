"""What GPUs a cluster has, and why a GPU request can never fit them (pure; docs/design.md §13).

The admission webhook and the placer judge the same question with the same words: given each
node's GPUs (model and memory of each, as the inventories publish them), can some node hold every
GPU ask of a pod, with nothing on it? When not, :func:`never_fits` names the dimension: no GPU of
an allowed model, more MiB per GPU than the largest GPU has, or more GPUs than a node has. The
webhook refuses such a pod at ``kubectl apply`` with that line; the placer's Pending reason says
the same (``services/placer/rules/capacity.py``, which also judges CPU and memory).

A GPU model a pod names (``tessera.dev/gpu-model``, ``-exclude``) matches as
:func:`model_matches` says.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Final

import msgspec

from shared import annotations as names

NodeGpus = tuple[tuple[str, int], ...]
"""One node's GPUs as (model, memory MiB), sorted: what decides whether a request fits it."""

_MODEL_VENDOR_PREFIX: Final = "NVIDIA "
_MODEL_SEPARATORS: Final = frozenset("- _")


def model_matches(model: str, wanted: str) -> bool:
    """Whether a GPU reported as ``model`` is of the model a pod names as ``wanted``.

    Pods name models as people say them (``A100``, ``H100``); inventories report them as NVML
    does (``NVIDIA A100-SXM4-80GB``) or with the memory (``A100-80GB``). ``wanted`` matches the
    model itself (case-insensitive, without the ``NVIDIA`` vendor prefix) or its leading part up
    to a separator (``-``, ``_``, space): ``A100`` matches ``A100-80GB`` and
    ``NVIDIA A100-SXM4-80GB``, never ``A100X`` or ``A10`` matching ``A100``.
    """
    name = model.strip().upper()
    if name.startswith(_MODEL_VENDOR_PREFIX):
        name = name[len(_MODEL_VENDOR_PREFIX) :]
    target = wanted.strip().upper()
    if target.startswith(_MODEL_VENDOR_PREFIX):
        target = target[len(_MODEL_VENDOR_PREFIX) :]
    if not target:
        return False
    if name == target:
        return True
    return name.startswith(target) and name[len(target)] in _MODEL_SEPARATORS


class Models(msgspec.Struct, frozen=True, kw_only=True):
    """The GPU models a pod allows (``tessera.dev/gpu-model`` and ``-exclude``)."""

    wanted: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()

    def allows(self, model: str) -> bool:
        if self.wanted and not any(model_matches(model, w) for w in self.wanted):
            return False
        return not any(model_matches(model, w) for w in self.excluded)

    def __str__(self) -> str:
        """`` of model A100|H100``, `` not of model T4``, both, or nothing."""
        text = ""
        if self.wanted:
            text += f" of model {'|'.join(self.wanted)}"
        if self.excluded:
            text += f"{',' if text else ''} not of model {'|'.join(self.excluded)}"
        return text


class GpuAsk(msgspec.Struct, frozen=True, kw_only=True):
    """One container's GPU ask: ``shares`` distinct GPUs, each with this much memory."""

    container: str
    shares: int
    memory_mib: int | None = None
    """MiB per share (None: a percentage, a whole GPU, or cores only)."""
    memory_pct: int | None = None

    def memory_on(self, gpu_mib: int) -> int:
        """MiB this share takes on a GPU of ``gpu_mib``."""
        if self.memory_mib is not None:
            return self.memory_mib
        if self.memory_pct is not None:
            return gpu_mib * self.memory_pct // 100
        return 0


class NeverFits(msgspec.Struct, frozen=True, kw_only=True):
    """Why no node could ever hold a pod's GPUs: the container and resource it is about (empty
    when it is about no single one), and the problem in words."""

    container: str
    resource: str
    problem: str


def _holds(ask: GpuAsk, gpus: NodeGpus, models: Models) -> int:
    """How many of ``gpus`` could each take one share of ``ask``."""
    return sum(1 for model, mib in gpus if models.allows(model) and ask.memory_on(mib) <= mib)


def gpus_fit(asks: Sequence[GpuAsk], gpus: NodeGpus, models: Models) -> bool:
    """Whether a node with ``gpus`` and nothing on it could hold every ask."""
    return all(_holds(ask, gpus, models) >= ask.shares for ask in asks)


def never_fits(
    asks: Sequence[GpuAsk], nodes: Collection[NodeGpus], models: Models
) -> NeverFits | None:
    """Why no node of ``nodes`` (each node's GPUs) could hold the GPU asks even empty, the
    first dimension that fails; None when one could, or when no node is known at all."""
    asks = [ask for ask in asks if ask.shares > 0]
    if not asks or not nodes or any(gpus_fit(asks, gpus, models) for gpus in nodes):
        return None
    allowed = [mib for gpus in nodes for model, mib in gpus if models.allows(model)]
    if not allowed:
        return NeverFits(
            container="",
            resource="",
            problem=f"asks GPUs{models}; no node here has one",
        )
    largest = max(allowed)
    for ask in asks:
        if ask.memory_mib is not None and ask.memory_mib > largest:
            return NeverFits(
                container=ask.container,
                resource=names.GPU_MEMORY,
                problem=f"asks {ask.memory_mib} MiB per GPU; the largest GPU{models} here has "
                f"{largest} MiB",
            )
    for ask in asks:
        most = max(_holds(ask, gpus, models) for gpus in nodes)
        if ask.shares > most:
            each = f" with {ask.memory_mib} MiB each" if ask.memory_mib else ""
            return NeverFits(
                container=ask.container,
                resource=names.GPU,
                problem=f"asks {ask.shares} GPUs{each}; a node here has at most {most} "
                f"GPU{'s' if most != 1 else ''}{models}{' that large' if each else ''}",
            )
    return NeverFits(
        container="",
        resource="",
        problem="no node here has the GPUs its containers ask for all together",
    )
