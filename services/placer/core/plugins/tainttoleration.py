"""``TaintToleration``: a node's taints against the pod's tolerations, as kube-scheduler's plugin
of that name.

Filter: a ``NoSchedule`` or ``NoExecute`` taint the pod does not tolerate keeps it off the node,
``node(s) had untolerated taint {key: value}`` (unresolvable: only a toleration or the taint's
removal helps). Score: the node's ``PreferNoSchedule`` taints the pod does not tolerate,
fewer is better, normalised over the feasible nodes (reversed ``DefaultNormalizeScore``),
weight 3 as in kube-scheduler's default profile. Every pod is judged, tolerations or not, but
only against the index's tainted nodes: on a cluster without taints the rule has nothing to
do, and with a few tainted nodes the pod is still ranked by shape, those nodes avoided.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from services.placer.core.facts import PodFacts
from services.placer.core.framework import NodeCheck, Refusal
from services.placer.core.index import ClusterIndex
from services.placer.core.model import NodeState
from services.placer.core.nodeaware import default_normalize
from shared.messages.constraints import Taint, Toleration
from shared.selectors import untolerated

NAME = "TaintToleration"
HARD = frozenset({"NoSchedule", "NoExecute"})
SOFT = frozenset({"PreferNoSchedule"})


def untolerated_reason(taint: Taint) -> str:
    return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"


class TaintCheck(NodeCheck):
    def __init__(self, refused: Mapping[str, Refusal], soft: Mapping[str, int]) -> None:
        self._refused = refused
        self._soft = soft
        self.scores = bool(soft)

    def refused(self) -> Mapping[str, Refusal]:
        return self._refused

    def refuse(self, node: NodeState) -> Refusal | None:
        return self._refused.get(node.name)

    def score(self, nodes: Sequence[NodeState]) -> list[float]:
        return default_normalize([self._soft.get(n.name, 0) for n in nodes], reverse=True)


def _judged(
    cluster: ClusterIndex, tolerations: tuple[Toleration, ...]
) -> tuple[dict[str, Refusal], dict[str, int]]:
    """The tainted nodes the tolerations do not let the pod on, and for each node the number of
    its ``PreferNoSchedule`` taints they do not tolerate (kept until a taint changes)."""
    key = (NAME, tolerations)
    found = cluster.node_cache.get(key)
    if found is None:
        refused: dict[str, Refusal] = {}
        soft: dict[str, int] = {}
        for name, taints in cluster.tainted.items():
            taint = untolerated(taints, tolerations, HARD)
            if taint is not None:
                refused[name] = Refusal(reason=untolerated_reason(taint), unresolvable=True)
            count = sum(1 for t in taints if untolerated((t,), tolerations, SOFT) is not None)
            if count:
                soft[name] = count
        found = cluster.node_cache[key] = (refused, soft)
    return found  # type: ignore[return-value]  # stored just above


class TaintTolerationRule:
    name = NAME
    weight = 3.0

    def check(self, pod: PodFacts, cluster: ClusterIndex) -> NodeCheck | None:
        if not cluster.tainted:
            return None
        constraints = pod.request.constraints
        tolerations = constraints.tolerations if constraints is not None else ()
        refused, soft = _judged(cluster, tolerations)
        if not refused and not soft:
            return None
        return TaintCheck(refused, soft)
