"""Pure: Kubernetes' matching rules over ``shared.messages.constraints``, as kube-scheduler and
the API machinery apply them.

- a label selector (``metav1.LabelSelector``): every ``matchLabels`` pair and every
  requirement holds; an empty selector matches everything, a missing one (None) nothing;
- a node selector term: every ``matchExpressions`` requirement holds on the node's labels and
  every ``matchFields`` one on its name; a term with neither matches no node; ``Gt`` and
  ``Lt`` compare integers (a value that is not one matches nothing);
- a node's required affinity: ``nodeSelector`` pairs all present, and one required term holds;
- a toleration tolerates a taint when the effects agree (an empty effect: any), and the keys
  agree (an empty key with ``Exists``: any) and, for ``Equal``, the values.

Shared by the placer's core (node and pod constraints) and the binder (namespace selectors).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from shared.messages.constraints import (
    Constraints,
    LabelSelector,
    NodeSelectorTerm,
    PodAffinityTerm,
    Requirement,
    Taint,
    Toleration,
)

NAME_FIELD = "metadata.name"
"""The one field ``matchFields`` may name."""


def _integer(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def requirement_holds(requirement: Requirement, value: str | None) -> bool:
    """Whether ``requirement`` holds for a label (or field) whose value is ``value`` (None:
    absent)."""
    operator = requirement.operator
    if operator == "In":
        return value is not None and value in requirement.values
    if operator == "NotIn":
        return value is None or value not in requirement.values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if value is None or len(requirement.values) != 1:
        return False
    have, bound = _integer(value), _integer(requirement.values[0])
    if have is None or bound is None:
        return False
    return have > bound if operator == "Gt" else have < bound


def selector_matches(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` match ``selector`` (None matches nothing, an empty one everything)."""
    if selector is None:
        return False
    for key, value in selector.match_labels:
        if labels.get(key) != value:
            return False
    return all(requirement_holds(r, labels.get(r.key)) for r in selector.match_expressions)


def term_matches_node(term: NodeSelectorTerm, name: str, labels: Mapping[str, str]) -> bool:
    if not term.match_expressions and not term.match_fields:
        return False
    for requirement in term.match_expressions:
        if not requirement_holds(requirement, labels.get(requirement.key)):
            return False
    for requirement in term.match_fields:
        field = name if requirement.key == NAME_FIELD else None
        if not requirement_holds(requirement, field):
            return False
    return True


def required_affinity_matches(
    constraints: Constraints, name: str, labels: Mapping[str, str]
) -> bool:
    """Whether the node ``name`` with ``labels`` satisfies the pod's ``nodeSelector`` and
    required node affinity (kube-scheduler's ``RequiredNodeAffinity.Match``)."""
    for key, value in constraints.node_selector:
        if labels.get(key) != value:
            return False
    affinity = constraints.node_affinity
    if affinity is None or affinity.required is None:
        return True
    return any(term_matches_node(term, name, labels) for term in affinity.required)


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator == "Exists":
        return True
    return toleration.value == taint.value


def untolerated(
    taints: Iterable[Taint], tolerations: Iterable[Toleration], effects: frozenset[str]
) -> Taint | None:
    """The first of ``taints`` with one of ``effects`` that no toleration tolerates."""
    kept = tuple(tolerations)
    for taint in taints:
        if taint.effect in effects and not any(tolerates(t, taint) for t in kept):
            return taint
    return None


def term_matches_pod(term: PodAffinityTerm, namespace: str, labels: Mapping[str, str]) -> bool:
    """Whether a pod of ``namespace`` with ``labels`` is one ``term`` selects."""
    if not term.all_namespaces and namespace not in term.namespaces:
        return False
    return selector_matches(term.selector, labels)


def namespaces_matching(
    selector: LabelSelector, namespaces: Mapping[str, Mapping[str, str]]
) -> list[str]:
    """The names of ``namespaces`` (name -> labels) whose labels ``selector`` matches."""
    return sorted(name for name, labels in namespaces.items() if selector_matches(selector, labels))
