"""``NodeAffinity``: ``spec.nodeSelector`` and ``spec.affinity.nodeAffinity``, as
kube-scheduler's plugin of that name.

PreFilter: the nodes the pod's ``nodeSelector`` and required terms allow, found from the index's
labels (the nodes labelled with each ``nodeSelector`` pair, then the required terms over those)
and kept until a label changes; they are the pod's only candidates. Every other node is refused,
``node(s) didn't match Pod's node affinity/selector`` (unresolvable: only a label change helps),
unless a rule kube-scheduler runs first (a taint) says otherwise. Score: the weights of the
preferred terms a node matches, normalised over the feasible nodes (kube-scheduler's
``DefaultNormalizeScore``), weight 2 as in its default profile.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.placer.core.facts import PodFacts
from services.placer.core.framework import NodeCheck, Refusal
from services.placer.core.index import ClusterIndex
from services.placer.core.model import NodeState
from services.placer.core.nodeaware import default_normalize
from shared.messages.constraints import Constraints, PreferredNodeTerm
from shared.selectors import required_affinity_matches, term_matches_node

NAME = "NodeAffinity"
NOT_MATCHED = "node(s) didn't match Pod's node affinity/selector"
REFUSAL = Refusal(reason=NOT_MATCHED, unresolvable=True)


def candidates(constraints: Constraints, cluster: ClusterIndex) -> frozenset[str]:
    """The nodes of ``cluster`` that satisfy the pod's ``nodeSelector`` and required node
    affinity (kept in the index's node cache until a label changes)."""
    affinity = constraints.node_affinity
    key = (NAME, constraints.node_selector, affinity.required if affinity is not None else None)
    found = cluster.node_cache.get(key)
    if found is None:
        pool: frozenset[str] | None = None
        for label, value in constraints.node_selector:
            labelled = cluster.with_label(label, value)
            pool = labelled if pool is None else pool & labelled
        nodes = (cluster.node(n) for n in pool) if pool is not None else iter(cluster)
        found = cluster.node_cache[key] = frozenset(
            node.name
            for node in nodes
            if required_affinity_matches(constraints, node.name, node.labels)
        )
    assert isinstance(found, frozenset)
    return found


class NodeAffinityCheck(NodeCheck):
    def __init__(
        self,
        constraints: Constraints,
        cluster: ClusterIndex,
        *,
        required: bool,
        preferred: tuple[PreferredNodeTerm, ...],
    ) -> None:
        if required:
            self.candidates = candidates(constraints, cluster)
        self.scores = bool(preferred)
        self._preferred = preferred

    def refuse(self, node: NodeState) -> Refusal | None:
        if self.candidates is not None and node.name not in self.candidates:
            return REFUSAL
        return None

    def score(self, nodes: Sequence[NodeState]) -> list[float]:
        raw = [
            sum(p.weight for p in self._preferred if term_matches_node(p.term, n.name, n.labels))
            for n in nodes
        ]
        return default_normalize(raw, reverse=False)


class NodeAffinityRule:
    name = NAME
    weight = 2.0

    def check(self, pod: PodFacts, cluster: ClusterIndex) -> NodeCheck | None:
        constraints = pod.request.constraints
        if constraints is None:
            return None
        affinity = constraints.node_affinity
        required = bool(constraints.node_selector) or (
            affinity is not None and affinity.required is not None
        )
        preferred = affinity.preferred if affinity is not None else ()
        if not required and not preferred:
            return None
        return NodeAffinityCheck(constraints, cluster, required=required, preferred=preferred)
