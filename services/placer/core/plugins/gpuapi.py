"""``GpuApi``: a node offers its GPUs one way, and a pod takes them that way (docs/design.md §14).

A node labelled ``tessera.dev/gpu-api=dra`` offers its GPUs through DRA only: its kubelet has no
``tessera.dev/*`` device-plugin resources, so a pod asking for GPUs through them (a container
with shares that is not a claim's ask) is kept off it, ``node(s) offer GPUs through DRA only``
(unresolvable: only a ResourceClaim, or the node's label, helps). The other way round, a pod's
claims already ask for DRA nodes (``translate.pod_request`` adds the node selector). Only the DRA
nodes are judged, listed from the index's labels: on a cluster without any the rule does nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.placer.core.facts import PodFacts
from services.placer.core.framework import NodeCheck, Refusal
from services.placer.core.index import ClusterIndex
from services.placer.core.model import NodeState
from shared.dra.claims import claim_of_container
from shared.dra.devices import DEVICE_CLASS, DRA_API, NODE_API_LABEL

NAME = "GpuApi"
REFUSAL = Refusal(
    reason=f"node(s) offer GPUs through DRA only ({NODE_API_LABEL}={DRA_API}): ask with a "
    f"ResourceClaim of class {DEVICE_CLASS}",
    unresolvable=True,
)


class DraNodesCheck(NodeCheck):
    def __init__(self, nodes: frozenset[str]) -> None:
        self._refused = dict.fromkeys(nodes, REFUSAL)

    def refused(self) -> Mapping[str, Refusal]:
        return self._refused

    def refuse(self, node: NodeState) -> Refusal | None:
        return self._refused.get(node.name)


class GpuApiRule:
    name = NAME
    weight = 0.0

    def check(self, pod: PodFacts, cluster: ClusterIndex) -> NodeCheck | None:
        if not any(claim_of_container(ask.container) is None for ask in pod.asks):
            return None  # no device-plugin GPUs asked
        nodes = cluster.with_label(NODE_API_LABEL, DRA_API)
        return DraNodesCheck(nodes) if nodes else None
