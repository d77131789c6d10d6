"""Deciding one pod on the current :class:`~.state.ClusterView` (pure: no I/O, time passed in).

:func:`decide` runs the placement cycle for a pod (``core/cycle.py``: validation, the tenancy's
group choice and quota, the profile) on the view, and when nothing fits says how the pod should
wait:

- an **invalid** request is final: rejected as unresolvable and never tried again;
- a pod **too large for every node** (or refused by the tenancy config: unknown group, no
  permission) is rejected as unresolvable but kept, and tried again only when the largest node
  shapes or the tenancy config change (``wake="grown"``);
- a pod whose place depends on the pods already placed (pod affinity, anti-affinity, topology
  spread) waits for that too: a pod placed anywhere may let it fit (``wake="placed"``);
- any other pod waits for capacity to be given back or a node's labels or taints to change
  (``wake="freed"``).

The same view serves the scheduler extender (issue 14): :func:`decide_on` places a pod on the one
node kube-scheduler chose, and :func:`verdicts` is filter and prioritize over a list of nodes:
the same cycle's steps before any node is looked at (``cycle.prepare``), then each node's
judgement from the memo decisions select from, and the node-aware rules (``core/nodeaware.py``)
judged among every node, those that count pods included. All go through the same profile,
tenancy and, in the shell, the same commit.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Final, Literal, cast

import msgspec

from services.placer.core import cycle, nodeaware, ranking
from services.placer.core.facts import PodFacts, pod_facts
from services.placer.core.framework import Profile
from services.placer.core.index import ClusterIndex
from services.placer.core.model import Decision, PodRequest, Rejection, RejectionReason
from services.placer.core.plugins import deviceselectors
from services.placer.core.plugins.fit import CAPACITY_REASONS
from services.placer.rules import translate
from services.placer.rules.state import ClusterView

Wake = Literal["freed", "grown", "placed"]

UNKNOWN_NODE = "no Tessera node facts or GPU inventory"
"""Why a node the placer has never heard of does not fit (kube-scheduler may name any node)."""


GATE_TRIES: Final = 4
"""How many nodes a decision tries, in the profile's order, for one where the pod would not wait
at the binder's gate, before it spreads over queues (:data:`QUEUE_SPREAD`)."""

QUEUE_SPREAD: Final = (2, 8)
"""Queue lengths on a node (pods between decision and Allocate) from which a decision looks for
room on other nodes first, level by level. The binder's gate lets one pod per device count onto
a node at a time (bind -> Allocate takes about 0.25 s), so a burst packed onto one node at a
time is placed at one node's pace; spread, every node that fits takes its share (issue 22)."""


@dataclass(frozen=True)
class Waiting:
    """A pod that did not fit, with the reasons to publish and how it waits."""

    rejection: Rejection
    final: bool
    """Invalid: never tried again."""
    wake: Wake


def decide(
    view: ClusterView,
    profile: Profile,
    pod: PodRequest,
    *,
    now: float,
    avoid: Collection[str] = (),
    spread: bool = True,
) -> Decision | Waiting:
    """Place ``pod`` on the view's cluster (nothing is booked), or say how it waits.

    ``avoid``: nodes where this pod's commit just lost to another replica's; they are chosen
    only when nothing else fits (then the pod is decided as if none were avoided).

    Unless ``spread`` is off (the placer's ``--no-burst-spread``), a decision where the pod would
    wait at the binder's gate (``view.waits_at_gate``: a pod queued there between decision and
    Allocate has as many devices on other slices) is made again without that node, up to
    :data:`GATE_TRIES` nodes in the profile's order; then the burst is spread over queues
    (:data:`QUEUE_SPREAD`): nodes with a queue of pods between decision and Allocate
    (``view.queued_nodes``) are chosen only when no node with a shorter queue fits. A
    burst of identical pods so stacks up on the GPUs the profile chooses, which pass the gate
    together, and moves to another node only when the next GPU would wait. In steady state
    queues are empty and the profile alone chooses.

    With node pools, the pod is decided on this replica's own nodes first, and on every node
    only when it fits on none of them (``state.py``, "Node pools"); a pod whose place depends
    on the pods already placed (``PodRequest.counts_pods``) is decided on every node at once,
    since its topology domains span the pools.
    """
    facts = pod_facts(pod)
    if facts.invalid:
        outcome = cycle.decide(pod, view.index, profile, view.tenancy, now=now)
        if isinstance(outcome, Decision):
            return outcome
        return Waiting(rejection=outcome, final=True, wake="grown")
    avoided = frozenset(avoid)
    everywhere_first = view.pools > 1 and pod.counts_pods
    index, kept_out = _servable(view, pod, view.everywhere() if everywhere_first else view.index)
    placed = _decide_in(view, profile, pod, index, avoided, spread, now=now)
    if isinstance(placed, Decision):
        return placed
    if view.pools > 1 and not everywhere_first:
        index, kept_out = _servable(view, pod, view.everywhere())
        placed = _decide_in(view, profile, pod, index, avoided, spread, now=now)
        if isinstance(placed, Decision):
            return placed
    outcome = placed
    too_large = view.too_large(facts)
    if too_large:
        rejection = Rejection(
            pod_uid=pod.uid,
            reasons=(RejectionReason(reason=too_large, nodes=len(view.everywhere())),),
            unresolvable=True,
            decided_at=now,
        )
        return Waiting(rejection=rejection, final=False, wake="grown")
    reasons = translate.refine_reasons(
        (*outcome.reasons, *_kept_out_reason(kept_out)), view.unplaceable()
    )
    if pod.gpu_selectors:
        shapes = view.everywhere().shapes
        models = {m for found in {s.models for s in shapes} for m in found}
        reasons = deviceselectors.name_model_selectors(reasons, pod.gpu_selectors, models)
    rejection = translate.rejection_of(outcome, reasons)
    wake: Wake = "grown" if outcome.unresolvable else "placed" if pod.counts_pods else "freed"
    return Waiting(rejection=rejection, final=False, wake=wake)


def _decide_in(
    view: ClusterView,
    profile: Profile,
    pod: PodRequest,
    index: ClusterIndex,
    avoided: frozenset[str],
    spread: bool,
    *,
    now: float,
) -> Decision | Rejection:
    """``decide`` on the nodes of ``index``: where the pod would not wait at the binder's gate
    first, then spread over queues, then the nodes avoided."""
    ranked = cycle.rank(pod, index, profile, view.tenancy, now=now)
    if isinstance(ranked, Rejection):
        return ranked  # refused before any node is looked at: no node can change that
    plain: Decision | Rejection | None = None
    """The profile's own choice (the nodes avoided left out), when a try made it: the fallback."""
    if spread:
        asks = ranked.prepared.facts.asks
        excluded = avoided
        for _ in range(GATE_TRIES):
            node = ranked.node(avoid=excluded)
            if node is None:
                if not excluded:
                    return ranked.decide(now=now)  # it fits nowhere: no spreading makes room
                break
            # The GPUs are chosen only where the gate might let the pod through: most tries of
            # a mixed burst find a node where a pod of another size waits.
            if not view.certainly_waits_at_gate(node, pod.uid, asks):
                attempt = ranked.decide(now=now, avoid=excluded)
                if excluded is avoided:  # the first try: it avoids only ``avoided``
                    plain = attempt
                if not isinstance(attempt, Decision):  # over the tenant's exact quota
                    if not excluded:
                        return attempt
                    break
                if not view.waits_at_gate(attempt.reservation, pod):
                    return attempt
            excluded = excluded | {node}
        tried = {avoided}
        for queue in QUEUE_SPREAD:
            queued = view.queued_nodes(queue)
            excluded = avoided | queued if avoided else queued
            # Counted in this index: with pools, the queues are every pool's but the index
            # holds only this replica's nodes (the index keeps the ranks, the decision asks them
            # anyway).
            if excluded in tried or len(index.ranks_of(excluded)) >= len(index):
                continue  # the same attempt again, or no node left to try
            tried.add(excluded)
            elsewhere = ranked.decide(now=now, avoid=excluded)
            if isinstance(elsewhere, Decision):
                return elsewhere
    outcome = plain if plain is not None else ranked.decide(now=now, avoid=avoided)
    if avoided and not isinstance(outcome, Decision):
        outcome = ranked.decide(now=now)
    return outcome


def _servable(view: ClusterView, pod: PodRequest, index: ClusterIndex) -> tuple[ClusterIndex, int]:
    """The nodes of ``index`` that can serve ``pod``'s containers, and how many were kept out:
    memory-units nodes for a pod with a GPU container asking no ``tessera.dev/gpu-memory``
    (``translate.needs_gpu_devices``). Only such pods, and only on a cluster that has such
    nodes, pay for a narrower index."""
    kept = view.memory_unit_nodes
    if not kept or not translate.needs_gpu_devices(pod):
        return index, 0
    narrower = ClusterIndex(node for node in index if node.name not in kept)
    return narrower, len(index) - len(narrower)


def _without_pod_counting(pod: PodRequest) -> PodRequest:
    """``pod`` without the constraints that count pods (pod affinity, anti-affinity, topology
    spread): for a decision on one node, whose rules were judged among every node already."""
    if not pod.counts_pods or pod.constraints is None:
        return pod
    return msgspec.structs.replace(
        pod,
        constraints=msgspec.structs.replace(
            pod.constraints, pod_affinity=None, pod_anti_affinity=None, spread=()
        ),
    )


def _kept_out_reason(kept_out: int) -> tuple[RejectionReason, ...]:
    if not kept_out:
        return ()
    return (RejectionReason(reason=translate.MEMORY_UNITS_ONLY, nodes=kept_out),)


def decide_on(
    view: ClusterView, profile: Profile, pod: PodRequest, node: str, *, now: float
) -> Decision | Waiting:
    """Place ``pod`` on ``node`` only (the node kube-scheduler chose), or say why not.

    Every constraint of the pod is judged again here, as the extender's filter judged it: the
    node may have changed since (Tessera's own pods placed meanwhile count too). Those about the
    node itself are judged on the node alone; those that count pods over topology domains
    (affinity, anti-affinity, spread) among every node (:func:`verdicts`), before the GPUs are
    chosen on the node alone."""
    everywhere = view.everywhere()
    if node not in everywhere:
        rejection = Rejection(
            pod_uid=pod.uid,
            reasons=(RejectionReason(reason=f"unknown node {node!r}", nodes=1),),
            decided_at=now,
        )
        return Waiting(rejection=rejection, final=False, wake="freed")
    if node in view.memory_unit_nodes and translate.needs_gpu_devices(pod):
        rejection = Rejection(
            pod_uid=pod.uid,
            reasons=_kept_out_reason(1),
            unresolvable=True,
            decided_at=now,
        )
        return Waiting(rejection=rejection, final=False, wake="grown")
    if pod.counts_pods:
        (verdict,) = verdicts(view, profile, pod, [node], detail=False)
        if not verdict.fits:
            rejection = Rejection(
                pod_uid=pod.uid,
                reasons=(RejectionReason(reason=verdict.reason, nodes=1),),
                unresolvable=verdict.unresolvable,
                decided_at=now,
            )
            return Waiting(rejection=rejection, final=bool(pod_facts(pod).invalid), wake="placed")
        pod = _without_pod_counting(pod)
    single = ClusterIndex([everywhere.node(node)])
    outcome = cycle.decide(pod, single, profile, view.tenancy, now=now)
    if isinstance(outcome, Decision):
        return outcome
    why = view.reason(node)
    reasons = translate.refine_reasons(outcome.reasons, {why: 1} if why else {})
    return Waiting(
        rejection=translate.rejection_of(outcome, reasons),
        final=bool(pod_facts(pod).invalid),
        wake="freed",
    )


class NodeVerdict(msgspec.Struct, frozen=True, kw_only=True):
    """One node judged for one pod: the reason it does not fit, or its score."""

    node: str
    fits: bool
    reason: str = ""
    unresolvable: bool = False
    """Does not fit whatever pods leave the node (kube-scheduler's preemption cannot help)."""
    score: float = 0.0
    scores: dict[str, float] = {}


def verdicts(
    view: ClusterView,
    profile: Profile,
    pod: PodRequest,
    nodes: Iterable[str] | None = None,
    *,
    detail: bool = True,
) -> list[NodeVerdict]:
    """Every node of ``nodes`` (default: all) judged for ``pod`` as :func:`decide` would.

    ``score`` is the node's total as a decision compares it, which for a profile with a
    normalising plugin means rescaled over the fitting nodes judged here; with ``detail``,
    ``scores`` has the profile's weighted score of each plugin. Nodes of one shape pass the same
    filters with the same scores, so each shape is judged once, and judgements are kept in the
    profile's memo for equal requests (the extender judges every candidate node on every
    scheduling cycle, for pods that often ask alike).
    """
    index = view.everywhere()
    names = sorted(n.name for n in index) if nodes is None else list(nodes)
    prepared = cycle.prepare(pod, index, profile, view.tenancy, now=0.0)
    if isinstance(prepared, Rejection):  # invalid, refused by the tenancy, over the quota
        why = prepared.reasons[0].reason
        return [
            NodeVerdict(node=n, fits=False, reason=why, unresolvable=prepared.unresolvable)
            for n in names
        ]
    chosen = prepared.profile
    held = [name for name in names if name in index]
    by_node = nodeaware.verdicts(prepared.facts, index, chosen, held)
    if by_node is not None:
        return [
            _node_verdict(view, chosen, prepared.facts, name, by_node, detail) for name in names
        ]
    shape_ids = [index.shape_id_or_none(name) for name in names]
    judged = ranking.judgements(
        prepared.facts, index, chosen, (sid for sid in shape_ids if sid is not None)
    )
    fitting = {sid: score for sid, score in judged.items() if not isinstance(score, str)}
    if chosen.normalizing:
        rows = [cast(tuple[float, ...], raw) for raw in fitting.values()]
        totals = dict(zip(fitting, chosen.totals(rows), strict=True))
    else:
        totals = {sid: cast(float, total) for sid, total in fitting.items()}
    weighted: dict[int, dict[str, float]] = {}  # with detail: each fitting shape's, per plugin
    found: list[NodeVerdict] = []
    kept = view.memory_unit_nodes if translate.needs_gpu_devices(pod) else set()
    for name, shape_id in zip(names, shape_ids, strict=True):
        if name in kept:
            found.append(
                NodeVerdict(
                    node=name, fits=False, reason=translate.MEMORY_UNITS_ONLY, unresolvable=True
                )
            )
            continue
        if shape_id is None:
            found.append(NodeVerdict(node=name, fits=False, reason=UNKNOWN_NODE, unresolvable=True))
            continue
        judgement = judged[shape_id]
        if isinstance(judgement, str):
            reason = judgement
            if reason == translate.UNSCHEDULABLE:
                reason = view.reason(name) or reason
            found.append(
                NodeVerdict(
                    node=name,
                    fits=False,
                    reason=reason,
                    unresolvable=judgement not in CAPACITY_REASONS,
                )
            )
            continue
        if detail and shape_id not in weighted:
            weighted[shape_id] = chosen.weighted(prepared.facts, index.shapes[shape_id])
        found.append(
            NodeVerdict(
                node=name, fits=True, score=totals[shape_id], scores=weighted.get(shape_id, {})
            )
        )
    return found


def _node_verdict(
    view: ClusterView,
    profile: Profile,
    pod: PodFacts,
    name: str,
    by_node: dict[str, nodeaware.Verdict],
    detail: bool,
) -> NodeVerdict:
    """One node's verdict from the node-aware judgement of every node (``verdicts``)."""
    if name in view.memory_unit_nodes and translate.needs_gpu_devices(pod.request):
        return NodeVerdict(
            node=name, fits=False, reason=translate.MEMORY_UNITS_ONLY, unresolvable=True
        )
    found = by_node.get(name)
    if found is None:
        return NodeVerdict(node=name, fits=False, reason=UNKNOWN_NODE, unresolvable=True)
    reason, total, extra = found
    if reason is None:
        scores = {}
        if detail:
            index = view.everywhere()
            scores = {**profile.weighted(pod, index.shape_of(name)), **extra}
        return NodeVerdict(node=name, fits=True, score=total, scores=scores)
    text = reason if isinstance(reason, str) else reason.reason
    if text == translate.UNSCHEDULABLE:
        text = view.reason(name) or text
    return NodeVerdict(
        node=name, fits=False, reason=text, unresolvable=nodeaware.unresolvable(reason)
    )


def unjudged(
    view: ClusterView, profile: Profile, pod: PodRequest, nodes: Iterable[str] | None = None
) -> list[int]:
    """The node shapes (ids) :func:`verdicts` would still have to judge to answer for ``pod``
    over ``nodes`` (default: every node): empty when its answer comes from judgements made
    before (the memo). Judgements are kept by the shape they were made on, so a node whose shape
    changed is one more shape to judge here, never a stale answer."""
    index = view.everywhere()
    prepared = cycle.prepare(pod, index, profile, view.tenancy, now=0.0)
    if isinstance(prepared, Rejection):  # answered without looking at any node
        return []
    memo = prepared.profile.judged(index, prepared.facts.request.shape_key())
    if nodes is None:
        shape_ids: Iterable[int] = index.groups
    else:
        shape_ids = dict.fromkeys(
            sid for sid in map(index.shape_id_or_none, nodes) if sid is not None
        )
    return [sid for sid in shape_ids if sid not in memo]


def judge_shapes(
    view: ClusterView, profile: Profile, pod: PodRequest, shape_ids: Iterable[int]
) -> int:
    """Judge ``pod`` on the shapes ``shape_ids`` (from :func:`unjudged`) into the memo
    :func:`verdicts` answers from, as it would judge them; how many were judged. Shapes no node
    has any more are skipped (the view may have moved on since the ids were listed)."""
    index = view.everywhere()
    prepared = cycle.prepare(pod, index, profile, view.tenancy, now=0.0)
    if isinstance(prepared, Rejection):
        return 0
    current = [sid for sid in shape_ids if sid in index.groups]
    ranking.judgements(prepared.facts, index, prepared.profile, current)
    return len(current)


def quota_status(view: ClusterView, pod: PodRequest) -> str:
    """The pod's tenant quota as it stands (empty when the tenant has none)."""
    quota = view.tenancy.quota_of(pod.tenant)
    if quota is None:
        return ""
    used = view.tenancy.used(pod.tenant)
    return (
        f"tenant {pod.tenant}: {used.gpus} of {quota.gpus if quota.gpus is not None else 'any'} "
        f"GPUs, {used.gpu_memory_mib} of "
        f"{quota.gpu_memory_mib if quota.gpu_memory_mib is not None else 'any'} MiB GPU memory"
    )
