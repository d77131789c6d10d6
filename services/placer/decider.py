"""Deciding one pod on the current :class:`~.state.ClusterView` (pure: no I/O, time passed in).

:func:`decide` runs the placement core for a pod (tenancy's group choice and quota, then the
profile), and when nothing fits says how the pod should wait:

- an **invalid** request is final: rejected as unresolvable and never tried again;
- a pod **too large for every node** (or refused by the tenancy config: unknown group, no
  permission) is rejected as unresolvable but kept, and tried again only when the largest node
  shapes or the tenancy config change (``wake="grown"``);
- any other pod waits for capacity to be given back (``wake="freed"``).

The same view serves the scheduler extender (issue 14): :func:`decide_on` places a pod on the one
node kube-scheduler chose, and :func:`verdicts` is filter and prioritize over a list of nodes. Both
go through the same profile, tenancy and, in the shell, the same commit.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Literal

import msgspec

from services.placer import translate
from services.placer.core.facts import pod_facts
from services.placer.core.framework import CycleState, Profile
from services.placer.core.index import ClusterIndex
from services.placer.core.model import Decision, PodRequest, Rejection, RejectionReason
from services.placer.core.plugins.fit import CAPACITY_REASONS
from services.placer.state import ClusterView

Wake = Literal["freed", "grown"]

UNKNOWN_NODE = "no Tessera node facts or GPU inventory"
"""Why a node the placer has never heard of does not fit (kube-scheduler may name any node)."""


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
) -> Decision | Waiting:
    """Place ``pod`` on the view's cluster (nothing is booked), or say how it waits.

    ``avoid``: nodes where this pod's commit just lost to another replica's; they are chosen
    only when nothing else fits (then the pod is decided as if none were avoided).
    """
    facts = pod_facts(pod)
    if facts.invalid:
        return Waiting(
            rejection=Rejection(
                pod_uid=pod.uid,
                reasons=(
                    RejectionReason(
                        reason=f"invalid request: {facts.invalid}", nodes=len(view.index)
                    ),
                ),
                unresolvable=True,
                decided_at=now,
            ),
            final=True,
            wake="grown",
        )
    index, kept_out = _servable(view, pod)
    outcome = view.tenancy.decide(pod, index, profile, now=now, avoid=avoid)
    if avoid and not isinstance(outcome, Decision):
        outcome = view.tenancy.decide(pod, index, profile, now=now)
    if isinstance(outcome, Decision):
        return outcome
    too_large = view.too_large(facts)
    if too_large:
        rejection = Rejection(
            pod_uid=pod.uid,
            reasons=(RejectionReason(reason=too_large, nodes=len(view.index)),),
            unresolvable=True,
            decided_at=now,
        )
        return Waiting(rejection=rejection, final=False, wake="grown")
    reasons = translate.refine_reasons(
        (*outcome.reasons, *_kept_out_reason(kept_out)), view.unplaceable()
    )
    rejection = translate.rejection_of(outcome, reasons)
    wake: Wake = "grown" if outcome.unresolvable else "freed"
    return Waiting(rejection=rejection, final=False, wake=wake)


def _servable(view: ClusterView, pod: PodRequest) -> tuple[ClusterIndex, int]:
    """The index of the nodes that can serve ``pod``'s containers, and how many were kept out:
    memory-units nodes for a pod with a GPU container asking no ``tessera.dev/gpu-memory``
    (``translate.needs_gpu_devices``). Only such pods, and only on a cluster that has such
    nodes, pay for a narrower index."""
    kept = view.memory_unit_nodes
    if not kept or not translate.needs_gpu_devices(pod):
        return view.index, 0
    narrower = ClusterIndex(node for node in view.index if node.name not in kept)
    return narrower, len(view.index) - len(narrower)


def _kept_out_reason(kept_out: int) -> tuple[RejectionReason, ...]:
    if not kept_out:
        return ()
    return (RejectionReason(reason=translate.MEMORY_UNITS_ONLY, nodes=kept_out),)


def decide_on(
    view: ClusterView, profile: Profile, pod: PodRequest, node: str, *, now: float
) -> Decision | Waiting:
    """Place ``pod`` on ``node`` only (the node kube-scheduler chose), or say why not."""
    if node not in view.index:
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
    single = ClusterIndex([view.index.node(node)])
    outcome = view.tenancy.decide(pod, single, profile, now=now)
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
    names = sorted(n.name for n in view.index) if nodes is None else list(nodes)
    facts = pod_facts(pod)
    if facts.invalid:
        why = f"invalid request: {facts.invalid}"
        return [NodeVerdict(node=n, fits=False, reason=why, unresolvable=True) for n in names]
    choice = view.tenancy.choose(pod, view.index)
    if not choice.ok:
        return [
            NodeVerdict(node=n, fits=False, reason=choice.reason, unresolvable=choice.unresolvable)
            for n in names
        ]
    placed = pod if choice.group == pod.group else msgspec.structs.replace(pod, group=choice.group)
    chosen = profile.for_pod(placed)
    facts = chosen.facts(placed, placed.placement_key())
    state = CycleState()
    for pre in chosen.pre_filters:  # the tenant's quota: no node helps a pod over it
        status = pre.pre_filter(facts, view.index, state)
        if not status.ok:
            unresolvable = status.code == "unresolvable"
            return [
                NodeVerdict(node=n, fits=False, reason=status.reason, unresolvable=unresolvable)
                for n in names
            ]
    index = view.index
    memo = chosen.judged(index, placed.placement_key())
    shape_of = index.shape_id_or_none
    shape_ids = [shape_of(name) for name in names]
    judged: dict[int, str | tuple[list[float], float]] = {}
    for shape_id in shape_ids:
        if shape_id is None or shape_id in judged:
            continue
        judgement = memo.get(shape_id)
        if judgement is None:
            judgement = memo[shape_id] = chosen.judge(facts, index.shapes[shape_id])
            index.memo_size += 1
        judged[shape_id] = judgement
    fitting = {sid: j for sid, j in judged.items() if not isinstance(j, str)}
    if chosen.normalizing:
        totals = chosen.totals([raw for raw, _ in fitting.values()])
        fitting = {
            sid: (raw, t) for (sid, (raw, _)), t in zip(fitting.items(), totals, strict=True)
        }
    plugins = [(plugin.name, weight) for plugin, weight in chosen.scores]
    weighted = {
        sid: {name: w * v for (name, w), v in zip(plugins, raw, strict=True)} if detail else {}
        for sid, (raw, _) in fitting.items()
    }
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
        else:
            found.append(
                NodeVerdict(
                    node=name, fits=True, score=fitting[shape_id][1], scores=weighted[shape_id]
                )
            )
    return found


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
