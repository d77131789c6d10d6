"""Node-aware rules: what a pod asks of particular nodes, and of the pods on them.

Filters and scores (``framework.py``) judge node *shapes*, which have no name, labels or pods:
that is what lets the framework judge 10,000 nodes by their few hundred shapes. Kubernetes'
scheduling constraints are about particular nodes (``nodeSelector``, node affinity, taints) and
the pods on them (pod affinity and anti-affinity, topology spread), so they are rules of their
own, named in ``profiles.py`` (:data:`~.profiles.NODE_RULES`) beside the scores, run as
kube-scheduler runs them:

1. **PreFilter**: once per pod and index, a rule's :meth:`NodeRule.check` works out what it needs
   (the nodes a ``nodeSelector`` leaves, from the index's labels; the pods matching a selector
   per topology domain, from the index's counts) or says it has nothing to do (None). A rule
   may narrow the candidate nodes (:attr:`NodeCheck.candidates`, kube-scheduler's
   ``PreFilterResult.NodeNames``): the nodes it leaves out are not judged for a decision, and
   get the reason kube-scheduler's filter order gives them only when a rejection or a verdict
   asks.
2. **Filter**, node by node: :meth:`NodeCheck.refuse` gives a :class:`Refusal` with its reason,
   worded as kube-scheduler words it, and whether it is unresolvable (no pod leaving the node
   can help: kube-scheduler's ``UnschedulableAndUnresolvable``, which the extender passes on).
   Rules of the ``before_fit`` stage (taints, node affinity) come before the shape's own
   filters in the reasons a node gets, those of ``after_fit`` (spread, pod affinity) after,
   kube-scheduler's order.
3. **Score**: a rule that scores normalises its scores over the feasible nodes (0..100, as its
   kube-scheduler plugin does) and they count with the rule's weight beside the profile's own.

A pod the rules have nothing to say about is ranked as before, shape by shape (``ranking.py``):
the shape memo's speed. When the rules only keep a few nodes out (tainted nodes, the domains of
an existing pod's anti-affinity) it is still ranked by shape, those nodes avoided
(:class:`SparseRanking`); otherwise node by node over the candidates (:class:`NodeRanking`),
each node's shape judged from the same memo.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable, Sequence
from typing import Protocol

from services.placer.core.facts import PodFacts
from services.placer.core.framework import (
    AVOIDED,
    Judgement,
    NodeCheck,
    NodeRule,
    Profile,
    Refusal,
    rng_for,
)
from services.placer.core.index import ClusterIndex
from services.placer.core.model import Decision, Rejection, RejectionReason
from services.placer.core.plugins.fit import CAPACITY_REASONS, NODE_UNSCHEDULABLE
from services.placer.core.ranking import Ranking, decision_on, judge_together


class Ranker(Protocol):
    """One pod's nodes ranked on one index: chooses under any set of nodes to avoid."""

    def node(self, *, avoid: Collection[str] = ()) -> str | None: ...

    def pick(
        self, *, now: float, rng: random.Random | None = None, avoid: Collection[str] = ()
    ) -> Decision | Rejection: ...


Checks = list[tuple[NodeRule, NodeCheck]]


def checks_for(pod: PodFacts, cluster: ClusterIndex, profile: Profile) -> Checks:
    """The PreFilters of the profile's node-aware rules that have something to do for ``pod``."""
    found: Checks = []
    for rule in profile.node_rules:
        check = rule.check(pod, cluster)
        if check is not None:
            found.append((rule, check))
    return found


def rank(pod: PodFacts, cluster: ClusterIndex, profile: Profile) -> Ranker:
    """``pod``'s nodes on ``cluster`` ranked as the profile and its node-aware rules say (the
    module docstring says which way)."""
    checks = checks_for(pod, cluster, profile)
    if not checks:
        return Ranking(pod, cluster, profile)
    kept: dict[str, Refusal] = {}
    for _, check in checks:
        refused = check.refused() if check.candidates is None and not check.scores else None
        if refused is None:
            return NodeRanking(pod, cluster, profile, checks)
        for name, refusal in refused.items():
            kept.setdefault(name, refusal)
    if not kept:
        return Ranking(pod, cluster, profile)
    return SparseRanking(pod, cluster, profile, kept)


def default_normalize(scores: Sequence[int], *, reverse: bool) -> list[float]:
    """kube-scheduler's ``DefaultNormalizeScore``: each score as a share of the highest, in
    whole points of 0..100 (``reverse``: 100 minus that); all 0 (100 reversed) when the highest
    is 0."""
    top = max(scores, default=0)
    if top <= 0:
        return [100.0 if reverse else 0.0] * len(scores)
    shares = [100 * s // top for s in scores]
    return [float(100 - s if reverse else s) for s in shares]


def _first(refusals: Iterable[Refusal | None]) -> Refusal | None:
    return next((r for r in refusals if r is not None), None)


def reason_of(judgement: Judgement, refusal: Refusal | None) -> str | Refusal | None:
    """What a node gets: its shape's reason or a rule's, in kube-scheduler's order (a node not
    schedulable first, then the rules before the fit, the fit, the rules after it); None when
    it fits."""
    if isinstance(judgement, str):
        if judgement == NODE_UNSCHEDULABLE:
            return judgement
        return refusal if refusal is not None and refusal.stage == "before_fit" else judgement
    return refusal


def _text(reason: str | Refusal) -> str:
    return reason if isinstance(reason, str) else reason.reason


def unresolvable(reason: str | Refusal) -> bool:
    """Whether no pod leaving the node can make it fit (kube-scheduler's preemption cannot)."""
    if isinstance(reason, Refusal):
        return reason.unresolvable
    return reason not in CAPACITY_REASONS


def _rejection(pod: PodFacts, counts: dict[str, int], now: float) -> Rejection:
    reasons = tuple(
        RejectionReason(reason=reason, nodes=n)
        for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        if n
    )
    return Rejection(pod_uid=pod.request.uid, reasons=reasons, decided_at=now)


class SparseRanking:
    """A pod ranked shape by shape with a few nodes kept out by the rules (their reasons
    counted as theirs): the shape memo's speed for a pod on a cluster with a tainted node."""

    def __init__(
        self, pod: PodFacts, cluster: ClusterIndex, profile: Profile, kept: dict[str, Refusal]
    ) -> None:
        self._pod = pod
        self._cluster = cluster
        self._kept = kept
        self._out = frozenset(kept)
        self._ranking = Ranking(pod, cluster, profile)

    def _avoid(self, avoid: Collection[str]) -> frozenset[str]:
        return self._out.union(avoid) if avoid else self._out

    def node(self, *, avoid: Collection[str] = ()) -> str | None:
        return self._ranking.node(avoid=self._avoid(avoid))

    def pick(
        self, *, now: float, rng: random.Random | None = None, avoid: Collection[str] = ()
    ) -> Decision | Rejection:
        outcome = self._ranking.pick(now=now, rng=rng, avoid=self._avoid(avoid))
        if isinstance(outcome, Decision):
            return outcome
        cluster, memo = self._cluster, self._ranking.memo
        counts: dict[str, int] = {}
        for sid, ranks in cluster.groups.items():
            judged = memo[sid]
            reason = judged if isinstance(judged, str) else AVOIDED
            counts[reason] = counts.get(reason, 0) + len(ranks)
        for name, refusal in self._kept.items():
            held = cluster.shape_id_or_none(name)
            if held is None:
                continue
            judged = memo[held]
            before = judged if isinstance(judged, str) else AVOIDED
            after = reason_of(judged, refusal) or AVOIDED
            counts[before] -= 1
            counts[_text(after)] = counts.get(_text(after), 0) + 1
        return _rejection(self._pod, counts, now)


class NodeRanking:
    """A pod ranked node by node over the rules' candidates: each node's shape judged from the
    shared memo, the rules' filters and scores applied to the node itself."""

    def __init__(self, pod: PodFacts, cluster: ClusterIndex, profile: Profile, checks: Checks):
        self._pod = pod
        self._cluster = cluster
        self._profile = profile
        self._checks = checks
        self._memo = memo = profile.judged(cluster, pod.request.shape_key())
        names: frozenset[str] | None = None
        for _, check in checks:
            if check.candidates is not None:
                names = check.candidates if names is None else names & check.candidates
        by_rank = cluster.names_by_rank
        if names is None:
            ranks: Sequence[int] = range(len(cluster))
        else:
            ranks = sorted(cluster.rank_of(n) for n in names if n in cluster)
        shape_id_of = cluster.shape_id_of
        shape_of = [shape_id_of(by_rank[r]) for r in ranks]
        judge_together(pod, cluster, profile, memo, shape_of)
        self.reasons: dict[int, str | Refusal] = {}
        """Candidate rank -> why it does not fit."""
        feasible: list[int] = []
        judgements: list[Judgement] = []
        added = 0
        every = [c for _, c in checks]
        before = [c for c in every if c.stage == "before_fit"]
        node_of = cluster.node
        # The hot loop of a pod with constraints (once per candidate node): _reason inlined.
        for rank, sid in zip(ranks, shape_of, strict=True):
            judged = memo.get(sid)
            if judged is None:
                judged = memo[sid] = profile.judge(pod, cluster.shapes[sid])
                added += 1
            if judged.__class__ is str and judged == NODE_UNSCHEDULABLE:
                self.reasons[rank] = judged  # a shape's reason
                continue
            node = node_of(by_rank[rank])
            refusal = None
            # A shape that does not fit gives its own reason unless a rule before the fit
            # refuses: the rules after it need not be asked.
            for check in before if judged.__class__ is str else every:
                refusal = check.refuse(node)
                if refusal is not None:
                    break
            reason = reason_of(judged, refusal)
            if reason is None:
                feasible.append(rank)
                judgements.append(judged)
            else:
                self.reasons[rank] = reason
        cluster.memo_size += added
        self._totals = self._score(feasible, judgements, checks)
        self._order: list[int] | None = None

    def _reason(self, rank: int, judged: Judgement) -> str | Refusal | None:
        """Why the node at ``rank``, whose shape was judged ``judged``, does not fit (None: it
        does): the reasons in kube-scheduler's filter order."""
        node = self._cluster.node(self._cluster.name_at(rank))
        return reason_of(judged, _first(c.refuse(node) for _, c in self._checks))

    def _outside(self, rank: int) -> str | Refusal:
        """Why a node the rules' PreFilter left out does not fit: the reason it would get were
        it judged (a taint before the selector, as kube-scheduler filters), judged only when a
        rejection or a verdict asks."""
        cluster, memo = self._cluster, self._memo
        sid = cluster.shape_id_of(cluster.name_at(rank))
        judged = memo.get(sid)
        if judged is None:
            judged = memo[sid] = self._profile.judge(self._pod, cluster.shapes[sid])
            cluster.memo_size += 1
        reason = self._reason(rank, judged)
        assert reason is not None, "a node outside the candidates fits"
        return reason

    def _score(
        self, feasible: list[int], judgements: list[Judgement], checks: Checks
    ) -> dict[int, tuple[float, dict[str, float]]]:
        """Each feasible rank's total and the rules' weighted scores."""
        cluster, profile = self._cluster, self._profile
        if profile.normalizing:
            sids = [cluster.shape_id_of(cluster.name_at(r)) for r in feasible]
            distinct = list(dict.fromkeys(sids))
            rows = {sid: judgements[sids.index(sid)] for sid in distinct}
            by_sid = dict(
                zip(distinct, profile.totals([rows[s] for s in distinct]), strict=True)  # type: ignore[misc]
            )
            base = [by_sid[sid] for sid in sids]
        else:
            base = [float(j) for j in judgements]  # type: ignore[arg-type]
        scoring = [(rule, check) for rule, check in checks if check.scores]
        if not scoring or not feasible:
            none: dict[str, float] = {}
            return {rank: (base[i], none) for i, rank in enumerate(feasible)}
        extra: list[dict[str, float]] = [{} for _ in feasible]
        nodes = [cluster.node(cluster.name_at(r)) for r in feasible]
        for rule, check in scoring:
            for i, value in enumerate(check.score(nodes)):
                extra[i][rule.name] = rule.weight * value
        return {
            rank: (base[i] + sum(extra[i].values()), extra[i]) for i, rank in enumerate(feasible)
        }

    # -- choosing --------------------------------------------------------------------------------

    def _ordered(self) -> list[int]:
        """Feasible ranks, best total first (then the tie-break rank); a NaN total last. Sorted
        only once a pick finds the best avoided (most picks take it)."""
        if self._order is None:
            self._order = [rank for _, rank in sorted(self._keys())]
        return self._order

    def _keys(self) -> list[tuple[float, int]]:
        """(minus the total, rank) of each feasible rank: the smallest is the best (a NaN
        total ranks after every other)."""
        inf = float("inf")
        return [(-t if t == t else inf, rank) for rank, (t, _) in self._totals.items()]

    def _choose(
        self, avoid: Collection[str], rng: random.Random | None
    ) -> tuple[int, random.Random | None] | None:
        cluster = self._cluster
        excluded = cluster.ranks_of(frozenset(avoid)) if avoid else frozenset()
        if not self._totals:
            return None
        random_tie = self._profile.tie_break == "random"
        if not random_tie and self._order is None:
            best = min(self._keys())[1]
            if best not in excluded:
                return best, rng
        usable = [r for r in self._ordered() if r not in excluded]
        if not usable:
            return None
        if not random_tie:
            return usable[0], rng
        best_total = self._totals[usable[0]][0]
        tied = sorted(r for r in usable if self._totals[r][0] == best_total)
        rng = rng or rng_for(self._pod.request)
        return tied[rng.randrange(len(tied))], rng

    def node(self, *, avoid: Collection[str] = ()) -> str | None:
        chosen = self._choose(avoid, None)
        return None if chosen is None else self._cluster.name_at(chosen[0])

    def pick(
        self, *, now: float, rng: random.Random | None = None, avoid: Collection[str] = ()
    ) -> Decision | Rejection:
        pod, cluster, profile = self._pod, self._cluster, self._profile
        chosen = self._choose(avoid, rng)
        if chosen is None:
            return self._rejection(avoid, now)
        rank, rng = chosen
        total, extra = self._totals[rank]
        excluded = cluster.ranks_of(frozenset(avoid)) if avoid else frozenset()
        feasible = len(self._totals) - sum(1 for r in excluded if r in self._totals)
        return decision_on(pod, cluster, profile, rank, total, extra, feasible, rng, now=now)

    def _rejection(self, avoid: Collection[str], now: float) -> Rejection:
        counts: dict[str, int] = {}
        for rank in range(len(self._cluster)):
            if rank in self._totals:
                continue
            reason = self.reasons.get(rank)
            text = _text(reason if reason is not None else self._outside(rank))
            counts[text] = counts.get(text, 0) + 1
        if self._totals:
            counts[AVOIDED] = counts.get(AVOIDED, 0) + len(self._totals)
        return _rejection(self._pod, counts, now)

    # -- answering about nodes -------------------------------------------------------------------

    def verdict(self, name: str) -> tuple[str | Refusal | None, float, dict[str, float]]:
        """Why node ``name`` does not fit (None: it does), and else its total and the rules'
        weighted scores. ``name`` must be in the index."""
        rank = self._cluster.rank_of(name)
        found = self._totals.get(rank)
        if found is not None:
            return None, found[0], found[1]
        reason = self.reasons.get(rank)
        return reason if reason is not None else self._outside(rank), 0.0, {}


Verdict = tuple[str | Refusal | None, float, dict[str, float]]
"""Why a node does not fit (None: it does); else its total and the node rules' weighted
scores."""


def verdicts(
    pod: PodFacts, cluster: ClusterIndex, profile: Profile, names: Iterable[str]
) -> dict[str, Verdict] | None:
    """Each of ``names`` (nodes of ``cluster``) judged for ``pod`` with the node-aware rules as a
    decision would; None when the rules have nothing to say (the shapes alone answer)."""
    checks = checks_for(pod, cluster, profile)
    if not checks:
        return None
    ranking = NodeRanking(pod, cluster, profile, checks)
    return {name: ranking.verdict(name) for name in names}
