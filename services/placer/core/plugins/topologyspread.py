"""``PodTopologySpread``: ``spec.topologySpreadConstraints``, as kube-scheduler's plugin of that
name.

PreFilter, for each ``DoNotSchedule`` constraint: the pods of the pod's namespace its selector
matches, counted per domain (value of the topology key) over the nodes that carry every such
constraint's key and pass its inclusion policies (``nodeAffinityPolicy: Honor``: the pod's
``nodeSelector`` and required node affinity; ``nodeTaintsPolicy: Honor``: no ``NoSchedule`` or
``NoExecute`` taint it does not tolerate). Every pod on a node counts, Tessera's or not; the
counts per node come from the index (``ClusterIndex.pod_counts``), kept current as pods come
and go. The global minimum is the smallest domain's count, or 0 while fewer domains than
``minDomains`` exist.

Filter: a node without the topology key is refused (unresolvable); a node where the domain's
count, plus one when the pod matches its own selector, less the minimum exceeds ``maxSkew``
is refused (``node(s) didn't match pod topology spread constraints``; pods leaving can help).

Score, for ``ScheduleAnyway`` constraints: each feasible node with every key gets, per
constraint, its domain's count weighted by ``log(domains + 2)`` plus ``maxSkew - 1``; fewer is
better, normalised over the feasible nodes as kube-scheduler does; weight 2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from services.placer.core.facts import PodFacts
from services.placer.core.framework import NodeCheck, Refusal
from services.placer.core.index import ClusterIndex
from services.placer.core.model import NodeState
from shared.messages.constraints import Constraints, SpreadConstraint
from shared.selectors import required_affinity_matches, selector_matches, untolerated

NAME = "PodTopologySpread"
NOT_MATCHED = "node(s) didn't match pod topology spread constraints"
MISSING_LABEL = f"{NOT_MATCHED} (missing required label)"
HOSTNAME = "kubernetes.io/hostname"
HARD_TAINTS = frozenset({"NoSchedule", "NoExecute"})
SKEWED = Refusal(reason=NOT_MATCHED, unresolvable=False, stage="after_fit")
UNLABELLED = Refusal(reason=MISSING_LABEL, unresolvable=True, stage="after_fit")


def _included(spread: SpreadConstraint, constraints: Constraints, node: NodeState) -> bool:
    """Whether ``node`` counts for ``spread`` under its inclusion policies."""
    if spread.node_affinity_policy == "Honor" and not required_affinity_matches(
        constraints, node.name, node.labels
    ):
        return False
    return not (
        spread.node_taints_policy == "Honor"
        and untolerated(node.taints, constraints.tolerations, HARD_TAINTS) is not None
    )


Eligible = list[tuple[str, str]]
"""(node, its value of a constraint's topology key) for each node a constraint counts."""


def _eligible(
    cluster: ClusterIndex, constraints: Constraints, spreads: Sequence[SpreadConstraint]
) -> list[Eligible]:
    """For each of ``spreads``, the nodes it counts: those with every one of ``spreads``' keys
    that pass its inclusion policies. Labels and taints alone decide, so it is kept in the
    index's node cache until one changes."""
    affinity = constraints.node_affinity
    key = (
        NAME,
        tuple((s.topology_key, s.node_affinity_policy, s.node_taints_policy) for s in spreads),
        constraints.node_selector,
        affinity.required if affinity is not None else None,
        constraints.tolerations,
    )
    found = cluster.node_cache.get(key)
    if found is None:
        keys = [s.topology_key for s in spreads]
        built: list[Eligible] = [[] for _ in spreads]
        for node in cluster:
            labels = node.labels
            if not all(k in labels for k in keys):
                continue
            for i, spread in enumerate(spreads):
                if _included(spread, constraints, node):
                    built[i].append((node.name, labels[spread.topology_key]))
        found = cluster.node_cache[key] = built
    return found  # type: ignore[return-value]  # stored just above


class _Hard:
    """One ``DoNotSchedule`` constraint's PreFilter state."""

    __slots__ = ("domains", "minimum", "own", "spread")

    def __init__(self, spread: SpreadConstraint, own: int) -> None:
        self.spread = spread
        self.own = own
        self.domains: dict[str, int] = {}
        self.minimum = 0


class SpreadCheck(NodeCheck):
    stage = "after_fit"

    def __init__(self, pod: PodFacts, cluster: ClusterIndex, constraints: Constraints) -> None:
        request = pod.request
        labels = dict(request.labels)
        self._cluster = cluster
        self._constraints = constraints
        self._namespace = frozenset({request.namespace})
        hard = [s for s in constraints.spread if s.when_unsatisfiable == "DoNotSchedule"]
        self._soft = [s for s in constraints.spread if s.when_unsatisfiable == "ScheduleAnyway"]
        self.scores = bool(self._soft)
        self._hard = [_Hard(s, 1 if selector_matches(s.selector, labels) else 0) for s in hard]
        for state, eligible in zip(self._hard, _eligible(cluster, constraints, hard), strict=True):
            counts = self._counts(state.spread)
            domains = state.domains
            for name, value in eligible:
                domains[value] = domains.get(value, 0) + counts.get(name, 0)
            if len(domains) >= state.spread.min_domains:
                state.minimum = min(domains.values())

    def _counts(self, spread: SpreadConstraint) -> dict[str, int]:
        return self._cluster.pod_counts(((self._namespace, spread.selector),))

    def refused(self) -> None:
        return None

    def refuse(self, node: NodeState) -> Refusal | None:
        for state in self._hard:
            value = node.labels.get(state.spread.topology_key)
            if value is None:
                return UNLABELLED
            skew = state.domains.get(value, 0) + state.own - state.minimum
            if skew > state.spread.max_skew:
                return SKEWED
        return None

    def score(self, nodes: Sequence[NodeState]) -> list[float]:
        soft = self._soft
        keys = [s.topology_key for s in soft]
        scored = [all(k in n.labels for k in keys) for n in nodes]
        per_domain: list[dict[str, int]] = []
        weights: list[float] = []
        for spread in soft:
            if spread.topology_key == HOSTNAME:
                per_domain.append({})
                weights.append(math.log(sum(scored) + 2))
                continue
            values = {
                n.labels[spread.topology_key] for n, ok in zip(nodes, scored, strict=True) if ok
            }
            per_domain.append(dict.fromkeys(values, 0))
            weights.append(math.log(len(values) + 2))
        counts = [self._counts(s) for s in soft]
        eligible = _eligible(self._cluster, self._constraints, soft)
        for i, spread in enumerate(soft):
            if spread.topology_key == HOSTNAME:
                continue
            domains = per_domain[i]
            for name, value in eligible[i]:
                if value in domains:
                    domains[value] += counts[i].get(name, 0)
        raw: list[int] = []
        for node, ok in zip(nodes, scored, strict=True):
            if not ok:
                raw.append(-1)
                continue
            total = 0.0
            for i, spread in enumerate(soft):
                value = node.labels[spread.topology_key]
                if spread.topology_key == HOSTNAME:
                    count = counts[i].get(node.name, 0)
                else:
                    count = per_domain[i][value]
                total += count * weights[i] + (spread.max_skew - 1)
            raw.append(math.floor(total + 0.5))
        return _normalize(raw)


def _normalize(raw: list[int]) -> list[float]:
    """kube-scheduler's ``PodTopologySpread`` normalisation: fewer matching pods is better;
    -1 marks a node without every topology key (0)."""
    valid = [s for s in raw if s >= 0]
    if not valid:
        return [0.0] * len(raw)
    low, high = min(valid), max(valid)
    out: list[float] = []
    for s in raw:
        if s < 0:
            out.append(0.0)
        elif high == 0:
            out.append(100.0)
        else:
            out.append(float(100 * (high + low - s) // high))
    return out


class TopologySpreadRule:
    name = NAME
    weight = 2.0

    def check(self, pod: PodFacts, cluster: ClusterIndex) -> NodeCheck | None:
        constraints = pod.request.constraints
        if constraints is None or not constraints.spread:
            return None
        return SpreadCheck(pod, cluster, constraints)
