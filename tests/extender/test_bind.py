"""bind over HTTP as kube-scheduler calls it: the placer commits the GPUs on the chosen node, the
real binder binds the pod in the Kubernetes API test double, and only then does the extender
answer; two binds racing for the last slice; a binding that fails is given back; a bind onto a
node the pod's anti-affinity refuses, counting every pod."""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

from shared import annotations as names
from shared import subjects
from shared.messages.pods import PodPending
from shared.runtime.nats import NatsBus
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.resources import NAMESPACE, NODE, POD
from tessera.up.ports import free_port
from tests.binder.builders import container, node, pod
from tests.binder.conftest import BinderFactory, collect, eventually
from tests.binder.test_constraints import ANTI, anti_affinity, namespace
from tests.extender.conftest import golden, post
from tests.harness import kv
from tests.placer import wire
from tests.placer.conftest import PlacerFactory

SCHEDULER = "tessera-extender"
GPU_MIB = wire.GPU_MIB
HOSTNAME = "kubernetes.io/hostname"
ANTI_REASON = "node(s) didn't match pod anti-affinity rules"


async def gpu_node(api: ApiServer, bus: NatsBus, name: str, gpus: int) -> None:
    """The node in the API (the binder publishes its facts) and its GPUs (the inventory's part)."""
    api.create(NODE, node(name, gpus=4 * gpus))
    await kv.put_inventory(bus, wire.inventory(name, gpus, at=time.time()))


def gpu_pod(api: ApiServer, name: str, memory: int) -> dict[str, Any]:
    return api.create(
        POD,
        pod(name, container(gpu=1, memory=memory, cores=25), namespace="ml", scheduler=SCHEDULER),
    )


def binding(obj: dict[str, Any], node_name: str) -> dict[str, str]:
    """ExtenderBindingArgs exactly as kube-scheduler fills it from its Binding."""
    args: dict[str, str] = golden("bind")
    return {
        **args,
        "PodName": obj["metadata"]["name"],
        "PodNamespace": obj["metadata"]["namespace"],
        "PodUID": obj["metadata"]["uid"],
        "Node": node_name,
    }


def candidates(api: ApiServer, name: str, *nodes: str) -> dict[str, Any]:
    """ExtenderArgs of a nodeCacheCapable extender for the pod as kube-scheduler holds it."""
    return {"Pod": api.get(POD, "ml", name), "Nodes": None, "NodeNames": list(nodes)}


async def until_placed(bus: NatsBus, uid: str, state: str) -> wire.ClusterState:
    deadline = time.monotonic() + 20
    while True:
        found = await wire.cluster_state(bus)
        if any(r.pod_uid == uid and r.state == state for r in found.records.values()):
            return found
        assert time.monotonic() < deadline, f"no {state} record for {uid}: {found}"
        await asyncio.sleep(0.05)


async def test_bind_commits_has_the_binder_bind_and_then_answers(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory, start_placer: PlacerFactory
) -> None:
    await gpu_node(api, bus, "gpu-1", 1)
    pending = await collect(bus, subjects.PODS_PENDING)
    async with (
        start_binder(extender_scheduler_names=(SCHEDULER,)),
        start_placer(extender_port=free_port(), extender_bind_timeout_s=15.0) as placer,
    ):
        assert placer.service is not None and placer.service.extender_port is not None
        port = placer.service.extender_port
        service = placer.service
        await eventually(lambda: service.view.facts("gpu-1"), what="the node's facts")
        train = gpu_pod(api, "train", 4096)
        uid = train["metadata"]["uid"]

        status, passing = await post(port, "filter", candidates(api, "train", "gpu-1", "cpu-9"))
        assert (status, passing["NodeNames"]) == (200, ["gpu-1"])
        status, answer = await post(port, "bind", binding(train, "gpu-1"))
        assert (status, answer) == (200, {"Error": ""})
        # Answered only once bound: the pod is on the node with its GPUs, the record says so.
        bound = api.get(POD, "ml", "train")
        assert bound["spec"]["nodeName"] == "gpu-1"
        assert '"memory_mib":4096' in bound["metadata"]["annotations"][names.ASSIGNMENT].replace(
            " ", ""
        )
        state = await until_placed(bus, uid, "bound")
        (booking,) = state.bookings()
        assert (booking.pod_uid, booking.node) == (uid, "gpu-1")
        claim = state.claims[uid]
        assert claim.state == "placed" and claim.request is not None and claim.request.extender
        # kube-scheduler's retry of a bind that was answered late: already done.
        assert (await post(port, "bind", binding(train, "gpu-1")))[1] == {"Error": ""}

        # What the chosen node cannot take is refused with the reason; nothing is booked.
        big = gpu_pod(api, "big", GPU_MIB - 2048)
        status, answer = await post(port, "bind", binding(big, "gpu-1"))
        assert status == 200
        assert answer["Error"] == "node gpu-1 cannot take the pod: insufficient GPU memory or cores"
        assert [b.pod_uid for b in (await wire.cluster_state(bus)).bookings()] == [uid]
        assert "nodeName" not in api.get(POD, "ml", "big")["spec"]

        # The pod goes: the binder tells the placer, which gives its GPUs back.
        api.delete(POD, "ml", "train")
        await until_placed(bus, uid, "released")

        # A Binding the API refuses: the extender says why and gives the placement back at
        # once (never onto the pending stream: kube-scheduler tries again), and the retry binds.
        api.faults.add(verb="create", resource="pods/binding", status=422, message="no way")
        flaky = gpu_pod(api, "flaky", 4096)
        status, answer = await post(port, "bind", binding(flaky, "gpu-1"))
        assert status == 200
        assert answer["Error"].startswith("the binder could not bind it: the API refused")
        assert "no way" in answer["Error"]
        state = await wire.cluster_state(bus)
        assert state.claims[flaky["metadata"]["uid"]].state == "requeued"
        assert not [b for b in state.bookings() if b.pod_uid == flaky["metadata"]["uid"]]
        assert (await post(port, "bind", binding(flaky, "gpu-1")))[1] == {"Error": ""}
        assert api.get(POD, "ml", "flaky")["spec"]["nodeName"] == "gpu-1"
        assert (
            placer.metric("tessera_placer_extender_requests_total", verb="bind", outcome="bound")
            == 3
        )
    # Nothing of extender mode went to the placer's queue.
    assert not [m for m in pending.decoded(PodPending) if m.namespace == "ml"]


async def test_two_binds_racing_for_the_last_slice_one_wins_nothing_is_over_committed(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory, start_placer: PlacerFactory
) -> None:
    await gpu_node(api, bus, "gpu-1", 1)
    size = GPU_MIB // 2 + 1024  # two of these never share the GPU
    async with (
        start_binder(extender_scheduler_names=(SCHEDULER,)),
        start_placer(placer_id="a", extender_port=free_port(), extender_bind_timeout_s=15.0) as a,
        start_placer(placer_id="b", extender_port=free_port(), extender_bind_timeout_s=15.0) as b,
    ):
        ports = []
        for placer in (a, b):
            assert placer.service is not None and placer.service.extender_port is not None
            ports.append(placer.service.extender_port)
            await eventually(functools.partial(placer.service.view.facts, "gpu-1"), what="facts")
        first, second = gpu_pod(api, "first", size), gpu_pod(api, "second", size)
        # Both pass filter on either replica: the slice is free when kube-scheduler looks.
        for port, name in zip(ports, ("first", "second"), strict=True):
            status, answer = await post(port, "filter", candidates(api, name, "gpu-1"))
            assert (status, answer["NodeNames"]) == (200, ["gpu-1"])
        answers = await asyncio.gather(
            post(ports[0], "bind", binding(first, "gpu-1")),
            post(ports[1], "bind", binding(second, "gpu-1")),
        )
        errors = sorted(answer["Error"] for _, answer in answers)
        assert [status for status, _ in answers] == [200, 200]
        assert errors[0] == ""
        assert errors[1] == "node gpu-1 cannot take the pod: insufficient GPU memory or cores"
        bound = [
            name for name in ("first", "second") if api.get(POD, "ml", name)["spec"].get("nodeName")
        ]
        assert len(bound) == 1
        state = await wire.cluster_state(bus)
        (booking,) = state.bookings()
        assert booking.pod_uid == api.get(POD, "ml", bound[0])["metadata"]["uid"]
        (record,) = state.live_records()
        assert record.pod_uid == booking.pod_uid
        wire.check_invariants(state, {"gpu-1": wire.inventory("gpu-1", 1)})


async def test_bind_judges_the_rules_that_count_pods_among_every_pod_on_every_node(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory, start_placer: PlacerFactory
) -> None:
    """A pod kept away, by required anti-affinity over ``kubernetes.io/hostname``, from the web
    pods of the namespaces labelled ``team=web`` (a pod kube-scheduler placed: the binder's node
    facts carry it) and from its own replicas (Tessera's: their bookings). filter and bind both
    judge it among every pod, the namespace selector resolved from the namespaces the binder
    publishes; a bind onto a node the rules refuse is refused with kube-scheduler's reason and
    books nothing, whatever kube-scheduler chose."""
    await gpu_node(api, bus, "gpu-1", 1)
    await gpu_node(api, bus, "gpu-2", 1)
    api.create(NAMESPACE, namespace("shop", team="web"))
    web = pod(
        "web",
        container(cpu="1"),
        namespace="shop",
        scheduler="default-scheduler",
        labels={"app": "web"},
        node="gpu-1",
    )
    api.create(POD, web)
    async with (
        start_binder(extender_scheduler_names=(SCHEDULER,)),
        start_placer(extender_port=free_port(), extender_bind_timeout_s=15.0) as placer,
    ):
        assert placer.service is not None and placer.service.extender_port is not None
        port = placer.service.extender_port
        replicas = []
        for name in ("train-0", "train-1"):
            body = pod(
                name,
                container(gpu=1, memory=4096, cores=25),
                namespace="ml",
                scheduler=SCHEDULER,
                labels={"app": "train"},
            )
            affinity = anti_affinity("web", "web")
            affinity["podAntiAffinity"][ANTI].append(
                {"labelSelector": {"matchLabels": {"app": "train"}}, "topologyKey": HOSTNAME}
            )
            body["spec"]["affinity"] = affinity
            replicas.append(api.create(POD, body))

        async def filtered() -> dict[str, Any] | None:  # once the facts and namespaces are in
            status, answer = await post(
                port, "filter", candidates(api, "train-0", "gpu-1", "gpu-2")
            )
            return answer if status == 200 and answer["NodeNames"] == ["gpu-2"] else None

        answer = await eventually(filtered, what="train-0 kept off the web pod's node")
        assert answer["FailedNodes"] == {"gpu-1": ANTI_REASON}
        status, bound = await post(port, "bind", binding(replicas[0], "gpu-1"))
        assert (status, bound) == (200, {"Error": f"node gpu-1 cannot take the pod: {ANTI_REASON}"})
        assert not (await wire.cluster_state(bus)).bookings()
        assert (await post(port, "bind", binding(replicas[0], "gpu-2")))[1] == {"Error": ""}
        assert api.get(POD, "ml", "train-0")["spec"]["nodeName"] == "gpu-2"

        # The second replica: its own kind is on gpu-2 now (booked by Tessera), the web pod on
        # gpu-1.
        status, answer = await post(port, "filter", candidates(api, "train-1", "gpu-1", "gpu-2"))
        assert (status, answer["NodeNames"]) == (200, [])
        assert answer["FailedNodes"] == {"gpu-1": ANTI_REASON, "gpu-2": ANTI_REASON}
        status, bound = await post(port, "bind", binding(replicas[1], "gpu-2"))
        assert bound == {"Error": f"node gpu-2 cannot take the pod: {ANTI_REASON}"}
        assert [b.pod_uid for b in (await wire.cluster_state(bus)).bookings()] == [
            replicas[0]["metadata"]["uid"]
        ]
