"""kube-scheduler's own PodTopologySpread and InterPodAffinity cases (``kube_cases.py`` of
``tests/placer``, namespace selectors included) through the extender's HTTP API, as
kube-scheduler calls it.

One real placer over a real NATS answers every case: the case's nodes, taints and the pods already
on them go into KV as the binder publishes them (node facts; the GPUs as the inventory does), its
namespaces as the binder publishes them (KV ``tessera-namespaces``), and the pod is sent as
kube-scheduler sends it (``Pod`` with ``NodeNames``: every node but those failing other filters).
filter must pass exactly the nodes kube-scheduler's plugin passes and fail the others with its
reason, as unresolvable where kube-scheduler says ``UnschedulableAndUnresolvable``; prioritize
must order the nodes as the plugin's scores do. Every node has the same GPUs and nothing else is
placed, so the profile's own score ties and the rules alone decide.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Any

import msgspec

from services.placer.namespaces import NOT_LISTED
from services.placer.service import PlacerService
from shared import codec, subjects
from shared.messages.constraints import Taint
from shared.messages.namespaces import NamespaceLabels, NamespacesListed
from shared.messages.nodes import NodeFacts
from shared.runtime.nats import NatsBus
from tessera.up.ports import free_port
from tests.binder.conftest import eventually
from tests.extender.conftest import golden, post
from tests.harness import kv
from tests.placer import kube_cases as k
from tests.placer import wire
from tests.placer.conftest import PlacerFactory
from tests.placer.test_kube_constraints import existing

DEFAULT_NAMESPACE = "default"
"""The Go tests' pods have no namespace (""): here every such pod, incoming or existing, is in
this one."""

UNRESOLVABLE = frozenset({k.NOT_MATCHED, k.NO_LABEL, k.AFFINITY})
"""The reasons kube-scheduler's plugins give as ``UnschedulableAndUnresolvable`` (untolerated
taints too; the others, skew and anti-affinity, as ``Unschedulable``: a preemption may help)."""


def unresolvable(reason: str) -> bool:
    return reason in UNRESOLVABLE or reason.startswith(k.untolerated("", "").split("{")[0])


FILTER_CASES = (*k.SPREAD_FILTER, *k.INTERPOD_FILTER, *k.NAMESPACE_SELECTOR)
SCORE_CASES = (*k.SPREAD_SCORES, *k.INTERPOD_SCORES)


def _namespace(name: str) -> str:
    return name or DEFAULT_NAMESPACE


def pod_of(case: k.Case) -> dict[str, Any]:
    """The case's pod as kube-scheduler sends it: a GPU share (the golden pod's), the case's
    labels, namespace and scheduling fields."""
    pod: dict[str, Any] = copy.deepcopy(golden("filter-node-names")["Pod"])
    pod["metadata"]["namespace"] = _namespace(case.namespace)
    pod["metadata"]["labels"] = dict(case.labels)
    pod["spec"].update(copy.deepcopy(case.spec))
    return pod


def facts_of(case: k.Case, now: float) -> dict[str, NodeFacts]:
    """Each node's facts as the binder publishes them: labels, taints, and the pods on it that
    Tessera did not place."""
    pods: dict[str, list[Any]] = {}
    for number, pod in enumerate(case.pods):
        placed = dataclasses.replace(pod, namespace=_namespace(pod.namespace))
        pods.setdefault(pod.node, []).append(existing(placed, number))
    return {
        node.name: msgspec.structs.replace(
            wire.facts(node.name, at=now, labels=node.labels, schedulable=not node.failed),
            taints=tuple(msgspec.convert(t, Taint) for t in node.taints),
            pods=tuple(pods.get(node.name, ())),
        )
        for node in case.nodes
    }


class Cluster:
    """The cluster of one case at a time, in KV, and the placer's view of it waited for."""

    def __init__(self, bus: NatsBus, service: PlacerService) -> None:
        self._bus = bus
        self._service = service
        self._nodes: set[str] = set()
        self._namespaces: set[str] = set()

    async def show(self, case: k.Case) -> list[str]:
        """Publish ``case``'s nodes and namespaces (and take the last case's away); the nodes
        kube-scheduler would ask about, once the placer's view holds them all."""
        now = time.time()
        facts = facts_of(case, now)
        for gone in sorted(self._nodes - set(facts)):
            await self._bus.kv_delete(subjects.KV_NODES, subjects.node_token(gone))
            await self._bus.kv_delete(subjects.KV_INVENTORY, subjects.node_token(gone))
        for name, node_facts in facts.items():
            if name not in self._nodes:
                await kv.put_inventory(self._bus, wire.inventory(name, 2, at=now))
            await kv.put_facts(self._bus, node_facts)
        self._nodes = set(facts)
        for name in sorted(self._namespaces - set(case.namespaces)):
            await self._bus.kv_delete(subjects.KV_NAMESPACES, name)
        for name, labels in case.namespaces.items():
            entry = NamespaceLabels(namespace=name, labels=labels, observed_at=now)
            await self._bus.kv_put(subjects.KV_NAMESPACES, name, codec.encode(entry))
        self._namespaces = set(case.namespaces)

        def shown() -> bool:
            view = self._service.view
            return {n.name for n in view.everywhere()} == set(facts) and all(
                view.facts(n) == f and view.inventory(n) is not None for n, f in facts.items()
            )

        await eventually(shown, what=f"the nodes of case {case.name!r}")
        return [node.name for node in case.nodes if not node.failed]


async def publish_listed(bus: NatsBus) -> None:
    """The binder's word that every namespace is published."""
    listed = NamespacesListed(namespaces=0, listed_at=time.time())
    await bus.kv_put(subjects.KV_NAMESPACES, subjects.NAMESPACES_LISTED, codec.encode(listed))


def expected_filter(case: k.Case, candidates: list[str]) -> dict[str, Any]:
    assert case.fits is not None
    fits = {n: case.fits[n] for n in candidates}
    return {
        "NodeNames": [n for n in candidates if fits[n] is None],
        "FailedNodes": {n: r for n, r in fits.items() if r is not None and not unresolvable(r)},
        "FailedAndUnresolvableNodes": {
            n: r for n, r in fits.items() if r is not None and unresolvable(r)
        },
    }


def expected_priorities(case: k.Case) -> dict[str, int]:
    """The plugin's scores as prioritize answers them: the best node 10, the worst 0, the others
    in proportion (all 10 when they tie)."""
    assert case.scores is not None
    low, high = min(case.scores.values()), max(case.scores.values())
    if high == low:
        return dict.fromkeys(case.scores, 10)
    return {n: round(10 * (s - low) / (high - low)) for n, s in case.scores.items()}


async def test_filter_and_prioritize_answer_kube_scheduler_s_own_cases(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    async with start_placer(extender_port=free_port(), inventory_stale_s=3600.0) as placer:
        assert placer.service is not None and placer.service.extender_port is not None
        port = placer.service.extender_port
        cluster = Cluster(bus, placer.service)
        await publish_listed(bus)
        wrong: list[str] = []
        for case in FILTER_CASES:
            candidates = await cluster.show(case)
            request = {"Pod": pod_of(case), "Nodes": None, "NodeNames": candidates}
            status, answer = await post(port, "filter", request)
            got = {key: answer[key] for key in ("NodeNames", "FailedNodes")}
            got["FailedAndUnresolvableNodes"] = answer["FailedAndUnresolvableNodes"]
            if status != 200 or got != expected_filter(case, candidates):
                wrong.append(f"filter {case.name!r}: {status} {got}")
        for case in SCORE_CASES:
            candidates = await cluster.show(case)
            request = {"Pod": pod_of(case), "Nodes": None, "NodeNames": candidates}
            status, scores = await post(port, "prioritize", request)
            got = {s["Host"]: s["Score"] for s in scores} if status == 200 else {}
            if got != expected_priorities(case):
                wrong.append(f"prioritize {case.name!r}: {status} {got}")
        assert wrong == []


async def test_a_namespace_selector_is_refused_with_the_reason_until_the_namespaces_are_listed(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    """Resolved against the namespaces known so far, the anti-affinity below would match no
    namespace and so no pod: a term ignored. Until the binder's word that every namespace is
    published, the extender refuses the pod with the reason instead (unresolvable: no eviction
    changes it); a pod without a namespace selector is judged meanwhile."""
    (case,) = [
        c for c in k.NAMESPACE_SELECTOR if c.name == "anti-affinity with matching NamespaceSelector"
    ]
    async with start_placer(extender_port=free_port(), inventory_stale_s=3600.0) as placer:
        assert placer.service is not None and placer.service.extender_port is not None
        port = placer.service.extender_port
        candidates = await Cluster(bus, placer.service).show(case)
        request: dict[str, Any] = {"Pod": pod_of(case), "Nodes": None, "NodeNames": candidates}
        status, answer = await post(port, "filter", request)
        assert (status, answer["NodeNames"], answer["FailedNodes"]) == (200, [], {})
        assert answer["FailedAndUnresolvableNodes"] == {"node1": NOT_LISTED}
        status, scores = await post(port, "prioritize", request)
        assert (status, scores) == (200, [{"Host": "node1", "Score": 0}])
        plain = copy.deepcopy(request)
        del plain["Pod"]["spec"]["affinity"]
        assert (await post(port, "filter", plain))[1]["NodeNames"] == ["node1"]

        # What does not read, or names another namespace than its key, is rejected at the edge
        # (counted, dead-lettered) and changes nothing.
        await bus.kv_put(subjects.KV_NAMESPACES, "junk", b"not a namespace")
        other = NamespaceLabels(namespace="subteam2.team1", labels={"team": "team2"})
        await bus.kv_put(subjects.KV_NAMESPACES, "subteam1.team2", codec.encode(other))
        await publish_listed(bus)

        async def judged() -> dict[str, Any] | None:
            status, answer = await post(port, "filter", request)
            return answer if status == 200 and answer["FailedNodes"] else None

        answer = await eventually(judged, what="the pod judged once the namespaces are listed")
        assert answer["FailedNodes"] == {"node1": k.ANTI}
        rejected = "tessera_messages_rejected_total"
        assert placer.metric(rejected, family="namespaces", kind="decode") == 1
        assert placer.metric(rejected, family="namespaces", kind="validate") == 1
        # The binder's word withdrawn (a store that lost it): refused again.
        await bus.kv_delete(subjects.KV_NAMESPACES, subjects.NAMESPACES_LISTED)

        async def refused() -> bool:
            status, answer = await post(port, "filter", request)
            return status == 200 and answer["FailedAndUnresolvableNodes"] == {"node1": NOT_LISTED}

        await eventually(refused, what="the pod refused again")
