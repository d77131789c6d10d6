"""kube-scheduler's own test cases for its NodeAffinity, TaintToleration, PodTopologySpread and
InterPodAffinity plugins, carried over as data (``pkg/scheduler/framework/plugins/<plugin>/
*_test.go`` in kubernetes/kubernetes; each case keeps its name there).

A case is a pod spec (the API's JSON, read by ``shared.scheduling`` as the binder reads it), the
nodes (labels, taints), the pods already on them, and kube-scheduler's verdict: which nodes fit
(with the reason of those that do not) or each node's normalised score. Builders follow the
Go tests' (``st.MakePod()...``) so that a case reads like its original.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

HOSTNAME = "kubernetes.io/hostname"

Obj = dict[str, Any]


@dataclass(frozen=True)
class Node:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Obj, ...] = ()
    failed: bool = False
    """A node that fails other filters (the Go tests' ``failedNodes``): its pods count, it is no
    candidate."""


@dataclass(frozen=True)
class Existing:
    node: str
    labels: dict[str, str] = field(default_factory=dict)
    namespace: str = ""
    affinity: Obj | None = None
    """The pod's ``spec.affinity``."""


@dataclass(frozen=True)
class Case:
    name: str
    spec: Obj
    """The incoming pod's spec (scheduling fields only)."""
    nodes: tuple[Node, ...]
    pods: tuple[Existing, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    namespace: str = ""
    fits: dict[str, str | None] | None = None
    """Node -> None (fits) or the reason it does not."""
    scores: dict[str, int] | None = None
    """Node -> the plugin's normalised score (feasible nodes only)."""
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)


# --- builders ---------------------------------------------------------------------------------


def req(key: str, operator: str, *values: str) -> Obj:
    found: Obj = {"key": key, "operator": operator}
    if values:
        found["values"] = list(values)
    return found


def node_affinity(*terms: list[Obj], fields: list[Obj] | None = None) -> Obj:
    """``affinity`` with required node-selector terms (each a list of matchExpressions)."""
    selector = [{"matchExpressions": t} for t in terms]
    if fields is not None:
        selector.append({"matchFields": fields})
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": selector}
        }
    }


def preferred_node(*terms: tuple[int, list[Obj]]) -> Obj:
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": w, "preference": {"matchExpressions": e}} for w, e in terms
            ]
        }
    }


def taint(key: str, value: str, effect: str) -> Obj:
    return {"key": key, "value": value, "effect": effect}


def toleration(key: str, operator: str = "Equal", value: str = "", effect: str = "") -> Obj:
    found: Obj = {"key": key, "operator": operator}
    if value:
        found["value"] = value
    if effect:
        found["effect"] = effect
    return found


def selector(*expressions: Obj, **labels: str) -> Obj:
    found: Obj = {}
    if expressions:
        found["matchExpressions"] = list(expressions)
    if labels:
        found["matchLabels"] = labels
    return found


def exists(key: str) -> Obj:
    return selector(req(key, "Exists"))


def pod_term(
    labels: Obj | None,
    key: str,
    namespaces: list[str] | None = None,
    namespace_selector: Obj | None = None,
) -> Obj:
    found: Obj = {"topologyKey": key}
    if labels is not None:
        found["labelSelector"] = labels
    if namespaces is not None:
        found["namespaces"] = namespaces
    if namespace_selector is not None:
        found["namespaceSelector"] = namespace_selector
    return found


def pod_affinity(
    affinity: list[Obj] | None = None,
    anti: list[Obj] | None = None,
    preferred: list[tuple[int, Obj]] | None = None,
    preferred_anti: list[tuple[int, Obj]] | None = None,
) -> Obj:
    found: Obj = {}
    hard = "requiredDuringSchedulingIgnoredDuringExecution"
    soft = "preferredDuringSchedulingIgnoredDuringExecution"
    if affinity is not None or preferred is not None:
        found["podAffinity"] = {}
    if anti is not None or preferred_anti is not None:
        found["podAntiAffinity"] = {}
    if affinity is not None:
        found["podAffinity"][hard] = affinity
    if preferred is not None:
        found["podAffinity"][soft] = [{"weight": w, "podAffinityTerm": t} for w, t in preferred]
    if anti is not None:
        found["podAntiAffinity"][hard] = anti
    if preferred_anti is not None:
        found["podAntiAffinity"][soft] = [
            {"weight": w, "podAffinityTerm": t} for w, t in preferred_anti
        ]
    return found


def spread(skew: int, key: str, when: str, labels: Obj | None, **more: Any) -> Obj:
    found: Obj = {"maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": when, **more}
    if labels is not None:
        found["labelSelector"] = labels
    return found


def zones(*names: str, **more: str) -> tuple[Node, ...]:
    """``node-a``.. with ``zone`` and ``node`` labels: "a1" is node-a in zone1."""
    return tuple(
        Node(f"node-{n[0]}", {"zone": f"zone{n[1]}", "node": f"node-{n[0]}", **more}) for n in names
    )


def foo_pods(**counts: int) -> tuple[Existing, ...]:
    """``a=2`` -> two pods labelled ``foo`` on node-a."""
    return tuple(Existing(f"node-{n}", {"foo": ""}) for n, k in counts.items() for _ in range(k))


NOT_MATCHED = "node(s) didn't match Pod's node affinity/selector"
SKEW = "node(s) didn't match pod topology spread constraints"
NO_LABEL = "node(s) didn't match pod topology spread constraints (missing required label)"
AFFINITY = "node(s) didn't match pod affinity rules"
ANTI = "node(s) didn't match pod anti-affinity rules"
EXISTING = "node(s) didn't satisfy existing pods anti-affinity rules"


def untolerated(key: str, value: str) -> str:
    return f"node(s) had untolerated taint {{{key}: {value}}}"


# --- nodeaffinity/node_affinity_test.go: TestNodeAffinity -------------------------------------


def _one(name: str, spec: Obj, labels: dict[str, str], fits: bool, node: str = "node1") -> Case:
    return Case(
        name=name,
        spec=spec,
        nodes=(Node(node, labels),),
        fits={node: None if fits else NOT_MATCHED},
    )


NODE_AFFINITY: tuple[Case, ...] = (
    _one("missing labels", {"nodeSelector": {"foo": "bar"}}, {}, False),
    _one("same labels", {"nodeSelector": {"foo": "bar"}}, {"foo": "bar"}, True),
    _one(
        "node labels are superset",
        {"nodeSelector": {"foo": "bar"}},
        {"foo": "bar", "baz": "blah"},
        True,
    ),
    _one(
        "node labels are subset",
        {"nodeSelector": {"foo": "bar", "baz": "blah"}},
        {"foo": "bar"},
        False,
    ),
    _one(
        "Pod with matchExpressions using In operator that matches the existing node",
        {"affinity": node_affinity([req("foo", "In", "bar", "value2")])},
        {"foo": "bar"},
        True,
    ),
    _one(
        "Pod with matchExpressions using Gt operator that matches the existing node",
        {"affinity": node_affinity([req("kernel-version", "Gt", "0204")])},
        {"kernel-version": "0206"},
        True,
    ),
    _one(
        "Pod with matchExpressions using NotIn operator that matches the existing node",
        {"affinity": node_affinity([req("mem-type", "NotIn", "DDR", "DDR2")])},
        {"mem-type": "DDR3"},
        True,
    ),
    _one(
        "Pod with matchExpressions using Exists operator that matches the existing node",
        {"affinity": node_affinity([req("GPU", "Exists")])},
        {"GPU": "NVIDIA-GRID-K1"},
        True,
    ),
    _one(
        "Pod with affinity that don't match node's labels won't schedule onto the node",
        {"affinity": node_affinity([req("foo", "In", "value1", "value2")])},
        {"foo": "bar"},
        False,
    ),
    _one(
        "Pod with empty MatchExpressions is not a valid value will match no objects and won't "
        "schedule onto the node",
        {"affinity": node_affinity([])},
        {"foo": "bar"},
        False,
    ),
    _one("Pod with no Affinity will schedule onto a node", {}, {"foo": "bar"}, True),
    _one(
        "Pod with Affinity but nil NodeSelector will schedule onto a node",
        {"affinity": {"nodeAffinity": {}}},
        {"foo": "bar"},
        True,
    ),
    _one(
        "Pod with multiple matchExpressions ANDed that matches the existing node",
        {"affinity": node_affinity([req("GPU", "Exists"), req("GPU", "NotIn", "AMD", "INTER")])},
        {"GPU": "NVIDIA-GRID-K1"},
        True,
    ),
    _one(
        "Pod with multiple matchExpressions ANDed that doesn't match the existing node",
        {"affinity": node_affinity([req("GPU", "Exists"), req("GPU", "In", "AMD", "INTER")])},
        {"GPU": "NVIDIA-GRID-K1"},
        False,
    ),
    _one(
        "Pod with multiple NodeSelectorTerms ORed in affinity, matches the node's labels and will "
        "schedule onto the node",
        {
            "affinity": node_affinity(
                [req("foo", "In", "bar", "value2")], [req("diffkey", "In", "wrong", "value2")]
            )
        },
        {"foo": "bar"},
        True,
    ),
    _one(
        "Pod with an Affinity and a PodSpec.NodeSelector(the old thing that we are deprecating) "
        "both are satisfied, will schedule onto the node",
        {"nodeSelector": {"foo": "bar"}, "affinity": node_affinity([req("foo", "Exists")])},
        {"foo": "bar"},
        True,
    ),
    _one(
        "Pod with an Affinity matches node's labels but the PodSpec.NodeSelector(the old thing "
        "that we are deprecating) is not satisfied, won't schedule onto the node",
        {"nodeSelector": {"foo": "bar"}, "affinity": node_affinity([req("foo", "Exists")])},
        {"foo": "barrrrrr"},
        False,
    ),
    _one(
        "Pod with matchFields using In operator that matches the existing node",
        {"affinity": node_affinity(fields=[req("metadata.name", "In", "node1")])},
        {},
        True,
        node="node1",
    ),
    _one(
        "Pod with matchFields using In operator that does not match the existing node",
        {"affinity": node_affinity(fields=[req("metadata.name", "In", "node1")])},
        {},
        False,
        node="node2",
    ),
    _one(
        "Pod with two terms: matchFields does not match, but matchExpressions matches",
        {
            "affinity": node_affinity(
                [req("foo", "In", "bar")],
                fields=[req("metadata.name", "In", "node1")],
            )
        },
        {"foo": "bar"},
        True,
        node="node2",
    ),
    _one(
        "Pod with one term: matchFields does not match, but matchExpressions matches",
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [req("metadata.name", "In", "node1")],
                                "matchExpressions": [req("foo", "In", "bar")],
                            }
                        ]
                    }
                }
            }
        },
        {"foo": "bar"},
        False,
        node="node2",
    ),
    _one(
        "Pod with one term: both matchFields and matchExpressions match",
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [req("metadata.name", "In", "node1")],
                                "matchExpressions": [req("foo", "In", "bar")],
                            }
                        ]
                    }
                }
            }
        },
        {"foo": "bar"},
        True,
        node="node1",
    ),
    _one(
        "Pod with two terms: both matchFields and matchExpressions do not match",
        {
            "affinity": node_affinity(
                [req("foo", "In", "not-match-to-bar")],
                fields=[req("metadata.name", "In", "node1")],
            )
        },
        {"foo": "bar"},
        False,
        node="node2",
    ),
    _one(
        "Pod with two conflicting mach field requirements",
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    req("metadata.name", "In", "node1"),
                                    req("metadata.name", "In", "node2"),
                                ]
                            }
                        ]
                    }
                }
            }
        },
        {"foo": "bar"},
        False,
        node="node2",
    ),
)

_LABEL1 = {"foo": "bar"}
_LABEL2 = {"key": "value"}
_LABEL3 = {"az": "az1"}
_LABEL4 = {"abc": "az11", "def": "az22"}
_LABEL5 = {"foo": "bar", "key": "value", "az": "az1"}
_AFFINITY1 = preferred_node((2, [req("foo", "In", "bar")]))
_AFFINITY2 = preferred_node(
    (2, [req("foo", "In", "bar")]),
    (4, [req("key", "In", "value")]),
    (5, [req("foo", "In", "bar"), req("key", "In", "value"), req("az", "In", "az1")]),
)

# --- nodeaffinity/node_affinity_test.go: TestNodeAffinityPriority ------------------------------

NODE_AFFINITY_SCORES: tuple[Case, ...] = (
    Case(
        name="no node matches preferred scheduling requirements in NodeAffinity of pod so all "
        "nodes' priority is zero",
        spec={"affinity": _AFFINITY1},
        nodes=(Node("node1", _LABEL4), Node("node2", _LABEL2), Node("node3", _LABEL3)),
        scores={"node1": 0, "node2": 0, "node3": 0},
    ),
    Case(
        name="only node1 matches the preferred scheduling requirements of pod",
        spec={"affinity": _AFFINITY1},
        nodes=(Node("node1", _LABEL1), Node("node2", _LABEL2), Node("node3", _LABEL3)),
        scores={"node1": 100, "node2": 0, "node3": 0},
    ),
    Case(
        name="all nodes matches the preferred scheduling requirements of pod but with different "
        "priorities ",
        spec={"affinity": _AFFINITY2},
        nodes=(Node("node1", _LABEL1), Node("node5", _LABEL5), Node("node2", _LABEL2)),
        scores={"node1": 18, "node5": 100, "node2": 36},
    ),
)

# --- tainttoleration/taint_toleration_test.go: TestTaintTolerationFilter ----------------------

_DEDICATED1 = taint("dedicated", "user1", "NoSchedule")


def _tainted(name: str, tolerations: list[Obj], taints: list[Obj], reason: str | None) -> Case:
    return Case(
        name=name,
        spec={"tolerations": tolerations},
        nodes=(Node("nodeA", taints=tuple(taints)),),
        fits={"nodeA": reason},
    )


TAINT_FILTER: tuple[Case, ...] = (
    _tainted(
        "A pod having no tolerations can't be scheduled onto a node with nonempty taints",
        [],
        [_DEDICATED1],
        untolerated("dedicated", "user1"),
    ),
    _tainted(
        "A pod which can be scheduled on a dedicated node assigned to user1 with effect NoSchedule",
        [toleration("dedicated", value="user1", effect="NoSchedule")],
        [_DEDICATED1],
        None,
    ),
    _tainted(
        "A pod which can't be scheduled on a dedicated node assigned to user2 with effect "
        "NoSchedule",
        [toleration("dedicated", "Equal", "user2", "NoSchedule")],
        [_DEDICATED1],
        untolerated("dedicated", "user1"),
    ),
    _tainted(
        "A pod can be scheduled onto the node, with a toleration uses operator Exists that "
        "tolerates the taints on the node",
        [toleration("foo", "Exists", effect="NoSchedule")],
        [taint("foo", "bar", "NoSchedule")],
        None,
    ),
    _tainted(
        "A pod has multiple tolerations, node has multiple taints, all the taints are "
        "tolerated, pod can be scheduled onto the node",
        [
            toleration("dedicated", "Equal", "user2", "NoSchedule"),
            toleration("foo", "Exists", effect="NoSchedule"),
        ],
        [taint("dedicated", "user2", "NoSchedule"), taint("foo", "bar", "NoSchedule")],
        None,
    ),
    _tainted(
        "A pod has a toleration that keys and values match the taint on the node, but "
        "(non-empty) effect doesn't match, can't be scheduled onto the node",
        [toleration("foo", "Equal", "bar", "PreferNoSchedule")],
        [taint("foo", "bar", "NoSchedule")],
        untolerated("foo", "bar"),
    ),
    _tainted(
        "The pod has a toleration that keys and values match the taint on the node, the effect "
        "of toleration is empty, and the effect of taint is NoSchedule. Pod can be scheduled "
        "onto the node",
        [toleration("foo", "Equal", "bar")],
        [taint("foo", "bar", "NoSchedule")],
        None,
    ),
    _tainted(
        "The pod has a toleration that key and value don't match the taint on the node, but the "
        "effect of taint on node is PreferNoSchedule. Pod can be scheduled onto the node",
        [toleration("dedicated", "Equal", "user2", "NoSchedule")],
        [taint("dedicated", "user1", "PreferNoSchedule")],
        None,
    ),
    _tainted(
        "The pod has no toleration, but the effect of taint on node is PreferNoSchedule. Pod "
        "can be scheduled onto the node",
        [],
        [taint("dedicated", "user1", "PreferNoSchedule")],
        None,
    ),
    # Not in the Go table (its operators are tested in component-helpers): an empty key with
    # Exists, and a NoExecute taint.
    _tainted(
        "The pod has an Exists toleration with an empty key: it tolerates every taint",
        [{"operator": "Exists"}],
        [_DEDICATED1, taint("foo", "bar", "NoExecute")],
        None,
    ),
    _tainted(
        "A NoExecute taint keeps a pod off as a NoSchedule one does",
        [toleration("dedicated", value="user1", effect="NoSchedule")],
        [_DEDICATED1, taint("evict", "now", "NoExecute")],
        untolerated("evict", "now"),
    ),
)

# --- tainttoleration/taint_toleration_test.go: TestTaintTolerationScore -----------------------

_CPU_ARM = taint("cpu-type", "arm64", "PreferNoSchedule")
_DISK_SSD = taint("disk-type", "ssd", "PreferNoSchedule")

TAINT_SCORES: tuple[Case, ...] = (
    Case(
        name="node with taints tolerated by the pod, gets a higher score than those node with "
        "intolerable taints",
        spec={"tolerations": [toleration("foo", "Equal", "bar", "PreferNoSchedule")]},
        nodes=(
            Node("nodeA", taints=(taint("foo", "bar", "PreferNoSchedule"),)),
            Node("nodeB", taints=(taint("foo", "blah", "PreferNoSchedule"),)),
        ),
        scores={"nodeA": 100, "nodeB": 0},
    ),
    Case(
        name="the nodes that all of their taints are tolerated by the pod, get the same score, "
        "no matter how many tolerable taints a node has",
        spec={
            "tolerations": [
                toleration("cpu-type", "Equal", "arm64", "PreferNoSchedule"),
                toleration("disk-type", "Equal", "ssd", "PreferNoSchedule"),
            ]
        },
        nodes=(
            Node("nodeA"),
            Node("nodeB", taints=(_CPU_ARM,)),
            Node("nodeC", taints=(_CPU_ARM, _DISK_SSD)),
        ),
        scores={"nodeA": 100, "nodeB": 100, "nodeC": 100},
    ),
    Case(
        name="the more intolerable taints a node has, the lower score it gets.",
        spec={"tolerations": [toleration("foo", "Equal", "bar", "PreferNoSchedule")]},
        nodes=(
            Node("nodeA"),
            Node("nodeB", taints=(_CPU_ARM,)),
            Node("nodeC", taints=(_CPU_ARM, _DISK_SSD)),
        ),
        scores={"nodeA": 100, "nodeB": 50, "nodeC": 0},
    ),
    Case(
        name="only taints and tolerations that have effect PreferNoSchedule are checked by "
        "taints-tolerations priority function",
        spec={
            "tolerations": [
                toleration("cpu-type", "Equal", "arm64", "NoSchedule"),
                toleration("disk-type", "Equal", "ssd", "NoSchedule"),
            ]
        },
        nodes=(
            Node("nodeA"),
            Node("nodeB", taints=(taint("cpu-type", "arm64", "NoSchedule"),)),
            Node("nodeC", taints=(_CPU_ARM, _DISK_SSD)),
        ),
        scores={"nodeA": 100, "nodeB": 100, "nodeC": 0},
    ),
    Case(
        name="Default behaviour No taints and tolerations, lands on node with no taints",
        spec={},
        nodes=(Node("nodeA"), Node("nodeB", taints=(_CPU_ARM,))),
        scores={"nodeA": 100, "nodeB": 0},
    ),
)

# --- podtopologyspread/filtering_test.go: TestSingleConstraint, TestMultipleConstraints --------

_ZONES = zones("a1", "b1", "x2", "y2")
_FOO = {"foo": ""}

SPREAD_FILTER: tuple[Case, ...] = (
    Case(
        name="no existing pods",
        labels=_FOO,
        spec={"topologySpreadConstraints": [spread(1, "zone", "DoNotSchedule", exists("foo"))]},
        nodes=_ZONES,
        fits=dict.fromkeys(("node-a", "node-b", "node-x", "node-y")),
    ),
    Case(
        name="no existing pods, incoming pod doesn't match itself",
        labels=_FOO,
        spec={"topologySpreadConstraints": [spread(1, "zone", "DoNotSchedule", exists("bar"))]},
        nodes=_ZONES,
        fits=dict.fromkeys(("node-a", "node-b", "node-x", "node-y")),
    ),
    Case(
        name="existing pods in a different namespace do not count",
        labels=_FOO,
        spec={"topologySpreadConstraints": [spread(1, "zone", "DoNotSchedule", exists("foo"))]},
        nodes=_ZONES,
        pods=(
            Existing("node-a", _FOO, namespace="ns1"),
            Existing("node-a", _FOO, namespace="ns2"),
            Existing("node-x", _FOO),
            Existing("node-y", _FOO),
        ),
        fits={"node-a": None, "node-b": None, "node-x": SKEW, "node-y": SKEW},
    ),
    Case(
        name="pods spread across zones as 3/3, all nodes fit",
        labels=_FOO,
        spec={"topologySpreadConstraints": [spread(1, "zone", "DoNotSchedule", exists("foo"))]},
        nodes=_ZONES,
        pods=foo_pods(a=2, b=1, y=3),
        fits=dict.fromkeys(("node-a", "node-b", "node-x", "node-y")),
    ),
    Case(
        name="pods spread across zones as 1/2 due to absence of label 'zone' on node-b",
        labels=_FOO,
        spec={"topologySpreadConstraints": [spread(1, "zone", "DoNotSchedule", exists("foo"))]},
        nodes=(
            Node("node-a", {"zone": "zone1", "node": "node-a"}),
            Node("node-b", {"zon": "zone1", "node": "node-b"}),
            Node("node-x", {"zone": "zone2", "node": "node-x"}),
            Node("node-y", {"zone": "zone2", "node": "node-y"}),
        ),
        pods=foo_pods(a=1, b=1, x=1, y=1),
        fits={"node-a": None, "node-b": NO_LABEL, "node-x": SKEW, "node-y": SKEW},
    ),
    Case(
        name="pod cannot be scheduled as all nodes don't have label 'rack'",
        labels=_FOO,
        spec={"topologySpreadConstraints": [spread(1, "rack", "DoNotSchedule", exists("foo"))]},
        nodes=zones("a1", "x2"),
        fits={"node-a": NO_LABEL, "node-x": NO_LABEL},
    ),
    Case(
        name="pods spread across nodes as 2/1/0/3, only node-x fits",
        labels=_FOO,
        spec={"topologySpreadConstraints": [spread(1, "node", "DoNotSchedule", exists("foo"))]},
        nodes=_ZONES,
        pods=foo_pods(a=2, b=1, y=3),
        fits={"node-a": SKEW, "node-b": SKEW, "node-x": None, "node-y": SKEW},
    ),
    Case(
        name="pods spread across nodes as 2/1/0/3, maxSkew is 2, node-b and node-x fit",
        labels=_FOO,
        spec={"topologySpreadConstraints": [spread(2, "node", "DoNotSchedule", exists("foo"))]},
        nodes=_ZONES,
        pods=foo_pods(a=2, b=1, y=3),
        fits={"node-a": SKEW, "node-b": None, "node-x": None, "node-y": SKEW},
    ),
    Case(
        name="pods spread across nodes as 2/1/0/3, but pod doesn't match itself",
        labels={"bar": ""},
        spec={"topologySpreadConstraints": [spread(1, "node", "DoNotSchedule", exists("foo"))]},
        nodes=_ZONES,
        pods=foo_pods(a=2, b=1, y=3),
        fits={"node-a": SKEW, "node-b": None, "node-x": None, "node-y": SKEW},
    ),
    Case(
        # The Go test runs the spread filter alone ("in real case, it's false" for node-b and
        # node-x): with every filter, node affinity keeps them out.
        name="incoming pod has nodeAffinity, pods spread as 2/~1~/~0~/3, hence node-a fits",
        labels=_FOO,
        spec={
            "affinity": node_affinity([req("node", "In", "node-a", "node-y")]),
            "topologySpreadConstraints": [spread(1, "node", "DoNotSchedule", exists("foo"))],
        },
        nodes=_ZONES,
        pods=foo_pods(a=2, b=1, y=3),
        fits={"node-a": None, "node-b": NOT_MATCHED, "node-x": NOT_MATCHED, "node-y": SKEW},
    ),
    Case(
        name="two Constraints on zone and node, spreads = [3/3, 2/1/0/3]",
        labels=_FOO,
        spec={
            "topologySpreadConstraints": [
                spread(1, "zone", "DoNotSchedule", exists("foo")),
                spread(1, "node", "DoNotSchedule", exists("foo")),
            ]
        },
        nodes=_ZONES,
        pods=foo_pods(a=2, b=1, y=3),
        fits={"node-a": SKEW, "node-b": SKEW, "node-x": None, "node-y": SKEW},
    ),
    Case(
        name="two Constraints on zone and node, spreads = [3/4, 2/1/0/4]",
        labels=_FOO,
        spec={
            "topologySpreadConstraints": [
                spread(1, "zone", "DoNotSchedule", exists("foo")),
                spread(1, "node", "DoNotSchedule", exists("foo")),
            ]
        },
        nodes=_ZONES,
        pods=foo_pods(a=2, b=1, y=4),
        fits={"node-a": SKEW, "node-b": SKEW, "node-x": SKEW, "node-y": SKEW},
    ),
    # Not verbatim: filtering_test.go's minDomains and NodeTaintsPolicy cases run the plugin
    # alone; these are the same rules on zones and with the taint filter beside.
    Case(
        # 2 domains of the 3 required, so the global minimum is 0: each domain holds a pod.
        name="pods spread across zone as 2/1, minDomains is 3: the global minimum is 0",
        labels=_FOO,
        spec={
            "topologySpreadConstraints": [
                spread(1, "zone", "DoNotSchedule", exists("foo"), minDomains=3)
            ]
        },
        nodes=_ZONES,
        pods=foo_pods(a=1, b=1, x=1),
        fits={"node-a": SKEW, "node-b": SKEW, "node-x": SKEW, "node-y": SKEW},
    ),
    Case(
        name="NodeTaintsPolicy honored: the tainted node's domain is not counted",
        labels=_FOO,
        spec={
            "topologySpreadConstraints": [
                spread(1, "node", "DoNotSchedule", exists("foo"), nodeTaintsPolicy="Honor")
            ],
        },
        nodes=(
            Node("node-a", {"node": "node-a"}),
            Node("node-b", {"node": "node-b"}),
            Node("node-c", {"node": "node-c"}, taints=(taint("other", "", "NoSchedule"),)),
        ),
        pods=foo_pods(a=1, b=1),
        fits={"node-a": None, "node-b": None, "node-c": untolerated("other", "")},
    ),
)

# --- podtopologyspread/scoring_test.go: TestPodTopologySpreadScore ---------------------------


def _hosts(*names: str, failed: tuple[str, ...] = ()) -> tuple[Node, ...]:
    return tuple(Node(f"node-{n}", {HOSTNAME: f"node-{n}"}, failed=n in failed) for n in names)


_SOFT_HOST = {"topologySpreadConstraints": [spread(1, HOSTNAME, "ScheduleAnyway", exists("foo"))]}

SPREAD_SCORES: tuple[Case, ...] = (
    Case(
        name="one constraint on node, no existing pods",
        labels=_FOO,
        spec=_SOFT_HOST,
        nodes=_hosts("a", "b"),
        scores={"node-a": 100, "node-b": 100},
    ),
    Case(
        name="one constraint on node, only one node is candidate",
        labels=_FOO,
        spec=_SOFT_HOST,
        nodes=_hosts("a", "b", failed=("b",)),
        pods=foo_pods(a=2, b=1),
        scores={"node-a": 100},
    ),
    Case(
        name="one constraint on node, all nodes have the same number of matching pods",
        labels=_FOO,
        spec=_SOFT_HOST,
        nodes=_hosts("a", "b"),
        pods=foo_pods(a=1, b=1),
        scores={"node-a": 100, "node-b": 100},
    ),
    Case(
        name="one constraint on node, all 4 nodes are candidates",
        labels=_FOO,
        spec=_SOFT_HOST,
        nodes=_hosts("a", "b", "c", "d"),
        pods=foo_pods(a=2, b=1, d=3),
        scores={"node-a": 20, "node-b": 60, "node-c": 100, "node-d": 0},
    ),
    Case(
        name="one constraint on node, all 4 nodes are candidates, maxSkew=2",
        labels=_FOO,
        spec={"topologySpreadConstraints": [spread(2, HOSTNAME, "ScheduleAnyway", exists("foo"))]},
        nodes=_hosts("a", "b", "c", "d"),
        pods=foo_pods(a=2, b=1, d=3),
        scores={"node-a": 33, "node-b": 66, "node-c": 100, "node-d": 16},
    ),
    Case(
        name="one constraint on node, all 4 nodes are candidates, maxSkew=3",
        labels=_FOO,
        spec={"topologySpreadConstraints": [spread(3, HOSTNAME, "ScheduleAnyway", exists("foo"))]},
        nodes=_hosts("a", "b", "c", "d"),
        pods=foo_pods(a=4, b=3, c=2, d=1),
        scores={"node-a": 44, "node-b": 66, "node-c": 77, "node-d": 100},
    ),
    Case(
        name="one constraint on node, 3 out of 4 nodes are candidates",
        labels=_FOO,
        spec=_SOFT_HOST,
        nodes=_hosts("a", "b", "x", "y", failed=("y",)),
        pods=foo_pods(a=4, b=2, x=1, y=3),
        scores={"node-a": 33, "node-b": 83, "node-x": 100},
    ),
    Case(
        name="one constraint on node, 3 out of 4 nodes are candidates, one node doesn't match "
        "topology key",
        labels=_FOO,
        spec=_SOFT_HOST,
        nodes=(
            Node("node-a", {HOSTNAME: "node-a"}),
            Node("node-b", {"n": "node-b"}),
            Node("node-x", {HOSTNAME: "node-x"}),
            Node("node-y", {HOSTNAME: "node-y"}, failed=True),
        ),
        pods=foo_pods(a=4, b=2, x=1, y=3),
        scores={"node-a": 16, "node-b": 0, "node-x": 100},
    ),
    Case(
        name="one constraint on zone, 3 out of 4 nodes are candidates",
        labels=_FOO,
        spec={"topologySpreadConstraints": [spread(1, "zone", "ScheduleAnyway", exists("foo"))]},
        nodes=(
            Node("node-a", {"zone": "zone1", HOSTNAME: "node-a"}),
            Node("node-b", {"zone": "zone1", HOSTNAME: "node-b"}),
            Node("node-x", {"zone": "zone2", HOSTNAME: "node-x"}),
            Node("node-y", {"zone": "zone2", HOSTNAME: "node-y"}, failed=True),
        ),
        pods=foo_pods(a=4, b=2, x=1, y=3),
        scores={"node-a": 75, "node-b": 75, "node-x": 100},
    ),
    Case(
        name="two Constraints on zone and node, 2 out of 4 nodes are candidates",
        labels=_FOO,
        spec={
            "topologySpreadConstraints": [
                spread(1, "zone", "ScheduleAnyway", exists("foo")),
                spread(1, HOSTNAME, "ScheduleAnyway", exists("foo")),
            ]
        },
        nodes=(
            Node("node-a", {"zone": "zone1", HOSTNAME: "node-a"}),
            Node("node-b", {"zone": "zone1", HOSTNAME: "node-b"}, failed=True),
            Node("node-x", {"zone": "zone2", HOSTNAME: "node-x"}),
            Node("node-y", {"zone": "zone2", HOSTNAME: "node-y"}, failed=True),
        ),
        pods=foo_pods(a=2, b=1, x=2, y=4),
        scores={"node-a": 100, "node-x": 63},
    ),
    Case(
        name="two Constraints on zone and node, with different labelSelectors",
        labels={"foo": "", "bar": ""},
        spec={
            "topologySpreadConstraints": [
                spread(1, "zone", "ScheduleAnyway", exists("foo")),
                spread(1, HOSTNAME, "ScheduleAnyway", exists("bar")),
            ]
        },
        nodes=(
            Node("node-a", {"zone": "zone1", HOSTNAME: "node-a"}),
            Node("node-b", {"zone": "zone1", HOSTNAME: "node-b"}),
            Node("node-x", {"zone": "zone2", HOSTNAME: "node-x"}),
            Node("node-y", {"zone": "zone2", HOSTNAME: "node-y"}),
        ),
        pods=(
            Existing("node-a", {"foo": ""}),
            Existing("node-b", {"foo": "", "bar": ""}),
            Existing("node-y", {"foo": ""}),
            Existing("node-y", {"bar": ""}),
        ),
        scores={"node-a": 60, "node-b": 20, "node-x": 100, "node-y": 60},
    ),
    Case(
        name="two Constraints on zone and node, with different labelSelectors, some nodes have 0 "
        "pods",
        labels={"foo": "", "bar": ""},
        spec={
            "topologySpreadConstraints": [
                spread(1, "zone", "ScheduleAnyway", exists("foo")),
                spread(1, HOSTNAME, "ScheduleAnyway", exists("bar")),
            ]
        },
        nodes=(
            Node("node-a", {"zone": "zone1", HOSTNAME: "node-a"}),
            Node("node-b", {"zone": "zone1", HOSTNAME: "node-b"}),
            Node("node-x", {"zone": "zone2", HOSTNAME: "node-x"}),
            Node("node-y", {"zone": "zone2", HOSTNAME: "node-y"}),
        ),
        pods=(
            Existing("node-b", {"bar": ""}),
            Existing("node-x", {"foo": ""}),
            Existing("node-y", {"foo": "", "bar": ""}),
        ),
        scores={"node-a": 100, "node-b": 60, "node-x": 40, "node-y": 0},
    ),
    Case(
        name="two Constraints on zone and node, with different labelSelectors, 3 out of 4 nodes "
        "are candidates",
        labels={"foo": "", "bar": ""},
        spec={
            "topologySpreadConstraints": [
                spread(1, "zone", "ScheduleAnyway", exists("foo")),
                spread(1, HOSTNAME, "ScheduleAnyway", exists("bar")),
            ]
        },
        nodes=(
            Node("node-a", {"zone": "zone1", HOSTNAME: "node-a"}),
            Node("node-b", {"zone": "zone1", HOSTNAME: "node-b"}),
            Node("node-x", {"zone": "zone2", HOSTNAME: "node-x"}),
            Node("node-y", {"zone": "zone2", HOSTNAME: "node-y"}, failed=True),
        ),
        pods=(
            Existing("node-a", {"foo": ""}),
            Existing("node-b", {"foo": "", "bar": ""}),
            Existing("node-y", {"foo": ""}),
            Existing("node-y", {"bar": ""}),
        ),
        scores={"node-a": 50, "node-b": 25, "node-x": 100},
    ),
    Case(
        name="existing pods in a different namespace do not count",
        labels=_FOO,
        spec=_SOFT_HOST,
        nodes=_hosts("a", "b"),
        pods=(
            Existing("node-a", _FOO, namespace="ns1"),
            Existing("node-a", _FOO),
            Existing("node-b", _FOO),
            Existing("node-b", _FOO),
        ),
        scores={"node-a": 100, "node-b": 33},
    ),
    Case(
        name="minDomains has no effect when ScheduleAnyway",
        labels=_FOO,
        spec={
            "topologySpreadConstraints": [
                spread(2, "node", "ScheduleAnyway", exists("foo"), minDomains=10)
            ]
        },
        nodes=(
            Node("node-a", {"node": "node-a"}),
            Node("node-b", {"node": "node-b"}),
            Node("node-c", {"node": "node-c"}),
        ),
        pods=foo_pods(a=2, b=2, c=1),
        scores={"node-a": 75, "node-b": 75, "node-c": 100},
    ),
)

# --- interpodaffinity/filtering_test.go: TestRequiredAffinitySingleNode ----------------------

_REGION_ZONE = {"region": "r1", "zone": "z11"}
_SCAN = {"service": "securityscan"}
_S1 = {"security": "S1"}
_MACHINE1 = (Node("machine1", _REGION_ZONE),)


def _in(*values: str) -> Obj:
    return selector(req("service", "In", *values))


INTERPOD_FILTER: tuple[Case, ...] = (
    Case(
        name="A pod that has no required pod affinity scheduling rules can schedule onto a node "
        "with no existing pods",
        spec={},
        nodes=_MACHINE1,
        fits={"machine1": None},
    ),
    Case(
        name="satisfies with requiredDuringSchedulingIgnoredDuringExecution in PodAffinity using "
        "In operator that matches the existing pod",
        labels=_S1,
        spec={"affinity": pod_affinity([pod_term(_in("securityscan", "value2"), "region")])},
        nodes=_MACHINE1,
        pods=(Existing("machine1", _SCAN),),
        fits={"machine1": None},
    ),
    Case(
        name="satisfies the pod with requiredDuringSchedulingIgnoredDuringExecution in "
        "PodAffinity using not in operator in labelSelector that matches the existing pod",
        labels=_S1,
        spec={
            "affinity": pod_affinity(
                [pod_term(selector(req("service", "NotIn", "securityscan3", "value3")), "region")]
            )
        },
        nodes=_MACHINE1,
        pods=(Existing("machine1", _SCAN),),
        fits={"machine1": None},
    ),
    Case(
        name="Does not satisfy the PodAffinity with labelSelector because of diff Namespace",
        labels=_S1,
        spec={
            "affinity": pod_affinity(
                [pod_term(_in("securityscan", "value2"), "region", ["DiffNameSpace"])]
            )
        },
        nodes=_MACHINE1,
        pods=(Existing("machine1", _SCAN, namespace="ns"),),
        fits={"machine1": AFFINITY},
    ),
    Case(
        name="Doesn't satisfy the PodAffinity because of unmatching labelSelector with the "
        "existing pod",
        labels=_SCAN,
        spec={"affinity": pod_affinity([pod_term(_in("antivirusscan", "value2"), "region")])},
        nodes=_MACHINE1,
        pods=(Existing("machine1", _SCAN),),
        fits={"machine1": AFFINITY},
    ),
    Case(
        name="satisfies the PodAffinity with different label Operators in multiple "
        "RequiredDuringSchedulingIgnoredDuringExecution ",
        labels=_S1,
        spec={
            "affinity": pod_affinity(
                [
                    pod_term(
                        selector(req("service", "Exists"), req("wrongkey", "DoesNotExist")),
                        "region",
                    ),
                    pod_term(
                        selector(
                            req("service", "In", "securityscan"),
                            req("service", "NotIn", "WrongValue"),
                        ),
                        "region",
                    ),
                ]
            )
        },
        nodes=_MACHINE1,
        pods=(Existing("machine1", _SCAN),),
        fits={"machine1": None},
    ),
    Case(
        name="The labelSelector requirements(items of matchExpressions) are ANDed, the pod "
        "cannot schedule onto the node because one of the matchExpression item don't match.",
        labels=_S1,
        spec={
            "affinity": pod_affinity(
                [
                    pod_term(
                        selector(req("service", "Exists"), req("wrongkey", "DoesNotExist")),
                        "region",
                    ),
                    pod_term(
                        selector(
                            req("service", "In", "securityscan2"),
                            req("service", "NotIn", "WrongValue"),
                        ),
                        "region",
                    ),
                ]
            )
        },
        nodes=_MACHINE1,
        pods=(Existing("machine1", _SCAN),),
        fits={"machine1": AFFINITY},
    ),
    Case(
        name="satisfies the PodAffinity and PodAntiAffinity with the existing pod",
        labels=_S1,
        spec={
            "affinity": pod_affinity(
                [pod_term(_in("securityscan", "value2"), "region")],
                [pod_term(_in("antivirusscan", "value2"), "node")],
            )
        },
        nodes=_MACHINE1,
        pods=(Existing("machine1", _SCAN),),
        fits={"machine1": None},
    ),
    Case(
        name="satisfies the PodAffinity and PodAntiAffinity and PodAntiAffinity symmetry with "
        "the existing pod",
        labels=_S1,
        spec={
            "affinity": pod_affinity(
                [pod_term(_in("securityscan", "value2"), "region")],
                [pod_term(_in("antivirusscan", "value2"), "node")],
            )
        },
        nodes=_MACHINE1,
        pods=(
            Existing(
                "machine1",
                _SCAN,
                affinity=pod_affinity(anti=[pod_term(_in("antivirusscan", "value2"), "node")]),
            ),
        ),
        fits={"machine1": None},
    ),
    Case(
        name="satisfies the PodAffinity but doesn't satisfy the PodAntiAffinity with the "
        "existing pod",
        labels=_S1,
        spec={
            "affinity": pod_affinity(
                [pod_term(_in("securityscan", "value2"), "region")],
                [pod_term(_in("securityscan", "value2"), "zone")],
            )
        },
        nodes=_MACHINE1,
        pods=(Existing("machine1", _SCAN),),
        fits={"machine1": ANTI},
    ),
    Case(
        name="satisfies the PodAffinity and PodAntiAffinity but doesn't satisfy PodAntiAffinity "
        "symmetry with the existing pod",
        labels=_SCAN,
        spec={
            "affinity": pod_affinity(
                [pod_term(_in("securityscan", "value2"), "region")],
                [pod_term(_in("antivirusscan", "value2"), "node")],
            )
        },
        nodes=_MACHINE1,
        pods=(
            Existing(
                "machine1",
                _SCAN,
                affinity=pod_affinity(anti=[pod_term(_in("securityscan", "value2"), "zone")]),
            ),
        ),
        fits={"machine1": EXISTING},
    ),
    Case(
        name="pod matches its own Label in PodAffinity and that matches the existing pod Labels",
        labels=_SCAN,
        spec={
            "affinity": pod_affinity(
                [pod_term(selector(req("service", "NotIn", "securityscan", "value2")), "region")]
            )
        },
        nodes=(Node("machine1", _REGION_ZONE), Node("machine2", {"zone": "z22"})),
        pods=(Existing("machine2", _SCAN),),
        fits={"machine1": AFFINITY, "machine2": AFFINITY},
    ),
    Case(
        name="verify that PodAntiAffinity from existing pod is respected when pod has no "
        "AntiAffinity constraints. doesn't satisfy PodAntiAffinity symmetry with the existing pod",
        labels=_SCAN,
        spec={},
        nodes=_MACHINE1,
        pods=(
            Existing(
                "machine1",
                _SCAN,
                affinity=pod_affinity(anti=[pod_term(_in("securityscan", "value2"), "zone")]),
            ),
        ),
        fits={"machine1": EXISTING},
    ),
    Case(
        name="verify that PodAntiAffinity from existing pod is respected when pod has no "
        "AntiAffinity constraints. satisfy PodAntiAffinity symmetry with the existing pod",
        labels=_SCAN,
        spec={},
        nodes=_MACHINE1,
        pods=(
            Existing(
                "machine1",
                _SCAN,
                affinity=pod_affinity(
                    anti=[
                        pod_term(
                            selector(req("service", "NotIn", "securityscan", "value2")), "zone"
                        )
                    ]
                ),
            ),
        ),
        fits={"machine1": None},
    ),
    Case(
        # TestRequiredAffinityMultipleNodes: the first pod of a group that wants to be together
        # goes anywhere its terms' keys are (no pod matches yet, and it matches itself).
        name="A pod with an affinity to itself and no matching pod anywhere fits every node "
        "with the topology key",
        labels={"foo": "bar"},
        spec={"affinity": pod_affinity([pod_term(selector(foo="bar"), "region")])},
        nodes=(
            Node("nodeA", {"region": "r1", "zone": "z1"}),
            Node("nodeB", {"region": "r1", "zone": "z2"}),
            Node("nodeC", {"zone": "z3"}),
        ),
        fits={"nodeA": None, "nodeB": None, "nodeC": AFFINITY},
    ),
    Case(
        name="NodeA and nodeB have same topologyKey and label value. NodeA has an existing pod "
        "that matches the inter pod affinity rule. The pod can be scheduled onto nodeA and "
        "nodeB.",
        labels={"foo": "bar"},
        spec={"affinity": pod_affinity([pod_term(selector(req("foo", "In", "bar")), "region")])},
        nodes=(
            Node("nodeA", {"region": "r1", "zone": "z1"}),
            Node("nodeB", {"region": "r1", "zone": "z2"}),
            Node("nodeC", {"region": "r2", "zone": "z3"}),
        ),
        pods=(Existing("nodeA", {"foo": "bar"}),),
        fits={"nodeA": None, "nodeB": None, "nodeC": AFFINITY},
    ),
)

# --- interpodaffinity/filtering_test.go: TestRequiredAffinitySingleNode, NamespaceSelector ----

_TEAMS = {
    "subteam1.team1": {"team": "team1"},
    "subteam2.team1": {"team": "team1"},
    "subteam1.team2": {"team": "team2"},
    "subteam2.team2": {"team": "team2"},
}
"""The Go test's namespaces (``namespaces``, handed to the plugin's namespace informer)."""
_TEAM1 = selector(req("team", "In", "team1"))
_NODE1 = (Node("node1", _REGION_ZONE),)


def _teams(
    name: str,
    fits: str | None,
    existing: str,
    *,
    anti: bool = False,
    namespace_selector: Obj = _TEAM1,
) -> Case:
    """The Go test's shape: a pod (of ``subteam1.team1`` when ``anti``) with one term choosing
    its namespaces by ``namespace_selector``, and a ``securityscan`` pod of ``existing`` on
    node1."""
    term = pod_term(
        _in("securityscan", "value2"),
        "zone" if anti else "region",
        namespace_selector=namespace_selector,
    )
    return Case(
        name=name,
        labels=_S1,
        namespace="subteam1.team1" if anti else "",
        spec={"affinity": pod_affinity(anti=[term]) if anti else pod_affinity([term])},
        nodes=_NODE1,
        pods=(Existing("node1", _SCAN, namespace=existing),),
        namespaces=_TEAMS,
        fits={"node1": fits},
    )


NAMESPACE_SELECTOR: tuple[Case, ...] = (
    _teams("affinity with NamespaceSelector", None, "subteam1.team1"),
    _teams("affinity with non-matching NamespaceSelector", AFFINITY, "subteam1.team2"),
    _teams("anti-affinity with matching NamespaceSelector", ANTI, "subteam2.team1", anti=True),
    _teams(
        "anti-affinity with matching all NamespaceSelector",
        ANTI,
        "subteam2.team1",
        anti=True,
        namespace_selector={},
    ),
    _teams("anti-affinity with non-matching NamespaceSelector", None, "subteam1.team2", anti=True),
)

# --- interpodaffinity/scoring_test.go: TestPreferredAffinity ---------------------------------

_SEC_IN_S1 = selector(req("security", "In", "S1"))
_SEC_IN_S2 = selector(req("security", "In", "S2"))
_CHINA, _INDIA = {"region": "China"}, {"region": "India"}

INTERPOD_SCORES: tuple[Case, ...] = (
    Case(
        name="Affinity: pod that matches topology key & pods in nodes will get high score "
        "comparing to otherswhich doesn't match either pods in nodes or in topology key",
        labels=_S1,
        spec={"affinity": pod_affinity(preferred=[(5, pod_term(_SEC_IN_S1, "region"))])},
        nodes=(Node("node1", _CHINA), Node("node2", _INDIA), Node("node3", {"az": "az1"})),
        pods=(
            Existing("node1", _S1),
            Existing("node2", {"security": "S2"}),
            Existing("node3", _S1),
        ),
        scores={"node1": 100, "node2": 0, "node3": 0},
    ),
    Case(
        name="All the nodes that have the same topology key & label value with one of them has "
        "an existing pod that match the affinity rules, have the same score",
        spec={"affinity": pod_affinity(preferred=[(5, pod_term(_SEC_IN_S1, "region"))])},
        nodes=(
            Node("node1", _CHINA),
            Node("node2", {"region": "China", "az": "az1"}),
            Node("node3", _INDIA),
        ),
        pods=(Existing("node1", _S1),),
        scores={"node1": 100, "node2": 100, "node3": 0},
    ),
    Case(
        name="Affinity: nodes in one region has more matching pods comparing to other region, "
        "so the region which has more matches will get high score",
        labels=_S1,
        spec={"affinity": pod_affinity(preferred=[(6, pod_term(_SEC_IN_S2, "region"))])},
        nodes=(
            Node("node1", _CHINA),
            Node("node2", _INDIA),
            Node("node3", _CHINA),
            Node("node4", _CHINA),
            Node("node5", _INDIA),
        ),
        pods=tuple(
            Existing(n, {"security": "S2"})
            for n in ("node1", "node1", "node2", "node3", "node4", "node5")
        ),
        scores={"node1": 100, "node2": 0, "node3": 100, "node4": 100, "node5": 0},
    ),
    Case(
        name="Anti Affinity: pod that does not match existing pods in node will get high score ",
        labels=_S1,
        spec={"affinity": pod_affinity(preferred_anti=[(5, pod_term(_SEC_IN_S1, "az"))])},
        nodes=(Node("node1", {"az": "az1"}), Node("node2", _CHINA)),
        pods=(Existing("node1", _S1), Existing("node2", {"security": "S2"})),
        scores={"node1": 0, "node2": 100},
    ),
    Case(
        name="Affinity symmetry: considered only the preferredDuringSchedulingIgnoredDuring"
        "Execution in pod affinity symmetry",
        labels=_S1,
        spec={},
        nodes=(Node("node1", _CHINA), Node("node2", _INDIA), Node("node3", {"az": "az1"})),
        pods=(
            Existing(
                "node1",
                {"security": "S2"},
                affinity=pod_affinity(preferred=[(5, pod_term(_SEC_IN_S1, "region"))]),
            ),
            Existing(
                "node2",
                {"security": "S2"},
                affinity=pod_affinity(preferred=[(6, pod_term(_SEC_IN_S2, "region"))]),
            ),
        ),
        scores={"node1": 100, "node2": 0, "node3": 0},
    ),
    Case(
        name="Affinity symmetry: considered RequiredDuringSchedulingIgnoredDuringExecution in "
        "pod affinity symmetry",
        labels=_S1,
        spec={},
        nodes=(Node("node1", {"az": "az1"}), Node("node2", _INDIA)),
        pods=(
            Existing(
                "node1",
                {"security": "S2"},
                affinity=pod_affinity([pod_term(_SEC_IN_S1, "az")]),
            ),
        ),
        scores={"node1": 100, "node2": 0},
    ),
)
