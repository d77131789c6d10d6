"""The placement framework: extension points and a compiled profile (``ranking.py`` selects).

The steps of placing one pod (kube-scheduler's shape, docs/design.md §5; ``cycle.py`` runs them in
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

:func:`ranking.schedule` runs steps 2 to 5.

Filters and scores must be pure functions of ``(PodFacts, NodeShape)``: the framework evaluates
each distinct shape once per distinct request and memoises the result, which is what makes 10,000
nodes affordable. Anything a plugin needs beyond that goes in its arguments at profile build time.

Kubernetes' scheduling constraints are judged node by node, not by shape: a :class:`NodeRule`
(``nodeaware.py`` has how, ``profiles.NODE_RULES`` which).

Extension points for seed 001 (groups and quotas) and seed 002 (queue order): a quota check is a
``PreFilter`` (it sees the pod and the ``ClusterIndex``, including the ledger's reservations); a
group restriction is a ``Filter`` on ``NodeShape.groups`` plus a ``GpuFilter`` on
``GpuShape.groups``; the shell fills ``NodeState.groups`` / ``GpuState.groups``.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol, runtime_checkable

import msgspec

from services.placer.core import devicesel
from services.placer.core.facts import PodFacts, ShareAsk, pod_facts
from services.placer.core.index import ClusterIndex
from services.placer.core.model import (
    ContainerPlacement,
    GpuSlice,
    GpuState,
    NodeState,
    PodRequest,
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
    later share no room. Must be deterministic given ``rng`` (None unless :attr:`draws`).
    """

    name: str
    draws: bool
    """Whether :meth:`order` reads ``rng``: a pod's RNG is seeded only for choosers that do."""

    def order(
        self,
        pod: PodFacts,
        node: NodeState,
        gpus: Sequence[GpuShape],
        candidates: Sequence[int],
        chosen: Sequence[int],
        rng: random.Random | None,
    ) -> list[int]: ...


Stage = Literal["before_fit", "after_fit"]


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    """Why a node-aware rule keeps a node out."""

    reason: str
    unresolvable: bool
    stage: Stage = "before_fit"


class NodeCheck:
    """One rule's work for one pod on one index (its PreFilter state); the defaults say
    nothing, a rule overrides what it does."""

    stage: Stage = "before_fit"
    """Where its filter runs among kube-scheduler's (its refusals carry the same)."""
    candidates: frozenset[str] | None = None
    """The only nodes that may take the pod (None: any): the others are not judged for a
    decision, and :meth:`refuse` says why of each when a rejection or a verdict asks."""
    scores = False
    """Whether :meth:`score` has anything to say."""

    def refused(self) -> Mapping[str, Refusal] | None:
        """Every node this rule refuses, when it can list them without going over every node
        (a few tainted nodes); None: ask :meth:`refuse` node by node."""
        return {}

    def refuse(self, node: NodeState) -> Refusal | None:
        """Why ``node`` may not take the pod (None: it may)."""
        return None

    def score(self, nodes: Sequence[NodeState]) -> list[float]:
        """Each of the feasible ``nodes``' score, normalised over them to 0..100."""
        return [0.0] * len(nodes)


class NodeRule(Protocol):
    """A node-aware rule (``profiles.NODE_RULES``): filters, and maybe scores, node by node."""

    name: str
    weight: float
    """Of its score, beside the profile's scores (kube-scheduler's default weight)."""

    def check(self, pod: PodFacts, cluster: ClusterIndex) -> NodeCheck | None:
        """Its PreFilter: what it needs for ``pod`` on ``cluster``, None when nothing."""
        ...


TieBreak = Literal["rank", "random"]
Judgement = str | float | tuple[float, ...]
"""Why a node shape does not fit a pod, else its score: the weighted total, or, for a profile
that normalises, each plugin's raw score (the totals depend on every feasible shape)."""

BATCH_MIN: Final = 32
"""Shapes still to judge from which a profile's :class:`BatchJudge` judges them together:
below it, its array set-up costs more than judging one shape at a time."""

CATCH_UP_MIN: Final = 64
""":data:`BATCH_MIN` for a request already judged on some shapes, catching up on the shapes
the index took since (a node a decision landed on): the profile's memos hold most of what
judging them one at a time computes (their fragmentation before and after), so the batch's
set-up pays only from more of them. At 250 pods a second on 1,000 nodes a catch-up of 32 to
63 shapes took ~535 us in a batch, ~12 us a shape one at a time, and the decision path 14 %
less CPU with the learned mix (``benchmarks/placer_decisions.py``). Profiled, it reads the
other way round: cProfile slows the many scalar calls far more than the batch's few."""


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
    node_rules: tuple[NodeRule, ...] = ()
    """Node-aware rules (``nodeaware.py``), in kube-scheduler's order."""
    batch: BatchJudge | None = field(default=None, repr=False)
    """Judges many shapes at once for the pods it knows (``batch.batch_judge``; set by
    ``profiles.build_profile``)."""
    _facts: dict[PodRequest, PodFacts] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._normalizing = len(self.scores) > 1 and any(
            isinstance(plugin, NormalizingScore) for plugin, _ in self.scores
        )

    def facts(self, pod: PodRequest, key: PodRequest) -> PodFacts:
        """``pod``'s facts; ``key`` is ``pod.shape_key()`` (facts are cached by it)."""
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
        """The memo of :meth:`judge` for requests equal to ``key`` (``shape_key()``) on
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


def gpu_admitted(facts: PodFacts, gpu: GpuShape, gpu_filters: Sequence[GpuFilter]) -> bool:
    # A loop rather than ``all`` over a generator: asked for GPU after GPU of every shape judged.
    for gpu_filter in gpu_filters:  # noqa: SIM110
        if not gpu_filter.admits_gpu(facts, gpu):
            return False
    return True


def _slice_for(ask: ShareAsk, gpu: GpuState) -> GpuSlice:
    return GpuSlice(
        index=gpu.index,
        uuid=gpu.uuid,
        memory_mib=slice_memory(ask, gpu),
        core_milli=ask.core_milli,
        exclusive=ask.whole,
    )


def rng_for(pod: PodRequest) -> random.Random:
    """The pod's own RNG, for draws among equals: seeded by its UID, so any replica, restarted
    or not, draws alike."""
    return random.Random(zlib.crc32(pod.uid.encode()))


def place_on_node(
    facts: PodFacts, node: NodeState, profile: Profile, rng: random.Random | None
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
    selectors = facts.request.device_selectors
    if selectors:  # judged GPU by GPU (``plugins/deviceselectors.py`` passed the node)
        admitted = [
            a and m for a, m in zip(admitted, devicesel.admitted(selectors, node.gpus), strict=True)
        ]

    if rng is None and chooser.draws:
        rng = rng_for(facts.request)

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
        pod=facts.request.placed(),
    )
