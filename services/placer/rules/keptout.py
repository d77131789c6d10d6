"""Pure: the nodes a pod can never run on for how they offer their GPUs, each with the reason the
placer counts for them as its other filters count theirs ("0/5 nodes are available: 3 DRA mode
(...)"; ``decider.py`` keeps them out before the profile looks at a node):

- a **memory-units** node (its device plugin advertises ``tessera.dev/gpu-memory`` only) for a
  pod with a GPU container that does not ask for it (``translate.needs_gpu_devices``, over the
  containers of ``tessera.dev/*`` resources): its kubelet would run the container without its
  GPUs;
- a **DRA** node (labelled ``tessera.dev/gpu-api=dra``: no Tessera device plugin, its GPUs
  offered as ResourceSlices) for a pod asking for GPUs through ``tessera.dev/*`` resources: its
  kubelet has no device plugin to ask for them (docs/design.md §14). The other way round, a pod's
  ``gpu.tessera.dev`` claims keep it on DRA nodes already (``translate.pod_request``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Final

from services.placer.core.model import ContainerRequest, PodRequest
from services.placer.rules import translate
from shared.dra.claims import CLAIM_CONTAINER_PREFIX
from shared.dra.devices import DRA_API, NODE_API_LABEL
from shared.messages.nodes import NodeFacts

DRA_ONLY: Final = "DRA mode (ask through a gpu.tessera.dev ResourceClaim to run there)"


def offers_dra(facts: NodeFacts | None) -> bool:
    """Whether the node offers its GPUs through DRA (its ``tessera.dev/gpu-api`` label)."""
    return facts is not None and facts.labels.get(NODE_API_LABEL) == DRA_API


def _plugin_containers(pod: PodRequest) -> tuple[ContainerRequest, ...]:
    """The containers asking for GPU shares through ``tessera.dev/*`` resources (not a claim's
    asks, named ``resourceclaims/...``: a DRA node's kubelet prepares those)."""
    return tuple(
        c for c in pod.containers if c.shares and not c.name.startswith(CLAIM_CONTAINER_PREFIX)
    )


def needs_device_plugin(pod: PodRequest) -> bool:
    """Whether a container asks for GPU shares through ``tessera.dev/*`` resources."""
    return bool(_plugin_containers(pod))


def kept_out(
    pod: PodRequest, *, memory_units: Collection[str], dra: Collection[str]
) -> Mapping[str, str]:
    """Node -> why ``pod`` can never run there, over the memory-units and DRA nodes given."""
    found: dict[str, str] = {}
    plugin = _plugin_containers(pod)
    if dra and plugin:
        found.update(dict.fromkeys(dra, DRA_ONLY))
    if memory_units and any(c.share_memory_mib is None for c in plugin):
        found.update((n, translate.MEMORY_UNITS_ONLY) for n in memory_units if n not in found)
    return found
