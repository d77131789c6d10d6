"""The pod-facing names of docs/design.md §3: resources, user hints, and what Tessera writes.

The binder owns this module: it reads the user-settable annotations and labels into
``PodPending`` (the placer never reads raw annotations) and writes the three annotations below.
While NATS holds its state, nothing reads the written annotations as truth: the assignment
records are (docs/design.md §4). When NATS lost its store, ``tessera.dev/assignment`` of the pods
bound is what their placements are restored from (docs/design.md §12; ``PodRestore``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final

from shared import codec
from shared.messages.base import ContainerSlices, GpuSlice, Message

PREFIX: Final = "tessera.dev/"

# --- container resources (limits) ------------------------------------------------------------

GPU: Final = "tessera.dev/gpu"
"""Shares, each on a distinct physical GPU."""
GPU_MEMORY: Final = "tessera.dev/gpu-memory"
"""MiB per share."""
GPU_MEMORY_PERCENTAGE: Final = "tessera.dev/gpu-memory-percentage"
GPU_CORES: Final = "tessera.dev/gpu-cores"
"""Percent of the GPU's SMs per share (1..100)."""
RESOURCES: Final = (GPU, GPU_MEMORY, GPU_MEMORY_PERCENTAGE, GPU_CORES)

# --- annotations and labels a user may set ---------------------------------------------------

GPU_POLICY: Final = "tessera.dev/gpu-policy"
NODE_POLICY: Final = "tessera.dev/node-policy"
GPU_MODEL: Final = "tessera.dev/gpu-model"
GPU_MODEL_EXCLUDE: Final = "tessera.dev/gpu-model-exclude"
GPU_TYPE: Final = "tessera.dev/gpu-type"
GROUP: Final = "tessera.dev/group"
USER_ANNOTATIONS: Final = (GPU_POLICY, NODE_POLICY, GPU_MODEL, GPU_MODEL_EXCLUDE, GPU_TYPE, GROUP)

TENANT_LABEL: Final = "tessera.dev/tenant"
"""The tenant a pod asks for. Only a request: the pod's tenant is its namespace's (the
operator's tenancy file may map it), and the label may choose only among the tenants the file
allows that namespace; the placer refuses any other (``services/placer/core/groups.py``)."""
PRIORITY_LABEL: Final = "tessera.dev/priority"
"""An integer refining ``spec.priority`` among pods of equal priority."""

# --- annotations Tessera writes --------------------------------------------------------------

ASSIGNMENT: Final = "tessera.dev/assignment"
"""JSON :class:`AssignmentAnnotation`: node, per-container GPUs, decision time, placer id."""
BIND_TIME: Final = "tessera.dev/bind-time"
"""RFC 3339 UTC time (microseconds) the binder bound the pod."""
ASSIGNED: Final = "tessera.dev/assigned"
"""``"true"`` once the device plugin has allocated every GPU container of the pod."""
WRITTEN: Final = (ASSIGNMENT, BIND_TIME, ASSIGNED)


class AnnotatedContainer(Message, frozen=True, kw_only=True):
    """One container's decided GPU shares (uuid, index, MiB, percent of SMs each)."""

    container: str
    gpus: tuple[GpuSlice, ...]


class AssignmentAnnotation(Message, frozen=True, kw_only=True):
    """The value of ``tessera.dev/assignment`` (for people and tools; not a source of truth)."""

    node: str
    containers: tuple[AnnotatedContainer, ...]
    decided_at: float
    placer_id: str
    commit: str = ""
    """The placer commit of the placement (empty on pods bound before it was written)."""


def assignment_value(
    *,
    node: str,
    containers: Sequence[ContainerSlices],
    decided_at: float,
    placer_id: str,
    commit: str = "",
) -> str:
    """The ``tessera.dev/assignment`` annotation value for a decision."""
    annotation = AssignmentAnnotation(
        node=node,
        containers=tuple(
            AnnotatedContainer(container=c.container, gpus=c.gpus) for c in containers if c.gpus
        ),
        decided_at=decided_at,
        placer_id=placer_id,
        commit=commit,
    )
    return codec.encode(annotation).decode()


def time_value(at: float) -> str:
    """An RFC 3339 UTC timestamp with microseconds (the ``tessera.dev/bind-time`` format)."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
