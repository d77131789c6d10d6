"""Kubernetes' scheduling constraints in the placer service over a real nats-server (the binder's
and the inventory's side played here): reasons worded as kube-scheduler words them, a label
change waking the pod it lets fit, pods counted across placements."""

from __future__ import annotations

import time

import msgspec

from shared.messages.constraints import (
    Constraints,
    LabelSelector,
    PodAffinity,
    PodAffinityTerm,
    Taint,
    Toleration,
)
from shared.messages.pods import PodPending
from shared.runtime.nats import NatsBus
from tests.harness.kv import put_facts
from tests.placer import wire
from tests.placer.conftest import PlacerFactory, rejections, until
from tests.placer.test_service import live_of, placed, settled

HOSTNAME = "kubernetes.io/hostname"


def constrained(uid: str, constraints: Constraints, **labels: str) -> PodPending:
    return msgspec.structs.replace(
        wire.pending(uid), labels=labels or {"app": "x"}, constraints=constraints
    )


async def put_node(
    bus: NatsBus, name: str, *, taints: tuple[Taint, ...] = (), **labels: str
) -> None:
    await wire.put_node(bus, name, 2)
    facts = wire.facts(name, at=time.time(), labels={HOSTNAME: name, **labels})
    await put_facts(bus, msgspec.structs.replace(facts, taints=taints))


async def test_a_selector_nobody_matches_waits_until_a_node_is_labelled(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    await put_node(bus, "n1")
    await put_node(bus, "n2", taints=(Taint(key="gpu", value="reserved", effect="NoSchedule"),))
    async with start_placer() as placer:
        await wire.publish_pod(bus, constrained("sel", Constraints(node_selector=(("pool", "a"),))))
        await until(
            lambda: placer.metric("tessera_placer_decisions_total", outcome="rejected") == 1,
            what="the pod rejected",
        )
        (rejected,) = await rejections(bus)
        assert rejected.message == (
            "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
            "1 node(s) had untolerated taint {gpu: reserved}."
        )
        assert not rejected.unresolvable
        # A label is all it waits for: the label put on n1 wakes it.
        await put_node(bus, "n1", pool="a")
        state = await settled(bus, placed("sel"), what="placed once n1 is labelled")
        assert live_of(state, "sel")[0].node == "n1"
        # Kept off the tainted node without a toleration, let on with one.
        tolerant = Constraints(
            node_selector=((HOSTNAME, "n2"),),
            tolerations=(Toleration(key="gpu", operator="Exists"),),
        )
        await wire.publish_pod(bus, constrained("tolerant", tolerant))
        state = await settled(bus, placed("tolerant"), what="the tolerant pod placed")
        assert live_of(state, "tolerant")[0].node == "n2"
        booking = next(b for b in state.bookings() if b.pod_uid == "tolerant")
        assert booking.labels == {"app": "x"}


async def test_anti_affinity_counts_the_replicas_placed_before_and_waits_for_one_to_leave(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    await put_node(bus, "n1")
    await put_node(bus, "n2")
    apart = Constraints(
        pod_anti_affinity=PodAffinity(
            required=(
                PodAffinityTerm(
                    selector=LabelSelector(match_labels=(("app", "x"),)),
                    namespaces=("ml",),
                    topology_key=HOSTNAME,
                ),
            )
        )
    )
    async with start_placer() as placer:
        for uid in ("r1", "r2", "r3"):
            await wire.publish_pod(bus, constrained(uid, apart))
        state = await settled(bus, placed("r1", "r2"), what="two replicas placed")
        assert {live_of(state, uid)[0].node for uid in ("r1", "r2")} == {"n1", "n2"}
        await until(
            lambda: placer.metric("tessera_placer_decisions_total", outcome="rejected") == 1,
            what="the third rejected",
        )
        (rejected,) = await rejections(bus)
        assert rejected.pod_uid == "r3"
        assert rejected.message == (
            "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules."
        )
        freed = live_of(state, "r1")[0].node
        await wire.delete_pod(bus, "r1")
        state = await settled(bus, placed("r3"), what="the third placed once one left")
        assert live_of(state, "r3")[0].node == freed
