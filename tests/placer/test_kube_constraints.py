"""kube-scheduler's own plugin test cases (``kube_cases.py``) run against the placement core:
each node's verdict for the pod, with the reason kube-scheduler words, each feasible node's
normalised score, and the node a decision picks."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from services.placer.core import cycle, nodeaware
from services.placer.core.facts import pod_facts
from services.placer.core.framework import Refusal
from services.placer.core.index import ClusterIndex
from services.placer.core.model import ContainerRequest, Decision, NodeState, PodRequest
from services.placer.core.profiles import NODE_RULES, build_profile
from shared.kubeobjects import Pod
from shared.messages.constraints import ExistingPod, Taint
from shared.scheduling import constraints_of
from tests.placer import kube_cases as k

PROFILE = build_profile("binpack")
"""Every node below has the same shape (nothing asks for CPU or GPUs), so the profile's own
score ties and the node rules alone order the nodes."""


def _pod(spec: dict[str, Any], labels: dict[str, str], namespace: str) -> Pod:
    return msgspec.convert(
        {
            "metadata": {"name": "p", "namespace": namespace, "uid": "p", "labels": labels},
            "spec": {"containers": [{"name": "c"}], **spec},
        },
        Pod,
    )


def request_of(case: k.Case) -> PodRequest:
    constraints, problems = constraints_of(
        _pod(case.spec, case.labels, case.namespace), case.namespaces
    )
    assert problems == []
    return PodRequest(
        uid="p",
        namespace=case.namespace,
        name="p",
        containers=(ContainerRequest(name="c", cpu_milli=100),),
        labels=tuple(sorted(case.labels.items())),
        constraints=constraints,
    )


def existing(pod: k.Existing, number: int) -> ExistingPod:
    affinity = anti = None
    if pod.affinity is not None:
        constraints, problems = constraints_of(
            _pod({"affinity": pod.affinity}, pod.labels, pod.namespace)
        )
        assert problems == [] and constraints is not None
        affinity, anti = constraints.pod_affinity, constraints.pod_anti_affinity
    return ExistingPod(
        uid=f"existing-{number}",
        namespace=pod.namespace,
        labels=pod.labels,
        affinity=affinity,
        anti_affinity=anti,
    )


def cluster_of(case: k.Case) -> ClusterIndex:
    on: dict[str, list[ExistingPod]] = {}
    for number, pod in enumerate(case.pods):
        on.setdefault(pod.node, []).append(existing(pod, number))
    return ClusterIndex(
        NodeState(
            name=node.name,
            cpu_milli_total=4_000,
            memory_mib_total=8_192,
            schedulable=not node.failed,
            labels=node.labels,
            taints=tuple(msgspec.convert(t, Taint) for t in node.taints),
            pods=tuple(on.get(node.name, ())),
        )
        for node in case.nodes
    )


def judged(case: k.Case) -> dict[str, nodeaware.Verdict]:
    cluster = cluster_of(case)
    names = [n.name for n in case.nodes]
    found = nodeaware.verdicts(pod_facts(request_of(case)), cluster, PROFILE, names)
    if found is None:  # nothing for the rules to say: every node fits with the profile's score
        return {name: (None, 0.0, {}) for name in names}
    return found


def reason_text(reason: str | Refusal | None) -> str | None:
    return reason.reason if isinstance(reason, Refusal) else reason


def _ids(cases: tuple[k.Case, ...]) -> list[str]:
    return [c.name[:80] for c in cases]


FILTER_CASES = (
    *k.NODE_AFFINITY,
    *k.TAINT_FILTER,
    *k.SPREAD_FILTER,
    *k.INTERPOD_FILTER,
    *k.NAMESPACE_SELECTOR,
)


@pytest.mark.parametrize("case", FILTER_CASES, ids=_ids(FILTER_CASES))
def test_filter_cases_fit_where_kube_scheduler_says(case: k.Case) -> None:
    assert case.fits is not None
    verdicts = judged(case)
    assert {name: reason_text(v[0]) for name, v in verdicts.items()} == case.fits
    decision = cycle.decide(request_of(case), cluster_of(case), PROFILE, now=0.0)
    fitting = sorted(name for name, reason in case.fits.items() if reason is None)
    if fitting:
        assert isinstance(decision, Decision)
        assert decision.node in fitting
    else:
        assert not isinstance(decision, Decision)
        counted: dict[str, int] = {}
        for reason in case.fits.values():
            assert reason is not None
            counted[reason] = counted.get(reason, 0) + 1
        assert {r.reason: r.nodes for r in decision.reasons} == counted


SCORE_CASES: tuple[tuple[str, k.Case], ...] = (
    *(("NodeAffinity", c) for c in k.NODE_AFFINITY_SCORES),
    *(("TaintToleration", c) for c in k.TAINT_SCORES),
    *(("PodTopologySpread", c) for c in k.SPREAD_SCORES),
    *(("InterPodAffinity", c) for c in k.INTERPOD_SCORES),
)


@pytest.mark.parametrize(("rule", "case"), SCORE_CASES, ids=[c.name[:80] for _, c in SCORE_CASES])
def test_score_cases_order_nodes_as_kube_scheduler_does(rule: str, case: k.Case) -> None:
    assert case.scores is not None
    weight = NODE_RULES[rule]().weight
    verdicts = judged(case)
    feasible = {name: v for name, v in verdicts.items() if v[0] is None}
    assert set(feasible) == set(case.scores)
    scored = {n: v[2][rule] / weight for n, v in feasible.items() if rule in v[2]}
    if scored:
        assert scored == {n: float(s) for n, s in case.scores.items()}
    else:  # the rule did not score: kube-scheduler gives every node the same, which orders none
        assert len(set(case.scores.values())) == 1
    # The decision takes the best-scored node (the first by name among equals).
    best = max(case.scores.values())
    decision = cycle.decide(request_of(case), cluster_of(case), PROFILE, now=0.0)
    assert isinstance(decision, Decision)
    assert decision.node == min(n for n, s in case.scores.items() if s == best)
