"""Placing one pod: the one cycle that the placer service, the extender and the simulator run.

    validate -> tenancy (group, permissions) -> PreFilter (quota) -> Filter -> Score -> select
             -> GPU choice -> exact quota -> reserve

:func:`decide` runs it up to the reservation (deterministic for equal inputs and RNG state) and
leaves booking to the caller, who books the decision's reservation as its storage requires:
in memory, :meth:`~.tenancy.Tenancy.reserve` books it in the ledger and the tenant's usage (the
simulator, tests); the placer service books the same reservation in its tentative view and
commits it to KV by compare-and-set, charging the tenant's usage entry the same way
(``services/placer/protocol.py``). The service's decisions (``decider.decide``), the extender's
bind (``decider.decide_on``) and the simulator (``sim/replay.py``) call :func:`decide`; the
extender's filter and prioritize (``decider.verdicts``) call :func:`prepare`, the steps before any
node is looked at, then judge the candidate nodes from the memo decisions select from
(``ranking.judgements``).

Without a :class:`~.tenancy.Tenancy` (tests of the framework alone) the tenancy steps are
skipped: a pod's group, if it names one, is taken as given.

A pod that cannot be placed comes back as a :class:`~.model.Rejection` with counted reasons:
an invalid request (unresolvable), the tenancy's refusal (an unknown group, no permission:
unresolvable; no group with room: unschedulable), a PreFilter's (the tenant's quota), the
filters' reasons per node, or the exact quota once the GPUs are chosen.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from dataclasses import dataclass

import msgspec

from services.placer.core.facts import PodFacts, invalid_rejection, pod_facts
from services.placer.core.framework import Profile
from services.placer.core.index import ClusterIndex
from services.placer.core.model import Decision, PodRequest, Rejection, RejectionReason
from services.placer.core.nodeaware import Ranker
from services.placer.core.nodeaware import rank as rank_nodes
from services.placer.core.tenancy import Tenancy


@dataclass(frozen=True, slots=True)
class Prepared:
    """A pod past the steps before any node is looked at."""

    pod: PodRequest
    """The request with its tenant resolved and its resource group chosen."""
    facts: PodFacts
    profile: Profile
    """The profile the pod's node-policy hint selects."""


def prepare(
    pod: PodRequest,
    cluster: ClusterIndex,
    profile: Profile,
    tenancy: Tenancy | None = None,
    *,
    now: float,
) -> Prepared | Rejection:
    """Validate ``pod``, resolve its tenant, choose its resource group and run the PreFilters
    (the tenant's quota)."""
    facts = pod_facts(pod)
    if facts.invalid:
        return invalid_rejection(facts, nodes=len(cluster), now=now)
    if tenancy is not None:
        # The tenant as the config makes it, whatever the request carried: the shell's hands
        # cannot move a pod between tenants.
        pod = tenancy.resolve(pod)
        choice = tenancy.choose(pod, cluster)
        if not choice.ok:
            return _refused(pod, choice.reason, len(cluster), now, unresolvable=choice.unresolvable)
        if choice.group != pod.group:
            pod = msgspec.structs.replace(pod, group=choice.group)
    chosen = profile.for_pod(pod)
    facts = chosen.facts(pod, pod.shape_key())
    status = chosen.pre_filter(facts, cluster)
    if not status.ok:
        return _refused(
            pod, status.reason, len(cluster), now, unresolvable=status.code == "unresolvable"
        )
    return Prepared(pod=pod, facts=facts, profile=chosen)


@dataclass(frozen=True, slots=True)
class Ranked:
    """A pod past :func:`prepare` with the nodes of one index ranked for it: :meth:`decide`
    places it under any set of nodes to avoid without judging the cluster again."""

    prepared: Prepared
    ranking: Ranker
    tenancy: Tenancy | None

    def node(self, *, avoid: Collection[str] = ()) -> str | None:
        """The node :meth:`decide` would place the pod on, before its GPUs are chosen and the
        tenant's exact quota checked; None when no node is left."""
        return self.ranking.node(avoid=avoid)

    def decide(
        self, *, now: float, rng: random.Random | None = None, avoid: Collection[str] = ()
    ) -> Decision | Rejection:
        """:func:`decide`'s outcome with ``avoid`` (and ``rng``)."""
        decision = self.ranking.pick(now=now, rng=rng, avoid=avoid)
        if isinstance(decision, Rejection) or self.tenancy is None:
            return decision
        reason = self.tenancy.over_quota(self.prepared.pod.tenant, decision.reservation)
        if reason:
            return _refused(self.prepared.pod, reason, 1, now)
        return decision


def rank(
    pod: PodRequest,
    cluster: ClusterIndex,
    profile: Profile,
    tenancy: Tenancy | None = None,
    *,
    now: float,
) -> Ranked | Rejection:
    """The steps of :func:`decide` before a node is picked, for a caller that picks more than
    once (``decider._decide_in``: a node where the pod would wait at the binder's gate is
    avoided, and the pod placed again)."""
    prepared = prepare(pod, cluster, profile, tenancy, now=now)
    if isinstance(prepared, Rejection):
        return prepared
    ranking = rank_nodes(prepared.facts, cluster, prepared.profile)
    return Ranked(prepared=prepared, ranking=ranking, tenancy=tenancy)


def decide(
    pod: PodRequest,
    cluster: ClusterIndex,
    profile: Profile,
    tenancy: Tenancy | None = None,
    *,
    now: float,
    rng: random.Random | None = None,
    avoid: Collection[str] = (),
) -> Decision | Rejection:
    """Place ``pod`` on ``cluster`` (nothing is booked); see the module docstring.

    ``profile`` carries ``tenancy``'s plugins (``build_profile(..., **tenancy.plugins())``).
    ``avoid``: nodes not to choose (see ``ranking.schedule``).
    """
    ranked = rank(pod, cluster, profile, tenancy, now=now)
    if isinstance(ranked, Rejection):
        return ranked
    return ranked.decide(now=now, rng=rng, avoid=avoid)


def _refused(
    pod: PodRequest, reason: str, nodes: int, now: float, *, unresolvable: bool = False
) -> Rejection:
    return Rejection(
        pod_uid=pod.uid,
        reasons=(RejectionReason(reason=reason, nodes=nodes),),
        unresolvable=unresolvable,
        decided_at=now,
    )
