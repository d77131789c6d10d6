"""Kubernetes' scheduling constraints as the wire carries them: what a pod asks of its node and
of the pods around it (``PodPending.constraints``), a node's taints and the pods already on it
(``NodeFacts``), and what a booked pod asks of the pods that come later (``Booking``).

Value types of the pods, nodes and ledger families (like ``base.py``'s), parsed and checked
by ``shared.scheduling`` at the binder's edge: every operator and policy here is one Tessera
implements, and namespace selectors are already resolved to namespaces. Tuples rather than
maps, so that a request stays hashable (the placer keys its caches by requests).
"""

from __future__ import annotations

from typing import Literal

from shared.messages.base import Message

NodeOperator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
LabelOperator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
InclusionPolicy = Literal["Honor", "Ignore"]
Labels = tuple[tuple[str, str], ...]
"""Label pairs, sorted by key."""


class Requirement(Message, frozen=True, kw_only=True):
    """One ``matchExpressions`` (or ``matchFields``) entry."""

    key: str
    operator: NodeOperator
    values: tuple[str, ...] = ()


class NodeSelectorTerm(Message, frozen=True, kw_only=True):
    """Requirements that must all hold; ``match_fields`` names ``metadata.name`` only. A term
    with neither matches no node (as Kubernetes has it)."""

    match_expressions: tuple[Requirement, ...] = ()
    match_fields: tuple[Requirement, ...] = ()


class PreferredNodeTerm(Message, frozen=True, kw_only=True):
    weight: int
    term: NodeSelectorTerm


class NodeAffinity(Message, frozen=True, kw_only=True):
    required: tuple[NodeSelectorTerm, ...] | None = None
    """Terms of which one must hold; None: no requirement (an empty tuple matches nothing)."""
    preferred: tuple[PreferredNodeTerm, ...] = ()


class Toleration(Message, frozen=True, kw_only=True):
    key: str = ""
    """Empty with ``Exists``: every taint."""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""
    """Empty: every effect."""


class Taint(Message, frozen=True, kw_only=True):
    key: str
    value: str = ""
    effect: str
    """``NoSchedule``, ``PreferNoSchedule`` or ``NoExecute``; another (a later Kubernetes's)
    is carried and, as kube-scheduler does, neither filters nor scores."""


class LabelSelector(Message, frozen=True, kw_only=True):
    """A ``metav1.LabelSelector``: every pair and every requirement must hold (empty: all)."""

    match_labels: Labels = ()
    match_expressions: tuple[Requirement, ...] = ()


class PodAffinityTerm(Message, frozen=True, kw_only=True):
    """Pods matched by ``selector`` (None: no pod) in ``namespaces`` (or every namespace),
    counted by the value of ``topology_key`` on their nodes."""

    selector: LabelSelector | None = None
    namespaces: tuple[str, ...] = ()
    """The term's namespaces, those its namespace selector matched when the pod was read, or
    the pod's own when it named neither."""
    all_namespaces: bool = False
    """An empty namespace selector (``{}``): every namespace, those made later too."""
    topology_key: str


class WeightedPodAffinityTerm(Message, frozen=True, kw_only=True):
    weight: int
    term: PodAffinityTerm


class PodAffinity(Message, frozen=True, kw_only=True):
    """``podAffinity`` or ``podAntiAffinity``: terms that must hold, terms preferred."""

    required: tuple[PodAffinityTerm, ...] = ()
    preferred: tuple[WeightedPodAffinityTerm, ...] = ()


class SpreadConstraint(Message, frozen=True, kw_only=True):
    """One ``topologySpreadConstraints`` entry (``matchLabelKeys`` already merged into the
    selector; None: the pod gave no selector, which matches no pod)."""

    max_skew: int
    topology_key: str
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"]
    selector: LabelSelector | None = None
    min_domains: int = 1
    node_affinity_policy: InclusionPolicy = "Honor"
    node_taints_policy: InclusionPolicy = "Ignore"


class Constraints(Message, frozen=True, kw_only=True):
    """Everything a pod's spec asks of where it runs, beyond its resources."""

    node_selector: Labels = ()
    node_affinity: NodeAffinity | None = None
    tolerations: tuple[Toleration, ...] = ()
    pod_affinity: PodAffinity | None = None
    pod_anti_affinity: PodAffinity | None = None
    spread: tuple[SpreadConstraint, ...] = ()

    @property
    def counts_pods(self) -> bool:
        """Whether where the pod may go depends on the pods already placed (not only on the
        nodes): pod affinity, anti-affinity or topology spread."""
        return bool(self.pod_affinity or self.pod_anti_affinity or self.spread)


class ExistingPod(Message, frozen=True, kw_only=True):
    """A running pod Tessera did not place, as the constraints of pods placed later see it
    (``NodeFacts.pods``); Tessera's own pods are their bookings."""

    uid: str
    namespace: str
    labels: dict[str, str] = {}
    affinity: PodAffinity | None = None
    anti_affinity: PodAffinity | None = None
