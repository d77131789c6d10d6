"""A pod's scheduling constraints read strictly: what Tessera implements becomes ``Constraints``
(namespace selectors resolved, ``matchLabelKeys`` merged), anything else a problem naming the
field, never skipped."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shared.kubeobjects import Pod
from shared.messages.constraints import (
    Constraints,
    LabelSelector,
    NodeAffinity,
    NodeSelectorTerm,
    PodAffinity,
    PodAffinityTerm,
    PreferredNodeTerm,
    Requirement,
    SpreadConstraint,
    Toleration,
    WeightedPodAffinityTerm,
)
from shared.podspec import InvalidPod, parse_pending
from shared.scheduling import constraints_of, gated_message, scheduling_gates

NAMESPACES = {
    "team-a": {"team": "a"},
    "team-a2": {"team": "a"},
    "team-b": {"team": "b"},
}


def pod_with(spec: dict[str, Any], labels: dict[str, str] | None = None) -> Pod:
    return msgspec.convert(
        {
            "metadata": {"name": "p", "namespace": "ml", "uid": "u", "labels": labels or {}},
            "spec": {"containers": [{"name": "c"}], **spec},
        },
        Pod,
    )


def read(spec: dict[str, Any], labels: dict[str, str] | None = None) -> Constraints | None:
    constraints, problems = constraints_of(pod_with(spec, labels), NAMESPACES)
    assert problems == []
    return constraints


def test_a_pod_without_constraints_has_none() -> None:
    assert read({}) is None
    assert read({"affinity": {}, "tolerations": [], "nodeSelector": {}}) is None


def test_every_field_tessera_implements_is_read() -> None:
    hard = "requiredDuringSchedulingIgnoredDuringExecution"
    soft = "preferredDuringSchedulingIgnoredDuringExecution"
    constraints = read(
        {
            "nodeSelector": {"zone": "a", "disk": "ssd"},
            "affinity": {
                "nodeAffinity": {
                    hard: {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "gen", "operator": "Gt", "values": ["3"]}
                                ],
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": ["n1"]}
                                ],
                            }
                        ]
                    },
                    soft: [
                        {
                            "weight": 7,
                            "preference": {
                                "matchExpressions": [{"key": "spot", "operator": "DoesNotExist"}]
                            },
                        }
                    ],
                },
                "podAffinity": {
                    soft: [
                        {
                            "weight": 3,
                            "podAffinityTerm": {
                                "labelSelector": {"matchLabels": {"app": "cache"}},
                                "namespaceSelector": {"matchLabels": {"team": "a"}},
                                "topologyKey": "zone",
                            },
                        }
                    ]
                },
                "podAntiAffinity": {
                    hard: [
                        {
                            "labelSelector": {"matchLabels": {"app": "web"}},
                            "topologyKey": "kubernetes.io/hostname",
                            "matchLabelKeys": ["pod-template-hash"],
                        },
                        {
                            "labelSelector": {"matchLabels": {"app": "db"}},
                            "namespaceSelector": {},
                            "namespaces": ["x"],
                            "topologyKey": "zone",
                        },
                    ]
                },
            },
            "tolerations": [
                {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "spot", "value": "yes", "tolerationSeconds": 30, "effect": "NoExecute"},
            ],
            "topologySpreadConstraints": [
                {
                    "maxSkew": 2,
                    "topologyKey": "zone",
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
                    "minDomains": 3,
                    "nodeAffinityPolicy": "Ignore",
                    "nodeTaintsPolicy": "Honor",
                    "matchLabelKeys": ["pod-template-hash"],
                }
            ],
        },
        labels={"app": "web", "pod-template-hash": "abc"},
    )
    hash_in = Requirement(key="pod-template-hash", operator="In", values=("abc",))
    assert constraints == Constraints(
        node_selector=(("disk", "ssd"), ("zone", "a")),
        node_affinity=NodeAffinity(
            required=(
                NodeSelectorTerm(
                    match_expressions=(Requirement(key="gen", operator="Gt", values=("3",)),),
                    match_fields=(Requirement(key="metadata.name", operator="In", values=("n1",)),),
                ),
            ),
            preferred=(
                PreferredNodeTerm(
                    weight=7,
                    term=NodeSelectorTerm(
                        match_expressions=(Requirement(key="spot", operator="DoesNotExist"),)
                    ),
                ),
            ),
        ),
        tolerations=(
            Toleration(key="gpu", operator="Exists", effect="NoSchedule"),
            Toleration(key="spot", value="yes", effect="NoExecute"),
        ),
        pod_affinity=PodAffinity(
            preferred=(
                WeightedPodAffinityTerm(
                    weight=3,
                    term=PodAffinityTerm(
                        selector=LabelSelector(match_labels=(("app", "cache"),)),
                        namespaces=("team-a", "team-a2"),
                        topology_key="zone",
                    ),
                ),
            )
        ),
        pod_anti_affinity=PodAffinity(
            required=(
                PodAffinityTerm(
                    selector=LabelSelector(
                        match_labels=(("app", "web"),), match_expressions=(hash_in,)
                    ),
                    namespaces=("ml",),
                    topology_key="kubernetes.io/hostname",
                ),
                PodAffinityTerm(
                    selector=LabelSelector(match_labels=(("app", "db"),)),
                    namespaces=("x",),
                    all_namespaces=True,
                    topology_key="zone",
                ),
            )
        ),
        spread=(
            SpreadConstraint(
                max_skew=2,
                topology_key="zone",
                when_unsatisfiable="ScheduleAnyway",
                selector=LabelSelector(
                    match_expressions=(Requirement(key="app", operator="Exists"), hash_in)
                ),
                min_domains=3,
                node_affinity_policy="Ignore",
                node_taints_policy="Honor",
            ),
        ),
    )
    assert constraints is not None and constraints.counts_pods


@pytest.mark.parametrize(
    ("spec", "field", "says"),
    [
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "a", "operator": "Near"}]}
                            ]
                        }
                    }
                }
            },
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0].matchExpressions[0].operator",
            "'Near' is not implemented by Tessera",
        ),
        (
            {"affinity": {"nodeAffinity": {"requiredDuringSchedulingRequiredDuringExecution": {}}}},
            "spec.affinity.nodeAffinity.requiredDuringSchedulingRequiredDuringExecution",
            "Tessera does not implement this field",
        ),
        (
            {"tolerations": [{"key": "sla", "operator": "Gt", "value": "950"}]},
            "spec.tolerations[0].operator",
            "known: Equal, Exists",
        ),
        (
            {"tolerations": [{"key": "k", "effect": "NoScheduleSoon"}]},
            "spec.tolerations[0].effect",
            "'NoScheduleSoon' is not implemented",
        ),
        (
            {
                "topologySpreadConstraints": [
                    {"maxSkew": 1, "topologyKey": "z", "whenUnsatisfiable": "Sometimes"}
                ]
            },
            "spec.topologySpreadConstraints[0].whenUnsatisfiable",
            "known: DoNotSchedule, ScheduleAnyway",
        ),
        (
            {
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": "z",
                        "whenUnsatisfiable": "DoNotSchedule",
                        "nodeTaintsPolicy": "Maybe",
                    }
                ]
            },
            "spec.topologySpreadConstraints[0].nodeTaintsPolicy",
            "known: Honor, Ignore",
        ),
        (
            {
                "affinity": {
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "labelSelector": {
                                    "matchExpressions": [
                                        {"key": "s", "operator": "In", "values": ["{{.bad}}"]}
                                    ]
                                },
                                "topologyKey": "zone",
                            }
                        ]
                    }
                }
            },
            "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
            ".labelSelector.matchExpressions[0].values",
            "not a valid label value",
        ),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "v", "operator": "Lt", "values": ["ten"]}
                                    ]
                                }
                            ]
                        }
                    }
                }
            },
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0].matchExpressions[0].values",
            "Lt compares integers",
        ),
    ],
)
def test_what_tessera_does_not_implement_is_refused_naming_the_field(
    spec: dict[str, Any], field: str, says: str
) -> None:
    parsed = parse_pending(pod_with(spec))
    assert isinstance(parsed, InvalidPod)
    assert [e.field for e in parsed.errors] == [field]
    assert says in parsed.errors[0].problem
    assert field in parsed.reason


def test_the_pending_pod_carries_its_labels_and_constraints() -> None:
    parsed = parse_pending(
        pod_with({"nodeSelector": {"kubernetes.io/hostname": "node-1"}}, {"app": "x"})
    )
    assert not isinstance(parsed, InvalidPod)
    assert parsed.labels == {"app": "x"}
    assert parsed.constraints == Constraints(node_selector=(("kubernetes.io/hostname", "node-1"),))


def test_scheduling_gates_are_read_and_worded_as_kube_scheduler_words_them() -> None:
    gates, problems = scheduling_gates(
        pod_with({"schedulingGates": [{"name": "example.com/quota"}, {"name": "b"}]})
    )
    assert (gates, problems) == (("example.com/quota", "b"), [])
    assert gated_message(gates) == "waiting for scheduling gates: [example.com/quota b]"
    assert scheduling_gates(pod_with({})) == ((), [])
