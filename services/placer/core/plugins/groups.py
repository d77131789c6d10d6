"""The ``group`` filter (seed 001): a pod with a resource group lands only on the group's nodes
and GPUs.

The group is ``PodRequest.group``: the pod's ``tessera.dev/group`` label, or the one
``Tenancy.choose`` picked for it (best fit, or the implicit group of a restricted tenant) before
the decision. Membership is read from ``NodeShape.groups`` / ``GpuShape.groups``, which the
tenancy writes onto node states (``groups.annotate``); so the filter is a pure function of the
request and the shape and the framework may memoise it. A pod without a group passes everywhere.

It is both a node ``Filter`` (the node must be in the group) and a ``GpuFilter`` (each share must
land on a GPU of the group), registered with ``build_profile(filters=..., gpu_filters=...)``.
"""

from __future__ import annotations

from services.placer.core.facts import PodFacts
from services.placer.core.shape import GpuShape, NodeShape

NAME = "group"


class GroupFilter:
    """Keeps a pod with a group inside that group's nodes and GPUs."""

    name = NAME

    def filter(self, pod: PodFacts, shape: NodeShape) -> str | None:
        group = pod.request.group
        if group is None or group in shape.groups:
            return None
        return f"not in resource group {group!r}"

    def admits_gpu(self, pod: PodFacts, gpu: GpuShape) -> bool:
        group = pod.request.group
        return group is None or group in gpu.groups
