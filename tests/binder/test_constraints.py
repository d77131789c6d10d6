"""What the binder hands the placer for Kubernetes' scheduling constraints, over real NATS and
the real kubernetes-asyncio client against the API test double: node taints and the pods
Tessera did not place in the node facts, namespace selectors resolved, the namespaces' labels
published for the extender, gated pods held back, a pod naming its node never published."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.binder.namespaces import namespace_changes
from shared import codec, subjects
from shared.messages.constraints import ExistingPod, PodAffinity, Taint
from shared.messages.namespaces import NamespaceLabels, NamespacesListed
from shared.messages.nodes import NodeFacts
from shared.messages.pods import PodPending
from shared.runtime.nats import NatsBus
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.resources import NAMESPACE, NODE, POD
from tests.binder.builders import container, node, pod
from tests.binder.conftest import BinderFactory, collect, eventually

MERGE = "application/merge-patch+json"
NAME_LABEL = "kubernetes.io/metadata.name"
ANTI = "requiredDuringSchedulingIgnoredDuringExecution"


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def anti_affinity(app: str, team: str) -> dict[str, Any]:
    """Keep away from pods ``app=<app>`` of the namespaces labelled ``team=<team>``."""
    return {
        "podAntiAffinity": {
            ANTI: [
                {
                    "labelSelector": {"matchLabels": {"app": app}},
                    "namespaceSelector": {"matchLabels": {"team": team}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }


async def facts_of(bus: NatsBus, name: str) -> NodeFacts | None:
    entry = await bus.kv_get(subjects.KV_NODES, subjects.node_token(name))
    return None if entry is None else codec.decode(entry.value, NodeFacts)


async def test_node_facts_carry_taints_and_the_pods_tessera_did_not_place(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    body = node("gpu-1")
    body["spec"]["taints"] = [
        {"key": "gpu", "value": "reserved", "effect": "NoSchedule"},
        {"key": "spot", "effect": "PreferNoSchedule"},
    ]
    api.create(NODE, body)
    api.create(NAMESPACE, namespace("blue", team="a"))
    web = pod("web", container(cpu="1"), scheduler="default-scheduler", labels={"app": "web"})
    web["spec"] |= {"nodeName": "gpu-1", "affinity": anti_affinity("db", "a")}
    api.create(POD, web)
    # Tessera's own pod on the node: the placer counts it from its booking, not from here.
    api.create(POD, pod("ours", container(gpu=1), node="gpu-1", labels={"app": "web"}))
    async with start_binder():

        async def carried() -> NodeFacts | None:
            facts = await facts_of(bus, "gpu-1")
            return facts if facts is not None and facts.pods else None

        facts = await eventually(carried, what="the node's pods in its facts")
        assert facts.taints == (
            Taint(key="gpu", value="reserved", effect="NoSchedule"),
            Taint(key="spot", effect="PreferNoSchedule"),
        )
        (counted,) = facts.pods
        assert isinstance(counted, ExistingPod)
        assert (counted.namespace, counted.labels) == ("default", {"app": "web"})
        assert isinstance(counted.anti_affinity, PodAffinity)
        assert counted.anti_affinity.required[0].namespaces == ("blue",)
        # A namespace newly labelled into the selector is counted in.
        api.create(NAMESPACE, namespace("green", team="a"))

        async def reread() -> bool:
            now = await facts_of(bus, "gpu-1")
            anti = now.pods[0].anti_affinity if now is not None and now.pods else None
            return anti is not None and anti.required[0].namespaces == ("blue", "green")

        await eventually(reread, what="the selector resolved again")
        # A pod that terminates no longer counts.
        api.patch(
            POD,
            "default",
            "web",
            {"metadata": {"deletionTimestamp": "2030-01-01T00:00:00Z"}},
            MERGE,
        )

        async def gone() -> bool:
            now = await facts_of(bus, "gpu-1")
            return now is not None and now.pods == ()

        await eventually(gone, what="the terminating pod left out")


async def test_a_gated_pod_waits_and_says_so_and_a_pod_naming_its_node_is_never_placed(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    api.create(NODE, node())
    pending = await collect(bus, subjects.PODS_PENDING)
    gated = pod("gated", labels={"app": "train"})
    gated["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    pinned = pod("pinned", container(cpu="1"), node="gpu-1")
    async with start_binder():
        api.create(POD, gated)
        api.create(POD, pinned)
        api.create(POD, pod("plain"))
        await eventually(lambda: pending.deliveries, what="the plain pod published")

        def condition() -> dict[str, Any] | None:
            found = api.find(POD, "default", "gated") or {}
            conditions = found.get("status", {}).get("conditions") or []
            return next((c for c in conditions if c["type"] == "PodScheduled"), None)

        said = await eventually(condition, what="the gated pod's condition")
        assert (said["status"], said["reason"], said["message"]) == (
            "False",
            "SchedulingGated",
            "waiting for scheduling gates: [example.com/quota]",
        )
        await asyncio.sleep(0.3)
        assert [m.name for m in pending.decoded(PodPending)] == ["plain"]
        # Its gate removed, it is published with its labels.
        api.patch(POD, "default", "gated", {"spec": {"schedulingGates": None}}, MERGE)
        await eventually(lambda: len(pending.deliveries) == 2, what="the ungated pod")
        published = pending.decoded(PodPending)[-1]
        assert (published.name, published.labels) == ("gated", {"app": "train"})
    assert "pinned" not in [m.name for m in pending.decoded(PodPending)]


async def published_namespaces(bus: NatsBus) -> tuple[dict[str, dict[str, str]], bool]:
    """What the binder published in ``tessera-namespaces``: labels by namespace, and whether its
    word that all are listed is there."""
    labels: dict[str, dict[str, str]] = {}
    listed = False
    for entry in await bus.kv_list(subjects.KV_NAMESPACES, ">"):
        if entry.deleted:
            continue
        if entry.key == subjects.NAMESPACES_LISTED:
            listed = codec.decode(entry.value, NamespacesListed).namespaces >= 0
            continue
        found = codec.decode(entry.value, NamespaceLabels)
        assert found.namespace == entry.key
        labels[found.namespace] = found.labels
    return labels, listed


async def test_the_leader_publishes_the_namespaces_for_the_extender_s_selectors(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    api.create(NAMESPACE, namespace("blue", team="a"))
    api.create(NAMESPACE, namespace("green", team="b"))
    # Left by an earlier leader: a namespace gone since, and one relabelled since.
    stale = NamespaceLabels(namespace="red", labels={"team": "c"})
    await bus.kv_put(subjects.KV_NAMESPACES, "red", codec.encode(stale))
    old = NamespaceLabels(namespace="green", labels={"team": "a"})
    await bus.kv_put(subjects.KV_NAMESPACES, "green", codec.encode(old))
    async with start_binder():

        async def listed() -> dict[str, dict[str, str]] | None:
            labels, done = await published_namespaces(bus)
            return labels if done else None

        labels = await eventually(listed, what="the namespaces published and listed")
        # As the API server labels every namespace (what a selector may name too).
        assert {name: labels[name] for name in ("blue", "green")} == {
            "blue": {"team": "a", NAME_LABEL: "blue"},
            "green": {"team": "b", NAME_LABEL: "green"},
        }
        assert "red" not in labels
        # Relabelled, added, deleted: each followed.
        api.patch(NAMESPACE, "", "blue", {"metadata": {"labels": {"team": "z"}}}, MERGE)
        api.create(NAMESPACE, namespace("violet", team="a"))
        api.delete(NAMESPACE, "", "green")

        async def followed() -> bool:
            labels, done = await published_namespaces(bus)
            return (
                done
                and labels.get("blue") == {"team": "z", NAME_LABEL: "blue"}
                and labels.get("violet") == {"team": "a", NAME_LABEL: "violet"}
                and "green" not in labels
            )

        await eventually(followed, what="the namespaces' changes published")


@pytest.mark.parametrize(
    ("published", "current", "writes", "deletes"),
    [
        pytest.param({}, {"a": {}, "b": {"x": "1"}}, ["a", "b"], [], id="first"),
        pytest.param({"a": {"x": "1"}}, {"a": {"x": "1"}}, [], [], id="nothing-changed"),
        pytest.param({"a": {"x": "1"}}, {"a": {"x": "2"}}, ["a"], [], id="relabelled"),
        pytest.param({"a": {}, "b": {}}, {"b": {}}, [], ["a"], id="gone"),
        pytest.param({"a": None}, {"a": {}}, ["a"], [], id="unreadable-rewritten"),
        pytest.param({"a": None}, {}, [], ["a"], id="unreadable-gone"),
    ],
)
def test_namespace_changes_write_what_differs_and_delete_what_is_gone(
    published: dict[str, dict[str, str] | None],
    current: dict[str, dict[str, str]],
    writes: list[str],
    deletes: list[str],
) -> None:
    assert namespace_changes(published, current) == (writes, deletes)
