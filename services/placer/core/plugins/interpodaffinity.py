"""``InterPodAffinity``: ``spec.affinity.podAffinity`` and ``podAntiAffinity``, the pod's own and
those of the pods already placed, as kube-scheduler's plugin of that name.

PreFilter, over every pod on every node (Tessera's or not; per node from the index's counts):

- the domains (topology key and value) holding pods that match *all* the pod's required
  affinity terms, per term's key;
- the domains holding pods that match one of its required anti-affinity terms;
- the domains of existing pods whose required anti-affinity terms match the pod (the index
  keeps the nodes holding pods with terms, so a pod without terms of its own looks only at
  those).

Filter, in kube-scheduler's order and words: a node without a required term's key, or whose
domain holds no pod matching the affinity, is refused (``node(s) didn't match pod affinity
rules``, unresolvable), unless no pod anywhere matches and the pod matches its own terms (the
first pod of a group that wants to be together); a node in a domain holding a pod its
anti-affinity matches is refused (``node(s) didn't match pod anti-affinity rules``); a node in a
domain where an existing pod's anti-affinity matches the pod is refused (``node(s) didn't
satisfy existing pods anti-affinity rules``). Score: per domain, the weights of the pod's
preferred terms its pods match (affinity up, anti-affinity down), of existing pods' required
affinity terms (weight 1) and preferred terms matching the pod; min-max normalised over the
feasible nodes (all 0 when they are all equal), weight 2.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from services.placer.core.facts import PodFacts
from services.placer.core.framework import NodeCheck, Refusal
from services.placer.core.index import ClusterIndex, PodSelector
from services.placer.core.model import NodeState
from shared.messages.constraints import PodAffinity, PodAffinityTerm, WeightedPodAffinityTerm
from shared.selectors import term_matches_pod

NAME = "InterPodAffinity"
AFFINITY_NOT_MATCHED = "node(s) didn't match pod affinity rules"
ANTI_AFFINITY_NOT_MATCHED = "node(s) didn't match pod anti-affinity rules"
EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"
HARD_POD_AFFINITY_WEIGHT = 1
"""kube-scheduler's ``hardPodAffinityWeight`` default: what an existing pod's required affinity
term matching the pod adds to its domain's score."""

NO_AFFINITY = Refusal(reason=AFFINITY_NOT_MATCHED, unresolvable=True, stage="after_fit")
ANTI = Refusal(reason=ANTI_AFFINITY_NOT_MATCHED, unresolvable=False, stage="after_fit")
EXISTING = Refusal(reason=EXISTING_ANTI_AFFINITY, unresolvable=False, stage="after_fit")

Domain = tuple[str, str]
"""(topology key, value)."""


def selector_of(terms: Iterable[PodAffinityTerm]) -> PodSelector:
    """The index's pod selector for pods matching every one of ``terms``."""
    return tuple((None if t.all_namespaces else frozenset(t.namespaces), t.selector) for t in terms)


def _add(counts: dict[Domain, int], node: NodeState, key: str, amount: int) -> None:
    value = node.labels.get(key)
    if value is not None and amount:
        domain = (key, value)
        counts[domain] = counts.get(domain, 0) + amount


class AffinityCheck(NodeCheck):
    stage = "after_fit"

    def __init__(
        self,
        affinity: PodAffinity | None,
        anti: PodAffinity | None,
        own: bool,
        counts: tuple[dict[Domain, int], dict[Domain, int], dict[Domain, int]],
        scores: dict[Domain, int],
        cluster: ClusterIndex,
    ) -> None:
        self._required = affinity.required if affinity is not None else ()
        self._anti = anti.required if anti is not None else ()
        self._own = own
        self._affinity, self._anti_counts, self._existing = counts
        self._topology = scores
        self._cluster = cluster
        self.scores = bool(scores)

    def refused(self) -> Mapping[str, Refusal] | None:
        if self._required or self._anti:
            return None
        found: dict[str, Refusal] = {}
        for (key, value), count in self._existing.items():
            if count > 0:
                found.update(dict.fromkeys(self._cluster.with_label(key, value), EXISTING))
        return found

    def refuse(self, node: NodeState) -> Refusal | None:
        labels = node.labels
        if self._required:
            together = True
            for term in self._required:
                value = labels.get(term.topology_key)
                if value is None:
                    return NO_AFFINITY
                if self._affinity.get((term.topology_key, value), 0) <= 0:
                    together = False
            if not together and (self._affinity or not self._own):
                return NO_AFFINITY
        if self._anti_counts:
            for term in self._anti:
                value = labels.get(term.topology_key)
                if value is not None and self._anti_counts.get((term.topology_key, value), 0) > 0:
                    return ANTI
        if self._existing:
            for pair in labels.items():
                if self._existing.get(pair, 0) > 0:
                    return EXISTING
        return None

    def score(self, nodes: Sequence[NodeState]) -> list[float]:
        keys = {key for key, _ in self._topology}
        raw = [
            sum(self._topology.get((k, n.labels[k]), 0) for k in keys if k in n.labels)
            for n in nodes
        ]
        high, low = max(raw), min(raw)
        spread = high - low
        if spread <= 0:
            return [0.0] * len(nodes)
        return [float(int(100 * (s - low) / spread)) for s in raw]


class InterPodAffinityRule:
    name = NAME
    weight = 2.0

    def check(self, pod: PodFacts, cluster: ClusterIndex) -> NodeCheck | None:
        request = pod.request
        constraints = request.constraints
        affinity = constraints.pod_affinity if constraints is not None else None
        anti = constraints.pod_anti_affinity if constraints is not None else None
        if affinity is None and anti is None and not cluster.term_pods:
            return None
        namespace, labels = request.namespace, dict(request.labels)
        existing: dict[Domain, int] = {}
        scores: dict[Domain, int] = {}
        for name, pods in cluster.term_pods.items():
            node = cluster.node(name)
            for other in pods:
                if other.anti_affinity is not None:
                    for term in other.anti_affinity.required:
                        if term_matches_pod(term, namespace, labels):
                            _add(existing, node, term.topology_key, 1)
                    for weighted in other.anti_affinity.preferred:
                        if term_matches_pod(weighted.term, namespace, labels):
                            _add(scores, node, weighted.term.topology_key, -weighted.weight)
                if other.affinity is not None:
                    for term in other.affinity.required:
                        if term_matches_pod(term, namespace, labels):
                            _add(scores, node, term.topology_key, HARD_POD_AFFINITY_WEIGHT)
                    for weighted in other.affinity.preferred:
                        if term_matches_pod(weighted.term, namespace, labels):
                            _add(scores, node, weighted.term.topology_key, weighted.weight)
        together: dict[Domain, int] = {}
        apart: dict[Domain, int] = {}
        own = False
        if affinity is not None and affinity.required:
            own = all(term_matches_pod(t, namespace, labels) for t in affinity.required)
            for name, count in cluster.pod_counts(selector_of(affinity.required)).items():
                node = cluster.node(name)
                for term in affinity.required:
                    _add(together, node, term.topology_key, count)
        if anti is not None:
            for term in anti.required:
                for name, count in cluster.pod_counts(selector_of((term,))).items():
                    _add(apart, cluster.node(name), term.topology_key, count)
        _preferred(cluster, affinity.preferred if affinity is not None else (), scores, +1)
        _preferred(cluster, anti.preferred if anti is not None else (), scores, -1)
        scores = {domain: value for domain, value in scores.items() if value}
        required = (affinity is not None and affinity.required) or (
            anti is not None and anti.required
        )
        if not required and not existing and not scores:
            return None
        return AffinityCheck(affinity, anti, own, (together, apart, existing), scores, cluster)


def _preferred(
    cluster: ClusterIndex,
    terms: Iterable[WeightedPodAffinityTerm],
    scores: dict[Domain, int],
    sign: int,
) -> None:
    """Add each preferred term's weight (times ``sign``) once per pod it matches to the domain
    the pod is in."""
    for weighted in terms:
        term = weighted.term
        for name, count in cluster.pod_counts(selector_of((term,))).items():
            _add(scores, cluster.node(name), term.topology_key, sign * weighted.weight * count)
