"""Pure: a pod spec's scheduling constraints (``nodeSelector``, ``affinity``, ``tolerations``,
``topologySpreadConstraints``) into ``Constraints``, and its scheduling gates.

Kubernetes keeps adding to these fields (a new operator, a new policy, a new field); a scheduler
that skips what it does not know puts pods where they asked not to go. So they are read
strictly: an unknown field or value is a problem naming the field as ``kubectl explain`` would
(``spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution
.nodeSelectorTerms[0].matchExpressions[1].operator``), which the webhook answers ``kubectl
apply`` with and the binder writes on the pod, never ignored.

Resolved here, so that the placer reads plain values: a pod-affinity term's namespaces (its own
list, the namespaces its namespace selector matches among ``namespaces``, the pod's own when it
names neither; an empty selector is every namespace), and ``matchLabelKeys`` /
``mismatchLabelKeys`` merged into the selectors as Kubernetes merges them (``key In (value)``
/ ``key NotIn (value)`` with the pod's own label values).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, get_args

import msgspec

from shared.kubeobjects import Pod
from shared.messages.constraints import (
    Constraints,
    InclusionPolicy,
    LabelOperator,
    LabelSelector,
    NodeAffinity,
    NodeOperator,
    NodeSelectorTerm,
    PodAffinity,
    PodAffinityTerm,
    PreferredNodeTerm,
    Requirement,
    SpreadConstraint,
    Toleration,
    WeightedPodAffinityTerm,
)
from shared.selectors import NAME_FIELD, namespaces_matching

Problem = tuple[str, str]
"""(field, what is wrong and what is allowed)."""

NODE_OPERATORS: Final[tuple[str, ...]] = get_args(NodeOperator)
LABEL_OPERATORS: Final[tuple[str, ...]] = get_args(LabelOperator)
TOLERATION_OPERATORS: Final = ("Equal", "Exists")
EFFECTS: Final = ("NoSchedule", "PreferNoSchedule", "NoExecute")
WHEN_UNSATISFIABLE: Final = ("DoNotSchedule", "ScheduleAnyway")
POLICIES: Final[tuple[str, ...]] = get_args(InclusionPolicy)
NOT_IMPLEMENTED: Final = "Tessera does not implement this field; remove it or use another scheduler"
_LABEL_VALUE: Final = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
"""A label value as Kubernetes allows it (63 characters at most): a selector naming any other
value can match no label, and kube-scheduler matches no node with it."""


def _values_problem(operator: str, values: list[str]) -> str:
    """What is wrong with ``values`` for ``operator`` (empty when nothing)."""
    if operator in ("In", "NotIn") and not values:
        return f"{operator} needs at least one value"
    if operator in ("Exists", "DoesNotExist") and values:
        return f"{operator} takes no values"
    if operator in ("Gt", "Lt"):
        if len(values) != 1:
            return f"{operator} takes exactly one value"
        try:
            int(values[0])
        except ValueError:
            return f"{operator} compares integers; {values[0]!r} is not one"
        return ""
    bad = [v for v in values if len(v) > 63 or not _LABEL_VALUE.match(v)]
    if bad:
        return f"{bad[0]!r} is not a valid label value, so nothing could match it"
    return ""


class _Api(msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """The API's own shape of these fields, every field known (an unknown one is refused)."""


class _Requirement(_Api, frozen=True, kw_only=True):
    key: str
    operator: str
    values: list[str] | None = None


class _NodeTerm(_Api, frozen=True, kw_only=True):
    match_expressions: list[_Requirement] | None = None
    match_fields: list[_Requirement] | None = None


class _NodeSelector(_Api, frozen=True, kw_only=True):
    node_selector_terms: list[_NodeTerm]


class _PreferredNodeTerm(_Api, frozen=True, kw_only=True):
    weight: int
    preference: _NodeTerm


class _NodeAffinity(_Api, frozen=True, kw_only=True):
    required_during_scheduling_ignored_during_execution: _NodeSelector | None = None
    preferred_during_scheduling_ignored_during_execution: list[_PreferredNodeTerm] | None = None


class _LabelSelector(_Api, frozen=True, kw_only=True):
    match_labels: dict[str, str] | None = None
    match_expressions: list[_Requirement] | None = None


class _PodTerm(_Api, frozen=True, kw_only=True):
    label_selector: _LabelSelector | None = None
    namespaces: list[str] | None = None
    topology_key: str = ""
    namespace_selector: _LabelSelector | None = None
    match_label_keys: list[str] | None = None
    mismatch_label_keys: list[str] | None = None


class _WeightedPodTerm(_Api, frozen=True, kw_only=True):
    weight: int
    pod_affinity_term: _PodTerm


class _PodAffinity(_Api, frozen=True, kw_only=True):
    required_during_scheduling_ignored_during_execution: list[_PodTerm] | None = None
    preferred_during_scheduling_ignored_during_execution: list[_WeightedPodTerm] | None = None


class _Affinity(_Api, frozen=True, kw_only=True):
    node_affinity: _NodeAffinity | None = None
    pod_affinity: _PodAffinity | None = None
    pod_anti_affinity: _PodAffinity | None = None


class _Toleration(_Api, frozen=True, kw_only=True):
    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None
    """How long a ``NoExecute`` taint is tolerated once added: the kubelet's and the taint
    manager's business, not placement's."""


class _Spread(_Api, frozen=True, kw_only=True):
    max_skew: int
    topology_key: str
    when_unsatisfiable: str
    label_selector: _LabelSelector | None = None
    min_domains: int | None = None
    node_affinity_policy: str | None = None
    node_taints_policy: str | None = None
    match_label_keys: list[str] | None = None


class _Gate(_Api, frozen=True, kw_only=True):
    name: str


def _strict(value: Any, kind: Any, field: str, problems: list[Problem]) -> Any:
    """``value`` as ``kind``; None (and a problem naming the field) when it is not one."""
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as error:
        text = str(error)
        where = ""
        if " - at `$" in text:
            text, _, where = text.partition(" - at `$")
            where = where.rstrip("`")
        unknown = text.startswith("Object contains unknown field `")
        if unknown:
            name = text.removeprefix("Object contains unknown field `").rstrip("`")
            problems.append((f"{field}{where}.{name}", NOT_IMPLEMENTED))
        else:
            problems.append((f"{field}{where}", text))
        return None


def _choice(
    value: str | None, allowed: tuple[str, ...], field: str, problems: list[Problem]
) -> bool:
    if value is None or value in allowed:
        return True
    problems.append(
        (field, f"{value!r} is not implemented by Tessera; known: {', '.join(allowed)}")
    )
    return False


def _requirements(
    given: list[_Requirement] | None,
    operators: tuple[str, ...],
    field: str,
    problems: list[Problem],
    *,
    fields: bool = False,
) -> tuple[Requirement, ...]:
    found: list[Requirement] = []
    for i, r in enumerate(given or ()):
        where = f"{field}[{i}]"
        if not _choice(r.operator, operators, f"{where}.operator", problems):
            continue
        if fields and r.key != NAME_FIELD:
            problems.append((f"{where}.key", f"{r.key!r}: only {NAME_FIELD} may be matched"))
            continue
        problem = "" if fields else _values_problem(r.operator, r.values or [])
        if problem:
            problems.append((f"{where}.values", problem))
            continue
        found.append(
            Requirement(
                key=r.key,
                operator=r.operator,  # type: ignore[arg-type]  # checked just above
                values=tuple(r.values or ()),
            )
        )
    return tuple(found)


def _node_term(term: _NodeTerm, field: str, problems: list[Problem]) -> NodeSelectorTerm:
    return NodeSelectorTerm(
        match_expressions=_requirements(
            term.match_expressions, NODE_OPERATORS, f"{field}.matchExpressions", problems
        ),
        match_fields=_requirements(
            term.match_fields, NODE_OPERATORS, f"{field}.matchFields", problems, fields=True
        ),
    )


def _node_affinity(given: _NodeAffinity, field: str, problems: list[Problem]) -> NodeAffinity:
    required = None
    selector = given.required_during_scheduling_ignored_during_execution
    if selector is not None:
        where = f"{field}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
        required = tuple(
            _node_term(t, f"{where}[{i}]", problems)
            for i, t in enumerate(selector.node_selector_terms)
        )
    where = f"{field}.preferredDuringSchedulingIgnoredDuringExecution"
    preferred = tuple(
        PreferredNodeTerm(
            weight=p.weight, term=_node_term(p.preference, f"{where}[{i}].preference", problems)
        )
        for i, p in enumerate(given.preferred_during_scheduling_ignored_during_execution or ())
    )
    return NodeAffinity(required=required, preferred=preferred)


def _selector(
    given: _LabelSelector | None, field: str, problems: list[Problem]
) -> LabelSelector | None:
    if given is None:
        return None
    return LabelSelector(
        match_labels=tuple(sorted((given.match_labels or {}).items())),
        match_expressions=_requirements(
            given.match_expressions, LABEL_OPERATORS, f"{field}.matchExpressions", problems
        ),
    )


def _merged(
    selector: LabelSelector | None,
    keys: list[str] | None,
    operator: LabelOperator,
    labels: Mapping[str, str],
) -> LabelSelector | None:
    """``selector`` with ``key <operator> (the pod's value)`` for each of ``keys`` the pod
    carries (a key it does not carry adds nothing, as Kubernetes has it)."""
    added = tuple(
        Requirement(key=key, operator=operator, values=(labels[key],))
        for key in keys or ()
        if key in labels
    )
    if not added or selector is None:
        return selector
    present = set(selector.match_expressions)
    new = tuple(r for r in added if r not in present)
    return msgspec.structs.replace(selector, match_expressions=(*selector.match_expressions, *new))


def _pod_term(
    term: _PodTerm,
    field: str,
    pod: Pod,
    namespaces: Mapping[str, Mapping[str, str]],
    problems: list[Problem],
) -> PodAffinityTerm:
    labels = pod.metadata.labels or {}
    selector = _selector(term.label_selector, f"{field}.labelSelector", problems)
    selector = _merged(selector, term.match_label_keys, "In", labels)
    selector = _merged(selector, term.mismatch_label_keys, "NotIn", labels)
    names = set(term.namespaces or ())
    every = False
    chosen = _selector(term.namespace_selector, f"{field}.namespaceSelector", problems)
    if chosen is not None:
        if not chosen.match_labels and not chosen.match_expressions:
            every = True
        else:
            names.update(namespaces_matching(chosen, namespaces))
    elif not names:
        names = {pod.metadata.namespace}
    return PodAffinityTerm(
        selector=selector,
        namespaces=tuple(sorted(names)),
        all_namespaces=every,
        topology_key=term.topology_key,
    )


def _pod_affinity(
    given: _PodAffinity,
    field: str,
    pod: Pod,
    namespaces: Mapping[str, Mapping[str, str]],
    problems: list[Problem],
) -> PodAffinity:
    hard = f"{field}.requiredDuringSchedulingIgnoredDuringExecution"
    soft = f"{field}.preferredDuringSchedulingIgnoredDuringExecution"
    return PodAffinity(
        required=tuple(
            _pod_term(t, f"{hard}[{i}]", pod, namespaces, problems)
            for i, t in enumerate(given.required_during_scheduling_ignored_during_execution or ())
        ),
        preferred=tuple(
            WeightedPodAffinityTerm(
                weight=w.weight,
                term=_pod_term(
                    w.pod_affinity_term, f"{soft}[{i}].podAffinityTerm", pod, namespaces, problems
                ),
            )
            for i, w in enumerate(given.preferred_during_scheduling_ignored_during_execution or ())
        ),
    )


def _tolerations(pod: Pod, problems: list[Problem]) -> tuple[Toleration, ...]:
    found: list[Toleration] = []
    for i, raw in enumerate(pod.spec.tolerations or ()):
        field = f"spec.tolerations[{i}]"
        given: _Toleration | None = _strict(raw, _Toleration, field, problems)
        if given is None:
            continue
        operator = given.operator or "Equal"
        effect = given.effect or ""
        if not _choice(operator, TOLERATION_OPERATORS, f"{field}.operator", problems):
            continue
        if effect and not _choice(effect, EFFECTS, f"{field}.effect", problems):
            continue
        found.append(
            Toleration(
                key=given.key or "",
                operator=operator,  # type: ignore[arg-type]  # checked just above
                value=given.value or "",
                effect=effect,  # type: ignore[arg-type]
            )
        )
    return tuple(found)


def _spread(pod: Pod, problems: list[Problem]) -> tuple[SpreadConstraint, ...]:
    found: list[SpreadConstraint] = []
    labels = pod.metadata.labels or {}
    for i, raw in enumerate(pod.spec.topology_spread_constraints or ()):
        field = f"spec.topologySpreadConstraints[{i}]"
        given: _Spread | None = _strict(raw, _Spread, field, problems)
        if given is None:
            continue
        checks = (
            _choice(
                given.when_unsatisfiable, WHEN_UNSATISFIABLE, f"{field}.whenUnsatisfiable", problems
            ),
            _choice(given.node_affinity_policy, POLICIES, f"{field}.nodeAffinityPolicy", problems),
            _choice(given.node_taints_policy, POLICIES, f"{field}.nodeTaintsPolicy", problems),
        )
        if given.max_skew < 1:
            problems.append((f"{field}.maxSkew", f"{given.max_skew} is not allowed; use 1 or more"))
        if given.min_domains is not None and given.min_domains < 1:
            problems.append(
                (f"{field}.minDomains", f"{given.min_domains} is not allowed; use 1 or more")
            )
        selector = _selector(given.label_selector, f"{field}.labelSelector", problems)
        if not all(checks):
            continue
        found.append(
            SpreadConstraint(
                max_skew=given.max_skew,
                topology_key=given.topology_key,
                when_unsatisfiable=given.when_unsatisfiable,  # type: ignore[arg-type]
                selector=_merged(selector, given.match_label_keys, "In", labels),
                min_domains=given.min_domains or 1,
                node_affinity_policy=given.node_affinity_policy or "Honor",  # type: ignore[arg-type]
                node_taints_policy=given.node_taints_policy or "Ignore",  # type: ignore[arg-type]
            )
        )
    return tuple(found)


def constraints_of(
    pod: Pod, namespaces: Mapping[str, Mapping[str, str]] | None = None
) -> tuple[Constraints | None, list[Problem]]:
    """The pod's constraints (None when it states none) and every problem with them.

    ``namespaces``: every namespace's labels, for namespace selectors (None: no namespace is
    known, so a selector matches none of them; the webhook checks a pod that way)."""
    problems: list[Problem] = []
    spec = pod.spec
    known = namespaces or {}
    node_affinity = pod_affinity = anti_affinity = None
    if spec.affinity is not None:
        affinity: _Affinity | None = _strict(spec.affinity, _Affinity, "spec.affinity", problems)
        if affinity is not None:
            if affinity.node_affinity is not None:
                node_affinity = _node_affinity(
                    affinity.node_affinity, "spec.affinity.nodeAffinity", problems
                )
            if affinity.pod_affinity is not None:
                pod_affinity = _pod_affinity(
                    affinity.pod_affinity, "spec.affinity.podAffinity", pod, known, problems
                )
            if affinity.pod_anti_affinity is not None:
                anti_affinity = _pod_affinity(
                    affinity.pod_anti_affinity,
                    "spec.affinity.podAntiAffinity",
                    pod,
                    known,
                    problems,
                )
    constraints = Constraints(
        node_selector=tuple(sorted((spec.node_selector or {}).items())),
        node_affinity=node_affinity if node_affinity != NodeAffinity() else None,
        tolerations=_tolerations(pod, problems),
        pod_affinity=pod_affinity if pod_affinity != PodAffinity() else None,
        pod_anti_affinity=anti_affinity if anti_affinity != PodAffinity() else None,
        spread=_spread(pod, problems),
    )
    if constraints == Constraints():
        return None, problems
    return constraints, problems


def uses_namespace_selector(pod: Pod) -> bool:
    """Whether a pod-affinity term of the pod names a namespace selector (what it selects moves
    as namespaces come, go and are labelled)."""
    affinity = pod.spec.affinity or {}
    return any(
        "namespaceSelector" in (weighted.get("podAffinityTerm") or weighted)
        for kind in ("podAffinity", "podAntiAffinity")
        for terms in (affinity.get(kind) or {}).values()
        if isinstance(terms, list)
        for weighted in terms
        if isinstance(weighted, dict)
    )


def scheduling_gates(pod: Pod) -> tuple[tuple[str, ...], list[Problem]]:
    """The names of the pod's scheduling gates (``spec.schedulingGates``): while any is left
    the pod is not placed (kube-scheduler's ``SchedulingGates``)."""
    problems: list[Problem] = []
    gates = _strict(
        list(pod.spec.scheduling_gates or ()), list[_Gate], "spec.schedulingGates", problems
    )
    return tuple(g.name for g in gates or ()), problems


def gated_message(gates: tuple[str, ...]) -> str:
    """What a gated pod's ``PodScheduled`` condition says, as kube-scheduler words it."""
    return f"waiting for scheduling gates: [{' '.join(gates)}]"
