"""The binder's side of extender mode: which pods are Tessera's, what it publishes for them, and
its answers to the placer's extender asking for the pod kube-scheduler binds."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from services.binder.command import BinderSettings, build_config
from services.binder.extender import is_ours, lookup_reply
from shared import annotations as names
from shared import codec, subjects
from shared.config import ConfigError
from shared.kubeobjects import Pod
from shared.messages.extender import PodLookup, PodLookupReply
from shared.messages.nodes import NodeFacts
from shared.messages.pods import PodDeleted, PodPending
from shared.runtime.nats import NatsBus
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.resources import NODE, POD
from tests.binder.builders import container, node, pod
from tests.binder.conftest import BinderFactory, collect, eventually

EXTENDER = ("default-scheduler", "tessera-extender")


def as_pod(body: dict[str, Any], uid: str = "u1") -> Pod:
    body = {**body, "metadata": {**body["metadata"], "uid": uid}}
    return msgspec.convert(body, Pod)


@pytest.mark.parametrize(
    ("body", "ours"),
    [
        (pod("a", scheduler="tessera"), True),
        (pod("b", scheduler="tessera-extender"), True),
        (pod("c", scheduler="default-scheduler"), True),
        (pod("d", container(cpu="1"), scheduler="default-scheduler"), False),
        (pod("e", scheduler="volcano"), False),
        (
            pod(
                "f",
                container(cpu="1"),
                init_containers=[container(gpu=1)],
                scheduler="default-scheduler",
            ),
            True,
        ),
    ],
)
def test_which_pods_are_tessera_s(body: dict[str, Any], ours: bool) -> None:
    assert (
        is_ours(as_pod(body), scheduler_name="tessera", extender_scheduler_names=EXTENDER) is ours
    )


LOOKUP = PodLookup(uid="u1", namespace="default", name="p")


@pytest.mark.parametrize(
    ("body", "uid", "expected"),
    [
        (None, "u1", "pod default/p does not exist"),
        (pod("p", scheduler="tessera-extender"), "u2", "pod default/p is another pod now"),
        (pod("p", scheduler="tessera-extender", node="gpu-1"), "u1", "node=gpu-1"),
        (pod("p", container(cpu="1"), scheduler="tessera-extender"), "u1", "asks for no"),
        (pod("p", scheduler="tessera"), "u1", "Tessera schedules it itself"),
        (pod("p", scheduler="volcano"), "u1", "add it, or the binder never sees the pod go"),
        (
            pod("p", scheduler="tessera-extender", annotations={names.GPU_POLICY: "fastest"}),
            "u1",
            "invalid request: metadata.annotations[tessera.dev/gpu-policy]: 'fastest' is not",
        ),
    ],
)
def test_lookup_replies_say_why_a_pod_cannot_be_bound(
    body: dict[str, Any] | None, uid: str, expected: str
) -> None:
    found = None if body is None else as_pod(body, uid)
    reply = lookup_reply(
        LOOKUP, found, namespaces={}, scheduler_name="tessera", extender_scheduler_names=EXTENDER
    )
    assert reply.uid == "u1" and reply.pod is None
    if expected.startswith("node="):
        assert (reply.node, reply.error) == ("gpu-1", "")
    else:
        assert expected in reply.error


def test_a_placeable_pod_is_looked_up_as_an_extender_pod() -> None:
    reply = lookup_reply(
        LOOKUP,
        as_pod(pod("p", container(gpu=1, memory=4096, cores=30), scheduler="tessera-extender")),
        namespaces={},
        scheduler_name="tessera",
        extender_scheduler_names=EXTENDER,
    )
    assert reply.error == "" and reply.pod is not None
    assert reply.pod.extender
    (request,) = reply.pod.containers
    assert (request.gpu_shares, request.gpu_memory_mib, request.gpu_cores) == (1, 4096, 30)


def _keeping_away_from_team(team: str) -> Pod:
    """An extender pod with an anti-affinity to ``app=web`` pods of namespaces labelled
    ``team=<team>``."""
    body = pod("p", container(gpu=1, memory=4096, cores=30), scheduler="tessera-extender")
    body["spec"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app": "web"}},
                    "namespaceSelector": {"matchLabels": {"team": team}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    return as_pod(body)


def test_a_looked_up_pod_has_its_namespace_selector_resolved_as_the_binder_resolves_it() -> None:
    namespaces = {"blue": {"team": "a"}, "green": {"team": "a"}, "red": {"team": "b"}}
    reply = lookup_reply(
        LOOKUP,
        _keeping_away_from_team("a"),
        namespaces=namespaces,
        scheduler_name="tessera",
        extender_scheduler_names=EXTENDER,
    )
    assert reply.error == "" and reply.pod is not None and reply.pod.constraints is not None
    anti = reply.pod.constraints.pod_anti_affinity
    assert anti is not None and anti.required[0].namespaces == ("blue", "green")
    # Before the namespace informer listed the namespaces the selector cannot be resolved: the
    # bind is refused with the reason, never decided with the term matching nothing.
    unlisted = lookup_reply(
        LOOKUP,
        _keeping_away_from_team("a"),
        namespaces=None,
        scheduler_name="tessera",
        extender_scheduler_names=EXTENDER,
    )
    assert unlisted.pod is None
    assert unlisted.error == (
        "pod default/p names a namespaceSelector, and the binder has not listed the cluster's "
        "namespaces yet"
    )


def test_extender_names_must_not_include_tessera_s_own() -> None:
    settings = BinderSettings(extender_scheduler_names=("default-scheduler", "tessera"))
    with pytest.raises(ConfigError, match="must not name --scheduler-name"):
        build_config(settings, environ={})
    assert build_config(BinderSettings(), environ={}).extender_scheduler_names == (
        "default-scheduler",
    )


async def lookup(bus: NatsBus, uid: str, name: str) -> PodLookupReply:
    data = codec.encode(PodLookup(uid=uid, namespace="default", name=name))
    return codec.decode(await bus.request(subjects.EXTENDER_PODS, data, timeout=10), PodLookupReply)


async def test_extender_pods_are_watched_looked_up_and_released_never_published_pending(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    api.create(NODE, node("gpu-1", cpu="32", memory="128Gi", gpus=4))
    pending = await collect(bus, subjects.PODS_PENDING)
    deleted = await collect(bus, subjects.PODS_DELETED)
    async with start_binder(extender_scheduler_names=("tessera-extender",)):
        gpu = api.create(
            POD, pod("train", container(gpu=1, memory=4096, cpu="2"), scheduler="tessera-extender")
        )
        api.create(POD, pod("own", scheduler="tessera"))
        uid = gpu["metadata"]["uid"]
        await eventually(lambda: len(pending.deliveries) == 1, what="the scheduler-mode pod")
        assert [m.name for m in pending.decoded(PodPending)] == ["own"]

        found = await lookup(bus, uid, "train")
        assert found.pod is not None and found.pod.extender and found.pod.uid == uid
        assert found.pod.containers[0].gpu_memory_mib == 4096
        # A pod created a moment ago, which the informer may not have yet, is read from the API.
        fresh = api.create(POD, pod("fresh", scheduler="tessera-extender"))
        assert (await lookup(bus, fresh["metadata"]["uid"], "fresh")).pod is not None
        assert "does not exist" in (await lookup(bus, "nope", "missing")).error

        api.bind("default", "train", {"metadata": {"name": "train"}, "target": {"name": "gpu-1"}})

        async def counted_as_tessera_s() -> bool:
            entry = await bus.kv_get(subjects.KV_NODES, "gpu-1")
            facts = None if entry is None else codec.decode(entry.value, NodeFacts)
            return facts is not None and facts.tessera_cpu_requested_milli == 2000

        await eventually(counted_as_tessera_s, what="its CPU counted as Tessera's")
        assert (await lookup(bus, uid, "train")).node == "gpu-1"

        api.delete(POD, "default", "train")
        await eventually(lambda: deleted.deliveries, what="PodDeleted for the extender pod")
        (gone,) = deleted.decoded(PodDeleted)
        assert (gone.uid, gone.node) == (uid, "gpu-1")
    # A leader republishes every pending pod when it takes over: "own" may come again, an
    # extender pod never.
    assert {m.name for m in pending.decoded(PodPending)} == {"own"}
