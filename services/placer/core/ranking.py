"""Select: a pod's judged node shapes on one index, best total first, and the node chosen.

Steps 2 to 5 of ``framework.py``'s list for one pod past its PreFilters: every shape of the
index is judged (``Profile.judge``, memoised per request shape and per index), the feasible
ones are ranked by total, and :meth:`Ranking.pick` chooses the best node, the profile's
tie-break deciding among equals, under any set of nodes to avoid; the GPUs are then chosen
inside it (``framework.place_on_node``). :func:`judgements` answers from the same memo (the
scheduler extender's filter and prioritize).

Node-aware rules (``nodeaware.py``) rank node by node when a pod needs it; a pod they have
nothing to say about is ranked here, shape by shape.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Collection, Iterable, Iterator

from services.placer.core.facts import PodFacts
from services.placer.core.framework import (
    AVOIDED,
    BATCH_MIN,
    CATCH_UP_MIN,
    Judgement,
    Profile,
    place_on_node,
    rng_for,
)
from services.placer.core.index import ClusterIndex
from services.placer.core.model import (
    Decision,
    Rejection,
    RejectionReason,
)


def schedule(
    pod: PodFacts,
    cluster: ClusterIndex,
    profile: Profile,
    *,
    now: float,
    rng: random.Random | None = None,
    avoid: Collection[str] = (),
) -> Decision | Rejection:
    """Filter, Score, select and GPU choice for a pod past its PreFilters (``cycle.prepare``);
    deterministic for equal inputs and RNG state.

    ``avoid``: nodes not to choose (the service's replicas just lost a compare-and-set on them);
    they are judged as usual, only never picked. Nothing is booked: the caller reserves
    ``Decision.reservation``.
    """
    return Ranking(pod, cluster, profile).pick(now=now, rng=rng, avoid=avoid)


_Chosen = tuple[int, float, int, random.Random | None]
"""A choice of :meth:`Ranking._choose`: the node's rank, its total, how many nodes were to choose
from, and the RNG drawn from."""


class Ranking:
    """One pod's judged shapes on one index, best total first: :meth:`pick` chooses a node
    under any set of nodes to avoid, exactly as :func:`schedule` would, without going over the
    cluster's shapes again. A decision that tries node after node (the placer's burst spreading,
    ``decider._decide_in``) ranks once and picks several times; going over every shape for each
    try was most of a placer's CPU in a burst (issue 23)."""

    __slots__ = (
        "_by_total",
        "_cluster",
        "_fitting",
        "_memo",
        "_nodes",
        "_order",
        "_pod",
        "_profile",
        "_told",
        "_top",
    )

    def __init__(self, pod: PodFacts, cluster: ClusterIndex, profile: Profile) -> None:
        self._pod = pod
        self._cluster = cluster
        self._profile = profile
        self._memo = profile.judged(cluster, pod.request.shape_key())
        self._by_total: dict[float, list[int]] = {}
        """The feasible shapes by total. Empty for a normalising profile, whose totals depend
        on which shapes are left to choose from: its picks judge the cluster each time."""
        self._top = 0.0
        """The best of the totals (when there are any)."""
        self._order: list[float] | None = None
        """The totals best first, sorted only once a pick finds every best node avoided (most
        picks take the best: sorting for each decision cost more than finding it)."""
        self._fitting: set[int] = set()
        """The shapes that fit."""
        self._nodes = 0
        """How many nodes fit."""
        self._told: tuple[frozenset[str], _Chosen | None] | None = None
        """The nodes avoided and the choice of the last :meth:`node`: a :meth:`pick` right
        after it with the same and no RNG of its own takes that choice (the decider asks which
        node, then places the pod there) rather than choosing, and drawing, again."""
        if not profile.normalizing:
            self._rank_shapes()

    def _rank_shapes(self) -> None:
        pod, cluster, profile, memo = self._pod, self._cluster, self._profile, self._memo
        judge_together(pod, cluster, profile, memo, cluster.groups)
        shapes = cluster.shapes
        judge = profile.judge
        by_total = self._by_total
        fit = self._fitting.add
        added = nodes = 0
        # Once per decision over every shape of the index: locals only in the loop.
        for sid, ranks in cluster.groups.items():
            value = memo.get(sid)
            if value is None:
                value = memo[sid] = judge(pod, shapes[sid])
                added += 1
            if value.__class__ is str:  # why the shape does not fit
                continue
            total: float = value  # type: ignore[assignment]  # a total: no plugin normalises
            fit(sid)
            nodes += len(ranks)
            if total != total:  # NaN: it fits, but no comparison makes it the best
                continue
            level = by_total.get(total)
            if level is None:
                by_total[total] = [sid]
            else:
                level.append(sid)
        self._nodes += nodes
        cluster.memo_size += added
        if by_total:
            self._top = max(by_total)

    def _totals(self) -> Iterator[float]:
        """The totals, best first."""
        if not self._by_total:
            return
        yield self._top
        if self._order is None:
            self._order = sorted(self._by_total, reverse=True)
        yield from self._order[1:]

    def _excluded_by_shape(self, excluded: frozenset[int]) -> dict[int, int]:
        """How many of each shape's nodes are ``excluded``."""
        cluster = self._cluster
        out: dict[int, int] = {}
        for rank in excluded:
            sid = cluster.shape_id_of(cluster.name_at(rank))
            out[sid] = out.get(sid, 0) + 1
        return out

    def _best(self, out: dict[int, int]) -> Picked | None:
        groups = self._cluster.groups
        feasible = self._nodes
        if out:
            feasible -= sum(n for sid, n in out.items() if sid in self._fitting)
        for total in self._totals():
            sids = self._by_total[total]
            tied = [sid for sid in sids if len(groups[sid]) > out.get(sid, 0)] if out else sids
            if tied:
                return list(tied), total, feasible
        return None

    @property
    def memo(self) -> dict[int, Judgement]:
        """The judgements of the index's shapes for this pod (every shape by a rejection)."""
        return self._memo

    def node(self, *, avoid: Collection[str] = ()) -> str | None:
        """The node :meth:`pick` would choose with ``avoid``, without choosing its GPUs; None
        when no node is left to choose."""
        chosen = self._choose(avoid, None)
        self._told = (frozenset(avoid), chosen)
        return None if chosen is None else self._cluster.name_at(chosen[0])

    def pick(
        self, *, now: float, rng: random.Random | None = None, avoid: Collection[str] = ()
    ) -> Decision | Rejection:
        """:func:`schedule`'s decision with ``avoid`` (and ``rng``)."""
        pod, cluster, profile = self._pod, self._cluster, self._profile
        told, self._told = self._told, None
        if rng is None and told is not None and told[0] == frozenset(avoid):
            chosen = told[1]  # its RNG, if it drew, is as a fresh choice would leave it
        else:
            chosen = self._choose(avoid, rng)
        if chosen is None:
            return _rejection(pod, cluster, self._memo, now)
        rank, best, feasible, rng = chosen
        return decision_on(pod, cluster, profile, rank, best, {}, feasible, rng, now=now)

    def _choose(self, avoid: Collection[str], rng: random.Random | None) -> _Chosen | None:
        """The chosen node's rank, its total, how many nodes were to choose from, and the RNG
        drawn from (the GPU choice goes on with it); None when no node is left."""
        pod, cluster, profile = self._pod, self._cluster, self._profile
        excluded = cluster.ranks_of(frozenset(avoid)) if avoid else frozenset()
        out = self._excluded_by_shape(excluded) if excluded else {}
        if profile.normalizing:
            picked = _select_normalized(pod, cluster, profile, excluded)
        else:
            picked = self._best(out)
        if picked is None:
            return None
        tied, best, feasible = picked
        groups = cluster.groups
        if profile.tie_break == "random":
            rng = rng or rng_for(pod.request)
            # Drawn in rank order: the index's shape ids (and so ``tied``'s order) follow the
            # history of node states, and a placer restarted on the same cluster must draw the
            # same node as one that ran all along.
            tied.sort(key=lambda sid: groups[sid][0])
            draw = rng.randrange(sum(len(groups[sid]) - out.get(sid, 0) for sid in tied))
            for sid in tied:
                usable = len(groups[sid]) - out.get(sid, 0)
                if draw < usable:
                    return _usable(groups[sid], excluded)[draw], best, feasible, rng
                draw -= usable
            raise AssertionError("a draw below the usable nodes' count found none")
        rank = min(
            next(r for r in groups[sid] if r not in excluded) if out.get(sid) else groups[sid][0]
            for sid in tied
        )
        return rank, best, feasible, rng


def decision_on(
    pod: PodFacts,
    cluster: ClusterIndex,
    profile: Profile,
    rank: int,
    total: float,
    extra: dict[str, float],
    feasible: int,
    rng: random.Random | None,
    *,
    now: float,
) -> Decision:
    """The decision for the node at ``rank``, its GPUs chosen (``extra``: scores beside the
    profile's, the node-aware rules')."""
    node = cluster.node(cluster.name_at(rank))
    reservation = place_on_node(pod, node, profile, rng)
    if reservation is None:  # the fit filter said yes, so this is a bug
        raise AssertionError(f"node {node.name} passed the filters but no GPUs could be chosen")
    return Decision(
        reservation=reservation,
        score=total,
        scores={**profile.weighted(pod, cluster.shape_of(node.name)), **extra},
        feasible_nodes=feasible,
        decided_at=now,
    )


def judgements(
    pod: PodFacts, cluster: ClusterIndex, profile: Profile, shape_ids: Iterable[int]
) -> dict[int, Judgement]:
    """:meth:`Profile.judge` of each of ``shape_ids``, from the memo decisions select from."""
    memo = profile.judged(cluster, pod.request.shape_key())
    wanted = list(shape_ids)
    judge_together(pod, cluster, profile, memo, wanted)
    found: dict[int, Judgement] = {}
    for sid in wanted:
        if sid not in found:
            judgement = memo.get(sid)
            if judgement is None:
                judgement = memo[sid] = profile.judge(pod, cluster.shapes[sid])
                cluster.memo_size += 1
            found[sid] = judgement
    return found


def judge_together(
    pod: PodFacts,
    cluster: ClusterIndex,
    profile: Profile,
    memo: dict[int, Judgement],
    sids: Iterable[int],
) -> None:
    """Judge the shapes of ``sids`` the memo lacks with the profile's batch judge, when it has
    one, knows the pod and enough of them are missing (:data:`BATCH_MIN`, or
    :data:`CATCH_UP_MIN` when the memo holds judgements already)."""
    if profile.batch is None:
        return
    # Over every shape of the index at each decision: filtered in C, not by a generator.
    missing = list(dict.fromkeys(itertools.filterfalse(memo.__contains__, sids)))
    if len(missing) < (CATCH_UP_MIN if memo else BATCH_MIN):
        return
    judged = profile.batch.judge(pod, cluster, missing)
    if judged is not None:
        memo.update(judged)
        cluster.memo_size += len(judged)


def _usable(ranks: list[int], excluded: frozenset[int]) -> list[int]:
    return [r for r in ranks if r not in excluded] if excluded else ranks


def _usable_count(ranks: list[int], excluded: frozenset[int]) -> int:
    """``len(_usable(ranks, excluded))`` without building the list (most shapes hold one
    node)."""
    if not excluded:
        return len(ranks)
    if len(ranks) == 1:
        return 0 if ranks[0] in excluded else 1
    return sum(1 for r in ranks if r not in excluded)


Picked = tuple[list[int], float, int]
"""The shapes tied on the best total (with a node to choose), that total, and how many nodes to
choose from fit."""


def _select_normalized(
    pod: PodFacts, cluster: ClusterIndex, profile: Profile, excluded: frozenset[int]
) -> Picked | None:
    judged = judgements(pod, cluster, profile, cluster.groups)
    rows: list[tuple[int, tuple[float, ...]]] = []
    feasible = 0
    for sid, ranks in cluster.groups.items():
        raw = judged[sid]
        usable = _usable_count(ranks, excluded)
        if usable and isinstance(raw, tuple):
            rows.append((sid, raw))
            feasible += usable
    if not rows:
        return None
    totals = profile.totals([raw for _, raw in rows])
    best = max(totals)
    return [rows[r][0] for r in range(len(rows)) if totals[r] == best], best, feasible


def _rejection(
    pod: PodFacts, cluster: ClusterIndex, memo: dict[int, Judgement], now: float
) -> Rejection:
    """Why no node was chosen, counted over nodes (every shape is in ``memo`` by now)."""
    counts: dict[str, int] = {}
    for sid, ranks in cluster.groups.items():
        reason = memo[sid]
        reason = reason if isinstance(reason, str) else AVOIDED
        counts[reason] = counts.get(reason, 0) + len(ranks)
    reasons = tuple(
        RejectionReason(reason=reason, nodes=n)
        for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    )
    return Rejection(pod_uid=pod.request.uid, reasons=reasons, decided_at=now)
