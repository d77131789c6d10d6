"""The base class of every wire message and the small value types several families share."""

from __future__ import annotations

from typing import Literal

import msgspec


class Message(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=False):
    """Base of every wire message: immutable, keyword-only, unknown fields tolerated on decode."""


GpuPolicy = Literal["binpack", "spread", "colocate"]
"""Choice of physical GPU inside the chosen node (``tessera.dev/gpu-policy``)."""

NodePolicy = Literal["binpack", "spread", "fgd", "balanced"]
"""Node scoring override (``tessera.dev/node-policy``)."""

GpuType = Literal["physical", "virtual"]
"""Whole exclusive GPU (physical) or a shared slice (virtual); ``tessera.dev/gpu-type``."""


class GpuSlice(Message, frozen=True, kw_only=True):
    """One share of one physical GPU decided for a container."""

    uuid: str
    index: int
    memory_mib: int
    cores: int
    """Percent of the GPU's SMs (1..100)."""


class ContainerSlices(Message, frozen=True, kw_only=True):
    """Every GPU share decided for one container, with the device request the kubelet will see."""

    container: str
    gpus: tuple[GpuSlice, ...]
    resources: dict[str, int] = {}
    """The container's Tessera extended-resource limits as written in the pod spec
    (for example ``{"tessera.dev/gpu": 2}``): the device plugin matches Allocate calls on these."""
