"""The placement framework: extension points, a compiled profile, and ``schedule``.

The steps of placing one pod (kube-scheduler's shape, DESIGN section 5; ``cycle.py`` runs them in
this order, with validation and the tenancy's group choice before):

1. **PreFilter** once per pod (:meth:`Profile.pre_filter`: the tenant's quota): a non-success
   :class:`Status` rejects the pod.
2. **Filter** per node shape (CPU, memory, GPU fit, health, model, group): ``None`` passes, a
   string is the reason the shape fails; rejections count reasons over nodes.
   **GpuFilter** narrows which GPUs a pod may use at all (model, group); the fit filter and the
   GPU choice both consult it.
3. **Score** per feasible shape, each 0..100, summed with the profile's weights.
4. **Select** the highest total; ties go to the best tie-break rank (or a uniform draw among the
   tied nodes for a ``random`` profile, from the RNG the caller passes).
5. **GPU choice** inside the chosen node: the search over GPUs (``search.py``) in the order of the
   profile's chooser, the same search the fit filter ran.
6. The caller **reserves** the result through the ledger.

:func:`schedule` runs steps 2 to 5.

Filters and scores must be pure functions of ``(PodFacts, NodeShape)``: the framework evaluates
each distinct shape once per distinct request and memoises the result, which is what makes 10,000
nodes affordable. Anything a plugin needs beyond that goes in its arguments at profile build time.

Extension points for seed 001 (groups and quotas) and seed 002 (queue order): a quota check is a
``PreFilter`` (it sees the pod and the ``ClusterIndex``, including the ledger's reservations); a
group restriction is a ``Filter`` on ``NodeShape.groups`` plus a ``GpuFilter`` on
``GpuShape.groups``; the shell fills ``NodeState.groups`` / ``GpuState.groups``.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol, runtime_checkable

import msgspec

from services.placer.core.facts import PodFacts, ShareAsk, pod_facts
from services.placer.core.index import ClusterIndex
from services.placer.core.model import (
    ContainerPlacement,
    Decision,
    GpuSlice,
    GpuState,
    NodeState,
    PodRequest,
    Rejection,
    RejectionReason,
    Reservation,
)
from services.placer.core.search import assign, slice_memory
from services.placer.core.shape import GpuShape, NodeShape, gpu_shape

StatusCode = Literal["success", "unschedulable", "unresolvable"]


class Status(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of a PreFilter: success, or why not (and whether waiting can help)."""

    code: StatusCode = "success"
    reason: str = ""
    plugin: str = ""

    @property
    def ok(self) -> bool:
        return self.code == "success"


SUCCESS = Status()


class CycleState(dict[str, object]):
    """Per-decision scratch space a PreFilter may fill for later plugins (keyed by plugin name)."""


class PreFilter(Protocol):
    """Runs once per pod before any node is looked at (validation, tenant quota)."""

    name: str

    def pre_filter(self, pod: PodFacts, cluster: ClusterIndex, state: CycleState) -> Status: ...


class Filter(Protocol):
    """Says whether a node shape can take the pod: None = yes, else the reason it cannot."""

    name: str

    def filter(self, pod: PodFacts, shape: NodeShape) -> str | None: ...


class GpuFilter(Protocol):
    """Says whether the pod may use a GPU at all (model, group), whatever its free capacity."""

    name: str

    def admits_gpu(self, pod: PodFacts, gpu: GpuShape) -> bool: ...


class Score(Protocol):
    """Scores a feasible node shape for the pod, 0 (worst) .. 100 (best)."""

    name: str

    def score(self, pod: PodFacts, shape: NodeShape) -> float: ...


@runtime_checkable
class NormalizingScore(Score, Protocol):
    """A score whose raw values are rescaled over all feasible nodes before weighting."""

    def normalize(self, raw: Sequence[float]) -> list[float]: ...


class GpuChooser(Protocol):
    """Orders the GPUs one share may go on, most preferred first: the GPU choice's only say.

    ``gpus`` are ``node.gpus`` as the pod's earlier shares left them (``gpus[i]`` is
    ``node.gpus[i]``), ``candidates`` the positions the share fits on that its container does not
    use yet, ``chosen`` the positions of the pod's earlier shares. The search over GPUs
    (``search.py``) takes the first candidate and goes on to the next only when the first leaves a
    later share no room. Must be deterministic given ``rng``.
    """

    name: str

    def order(
        self,
        pod: PodFacts,
        node: NodeState,
        gpus: Sequence[GpuShape],
        candidates: Sequence[int],
        chosen: Sequence[int],
        rng: random.Random,
    ) -> list[int]: ...


TieBreak = Literal["rank", "random"]
Judgement = str | float | tuple[float, ...]
"""Why a node shape does not fit a pod, else its score: the weighted total, or, for a profile
that normalises, each plugin's raw score (the totals depend on every feasible shape)."""

BATCH_MIN: Final = 32
"""Shapes still to judge from which a profile's :class:`BatchJudge` judges them together:
below it, its array set-up costs more than judging one shape at a time."""


class BatchJudge(Protocol):
    """Judges many shapes for one pod at once, exactly as :meth:`Profile.judge` would judge each
    (``batch.py``)."""

    def judge(
        self, pod: PodFacts, cluster: ClusterIndex, sids: Sequence[int]
    ) -> dict[int, Judgement] | None:
        """The judgement of each shape id; None for a pod it does not judge."""


AVOIDED: Final = "not to be chosen this time (a commit there was just lost)"
"""Why a feasible node is in a rejection: every feasible node was to be avoided."""


@dataclass(eq=False)
class Profile:
    """A compiled, validated profile (see ``profiles.build_profile``), with its memo."""

    name: str
    filters: tuple[Filter, ...]
    gpu_filters: tuple[GpuFilter, ...]
    scores: tuple[tuple[Score, float], ...]
    gpu_choice: GpuChooser
    tie_break: TieBreak = "rank"
    pre_filters: tuple[PreFilter, ...] = ()
    gpu_choices: Mapping[str, GpuChooser] = field(default_factory=dict)
    """Choosers a pod may ask for by its ``gpu_policy`` hint."""
    node_policies: Mapping[str, Profile] = field(default_factory=dict)
    """Profiles a pod may ask for by its ``node_policy`` hint."""
    memo_limit: int = 2_000_000
    """Memoised (request, shape) evaluations kept per cluster before the memo starts over."""
    batch: BatchJudge | None = field(default=None, repr=False)
    """Judges many shapes at once for the pods it knows (``batch.batch_judge``; set by
    ``profiles.build_profile``)."""
    _facts: dict[PodRequest, PodFacts] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._normalizing = len(self.scores) > 1 and any(
            isinstance(plugin, NormalizingScore) for plugin, _ in self.scores
        )

    def facts(self, pod: PodRequest, key: PodRequest) -> PodFacts:
        """``pod``'s facts; ``key`` is ``pod.placement_key()`` (facts are cached by it)."""
        found = self._facts.get(key)
        if found is None:
            if len(self._facts) > 100_000:
                self._facts.clear()
            found = self._facts[key] = pod_facts(key)
        return found if found.request is pod else _with_request(found, pod)

    def for_pod(self, pod: PodRequest) -> Profile:
        if pod.node_policy is not None and pod.node_policy in self.node_policies:
            return self.node_policies[pod.node_policy]
        return self

    def chooser_for(self, pod: PodFacts) -> GpuChooser:
        policy = pod.request.gpu_policy
        if policy is not None and policy in self.gpu_choices:
            return self.gpu_choices[policy]
        return self.gpu_choice

    def weighted(self, pod: PodFacts, shape: NodeShape) -> dict[str, float]:
        """Each plugin's weighted score of a feasible shape (a decision's and an explanation's
        detail)."""
        return {plugin.name: weight * plugin.score(pod, shape) for plugin, weight in self.scores}

    @property
    def normalizing(self) -> bool:
        """Scores are rescaled over the feasible shapes before weighting (:meth:`totals`)."""
        return self._normalizing

    def totals(self, rows: Sequence[Sequence[float]]) -> list[float]:
        """The weighted score of each feasible shape, given its raw scores (:meth:`judge`); a
        normalising plugin's column is rescaled over ``rows`` first, as a decision does over
        every feasible shape."""
        columns: list[Sequence[float]] = [[row[i] for row in rows] for i in range(len(self.scores))]
        if self._normalizing:
            for i, (plugin, _) in enumerate(self.scores):
                if isinstance(plugin, NormalizingScore):
                    columns[i] = plugin.normalize(columns[i])
        return [
            sum(weight * columns[i][r] for i, (_, weight) in enumerate(self.scores))
            for r in range(len(rows))
        ]

    def pre_filter(self, pod: PodFacts, cluster: ClusterIndex) -> Status:
        """The first PreFilter's refusal of ``pod``, or success (once per pod, before any node)."""
        state = CycleState()
        for plugin in self.pre_filters:
            status = plugin.pre_filter(pod, cluster, state)
            if not status.ok:
                return status
        return SUCCESS

    def judge(self, pod: PodFacts, shape: NodeShape) -> Judgement:
        """Why ``shape`` does not fit the pod, else its score: the weighted total, or for a
        profile that normalises each plugin's raw score (weighted by :meth:`totals` once every
        feasible shape's are known)."""
        for plugin in self.filters:
            reason = plugin.filter(pod, shape)
            if reason is not None:
                return reason
        if self._normalizing:
            return tuple(plugin.score(pod, shape) for plugin, _ in self.scores)
        total = 0.0
        for scorer, weight in self.scores:
            total += weight * scorer.score(pod, shape)
        return total

    def judged(self, cluster: ClusterIndex, key: PodRequest) -> dict[int, Judgement]:
        """The memo of :meth:`judge` for requests equal to ``key`` (``placement_key()``) on
        ``cluster``, by shape id: what decisions select from, and what the scheduler extender's
        filter and prioritize answer from (kube-scheduler sends a job's replicas one after the
        other). Shape ids only mean something within one index, so the memo lives on it, and is
        dropped when the index compacts, the profile is rebuilt or :attr:`memo_limit` is
        passed."""
        memos = cluster.memos.get(self)
        if memos is None or cluster.memo_size > self.memo_limit:
            memos = cluster.memos[self] = {}
            cluster.memo_size = 0
        memo = memos.get(key)
        if memo is None:
            memo = memos[key] = {}
        return memo


def _with_request(facts: PodFacts, pod: PodRequest) -> PodFacts:
    return PodFacts(
        request=pod,
        cpu_milli=facts.cpu_milli,
        memory_mib=facts.memory_mib,
        asks=facts.asks,
        gpu_count=facts.gpu_count,
        share_milli=facts.share_milli,
        gpu_milli_total=facts.gpu_milli_total,
        fractional=facts.fractional,
        kind=facts.kind,
        invalid=facts.invalid,
    )


def _rng_for(pod: PodRequest) -> random.Random:
    return random.Random(zlib.crc32(pod.uid.encode()))


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
        "_top",
    )

    def __init__(self, pod: PodFacts, cluster: ClusterIndex, profile: Profile) -> None:
        self._pod = pod
        self._cluster = cluster
        self._profile = profile
        self._memo = profile.judged(cluster, pod.request.placement_key())
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
        if not profile.normalizing:
            self._rank_shapes()

    def _rank_shapes(self) -> None:
        pod, cluster, profile, memo = self._pod, self._cluster, self._profile, self._memo
        _judge_together(pod, cluster, profile, memo, cluster.groups)
        shapes = cluster.shapes
        judge = profile.judge
        by_total = self._by_total
        added = 0
        for sid, ranks in cluster.groups.items():
            value = memo.get(sid)
            if value is None:
                value = memo[sid] = judge(pod, shapes[sid])
                added += 1
            if value.__class__ is str:  # why the shape does not fit
                continue
            total: float = value  # type: ignore[assignment]  # a total: no plugin normalises
            self._fitting.add(sid)
            self._nodes += len(ranks)
            if total != total:  # NaN: it fits, but no comparison makes it the best
                continue
            level = by_total.get(total)
            if level is None:
                by_total[total] = [sid]
            else:
                level.append(sid)
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

    def node(self, *, avoid: Collection[str] = ()) -> str | None:
        """The node :meth:`pick` would choose with ``avoid``, without choosing its GPUs; None
        when no node is left to choose."""
        chosen = self._choose(avoid, None)
        return None if chosen is None else self._cluster.name_at(chosen[0])

    def pick(
        self, *, now: float, rng: random.Random | None = None, avoid: Collection[str] = ()
    ) -> Decision | Rejection:
        """:func:`schedule`'s decision with ``avoid`` (and ``rng``)."""
        pod, cluster, profile = self._pod, self._cluster, self._profile
        chosen = self._choose(avoid, rng)
        if chosen is None:
            return _rejection(pod, cluster, self._memo, now)
        rank, best, feasible, rng = chosen
        node = cluster.node(cluster.name_at(rank))
        reservation = place_on_node(pod, node, profile, rng or _rng_for(pod.request))
        if reservation is None:  # the fit filter said yes, so this is a bug
            raise AssertionError(f"node {node.name} passed the filters but no GPUs could be chosen")
        return Decision(
            reservation=reservation,
            score=best,
            scores=profile.weighted(pod, cluster.shape_of(node.name)),
            feasible_nodes=feasible,
            decided_at=now,
        )

    def _choose(
        self, avoid: Collection[str], rng: random.Random | None
    ) -> tuple[int, float, int, random.Random | None] | None:
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
            rng = rng or _rng_for(pod.request)
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


def judgements(
    pod: PodFacts, cluster: ClusterIndex, profile: Profile, shape_ids: Iterable[int]
) -> dict[int, Judgement]:
    """:meth:`Profile.judge` of each of ``shape_ids``, from the memo decisions select from."""
    memo = profile.judged(cluster, pod.request.placement_key())
    wanted = list(shape_ids)
    _judge_together(pod, cluster, profile, memo, wanted)
    found: dict[int, Judgement] = {}
    for sid in wanted:
        if sid not in found:
            judgement = memo.get(sid)
            if judgement is None:
                judgement = memo[sid] = profile.judge(pod, cluster.shapes[sid])
                cluster.memo_size += 1
            found[sid] = judgement
    return found


def _judge_together(
    pod: PodFacts,
    cluster: ClusterIndex,
    profile: Profile,
    memo: dict[int, Judgement],
    sids: Iterable[int],
) -> None:
    """Judge the shapes of ``sids`` the memo lacks with the profile's batch judge, when it has
    one, knows the pod and enough of them are missing (:data:`BATCH_MIN`)."""
    if profile.batch is None:
        return
    missing = list(dict.fromkeys(sid for sid in sids if sid not in memo))
    if len(missing) < BATCH_MIN:
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


def gpu_admitted(facts: PodFacts, gpu: GpuShape, gpu_filters: Sequence[GpuFilter]) -> bool:
    return all(f.admits_gpu(facts, gpu) for f in gpu_filters)


def _slice_for(ask: ShareAsk, gpu: GpuState) -> GpuSlice:
    return GpuSlice(
        index=gpu.index,
        uuid=gpu.uuid,
        memory_mib=slice_memory(ask, gpu),
        core_milli=ask.core_milli,
        exclusive=ask.whole,
    )


def place_on_node(
    facts: PodFacts, node: NodeState, profile: Profile, rng: random.Random
) -> Reservation | None:
    """Choose GPUs for every share of ``facts`` on ``node``: the search over GPUs
    (``search.py``) in the order of the profile's chooser.

    The chooser's search finds GPUs whenever the fit filter's does (both are complete); should it
    run out of steps first, the fit filter's own assignment (the same search on the node's shape)
    is taken. None only when the shares do not fit at all, which the fit filter rules out for a
    node it passed.
    """
    chooser = profile.chooser_for(facts)
    gpus = [gpu_shape(g) for g in node.gpus]
    admitted = [gpu_admitted(facts, g, profile.gpu_filters) for g in gpus]

    def prefer(now: Sequence[GpuShape], candidates: list[int], chosen: Sequence[int]) -> list[int]:
        return chooser.order(facts, node, now, candidates, chosen, rng)

    positions = assign(facts.asks, gpus, admitted, prefer)
    if positions is None:
        shaped = sorted(range(len(gpus)), key=gpus.__getitem__)  # the node shape's GPU order
        found = assign(facts.asks, [gpus[i] for i in shaped], [admitted[i] for i in shaped])
        positions = None if found is None else tuple(shaped[p] for p in found)
    if positions is None:
        return None
    flat = iter(positions)
    containers = tuple(
        ContainerPlacement(
            container=ask.container,
            gpus=tuple(_slice_for(ask, node.gpus[next(flat)]) for _ in range(ask.shares)),
        )
        for ask in facts.asks
    )
    return Reservation(
        pod_uid=facts.request.uid,
        node=node.name,
        cpu_milli=facts.cpu_milli,
        memory_mib=facts.memory_mib,
        containers=containers,
        kind=facts.kind,
    )
