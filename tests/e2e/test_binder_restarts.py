"""What the decision stream used to give, now given by the claims and the records: a binder down
for a whole burst binds every pod once it is back, one SIGKILLed between writing a pod's record
and creating its Binding binds it after its restart, and a binder that looks at what it bound
before binds nothing again. Real processes over a real nats-server: placers, binder, device
plugins and the kubelets of ``tessera up``."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest

from shared import codec, subjects
from shared.messages.assignments import AssignmentRecord
from shared.messages.ledger import PodClaim
from tessera.devcluster.resources import POD
from tessera.up import workload as w
from tessera.up.system import LocalSystem
from tests.e2e.helpers import (
    assert_exact,
    clear,
    connected_bus,
    phase,
    pods_of,
    settle,
    until,
)

pytestmark = [pytest.mark.asyncio(loop_scope="package"), pytest.mark.timeout(240)]


def pod(name: str, namespace: str) -> dict[str, object]:
    return w.pod(
        name,
        [w.container(gpu=1, memory_mib=2048, cores=5, cpu="100m", memory="64Mi")],
        namespace=namespace,
    )


def binder_metric(system: LocalSystem, metric: str) -> float:
    """``metric`` summed over the live binder processes' /metrics pages."""
    total = 0.0
    for name in system.binder_names():
        port = system.supervisor.http_port(name)
        if port is None or not system.supervisor.children[name].alive:
            continue
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
            text = page.read().decode()
        total += sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(metric) and not line.startswith("#")
        )
    return total


def bindings(system: LocalSystem, namespace: str) -> dict[str, int]:
    """The Bindings the API accepted, per pod name of ``namespace``."""
    accepted: dict[str, int] = {}
    for write in system.cluster.api.writes_to("pods/binding", "create"):
        if write.namespace == namespace and write.code < 300:
            accepted[write.name] = accepted.get(write.name, 0) + 1
    return accepted


async def claims_placed(system: LocalSystem, uids: list[str]) -> bool:
    bus = await connected_bus(system)
    for uid in uids:
        entry = await bus.kv_get(subjects.KV_CLAIMS, subjects.claim_key(uid))
        if entry is None or codec.decode(entry.value, PodClaim).state != "placed":
            return False
    return True


async def record_at(system: LocalSystem, obj: dict[str, object]) -> tuple[int, AssignmentRecord]:
    """The pod's record on its node (it must have one) and its revision."""
    bus = await connected_bus(system)
    spec = obj["spec"]
    metadata = obj["metadata"]
    assert isinstance(spec, dict) and isinstance(metadata, dict)
    key = subjects.assignment_key(spec["nodeName"], metadata["uid"])
    entry = await bus.kv_get(subjects.KV_ASSIGNMENTS, key)
    assert entry is not None, key
    return entry.revision, codec.decode(entry.value, AssignmentRecord)


async def restart_binder_and_wait_for_its_look(system: LocalSystem, placed: int) -> None:
    """SIGKILL the binder and start it again; wait until the new leader has looked at every
    placed pod (each one it finds bound counts as ``bound``)."""
    (binder,) = system.binder_names()
    system.kill(binder)
    system.restart(binder)
    await system.leader(timeout=60)
    await until(
        lambda: binder_metric(system, 'tessera_binder_binds_total{outcome="bound"}') >= placed,
        what="the new leader's look at every placed pod",
    )


async def test_a_binder_down_for_a_whole_burst_binds_every_pod_when_it_comes_back(
    system: LocalSystem,
) -> None:
    ns = "binder-down"
    count = 12
    placers = system.placer_names()
    (binder,) = system.binder_names()
    published = binder_metric(system, 'tessera_binder_pods_published_total{kind="pending"}')
    for name in placers:  # nothing places until the binder is gone
        system.kill(name)
    for i in range(count):
        system.cluster.create_pod(pod(f"burst-{i}", ns))
    await until(
        lambda: (
            binder_metric(system, 'tessera_binder_pods_published_total{kind="pending"}')
            >= published + count
        ),
        what="every pod published as pending",
    )
    system.kill(binder)
    for name in placers:
        system.restart(name)
    uids = [p["metadata"]["uid"] for p in pods_of(system, ns)]
    await until(lambda: claims_placed(system, uids), what="the whole burst placed")
    assert not any(p["spec"].get("nodeName") for p in pods_of(system, ns)), "nobody binds"

    system.restart(binder)
    pods = await settle(system, ns, count, timeout=120)
    assert all(phase(p) == "Running" for p in pods), [
        (p["metadata"]["name"], phase(p)) for p in pods
    ]
    await assert_exact(system, pods)
    assert bindings(system, ns) == {f"burst-{i}": 1 for i in range(count)}, "each bound once"
    await clear(system, ns)


async def test_a_binder_killed_between_a_record_and_its_binding_binds_it_once_after_restart(
    system: LocalSystem,
) -> None:
    """The binder writes the pod's record ``bound``, then waits on the Binding (held by the API
    for a while, then refused): SIGKILLed there, and started again, it finds the record its
    predecessor wrote and creates the Binding, once. Started once more, it binds nothing again:
    a placement seen twice is bound once."""
    ns = "binder-killed"
    api = system.cluster.api
    delay_s = 5.0
    held = api.faults.add(verb="create", resource="pods/binding", status=503, delay_s=delay_s)
    system.cluster.create_pod(pod("cut", ns))
    uid = pods_of(system, ns)[0]["metadata"]["uid"]
    await until(lambda: held.hits == 1, what="the Binding under way")
    loop = asyncio.get_running_loop()
    asked_at = loop.time()

    async def recorded() -> AssignmentRecord | None:
        bus = await connected_bus(system)
        claim = await bus.kv_get(subjects.KV_CLAIMS, subjects.claim_key(uid))
        if claim is None:
            return None
        booking = codec.decode(claim.value, PodClaim).booking
        assert booking is not None
        entry = await bus.kv_get(
            subjects.KV_ASSIGNMENTS, subjects.assignment_key(booking.node, uid)
        )
        return None if entry is None else codec.decode(entry.value, AssignmentRecord)

    written = await until(recorded, what="the record written bound")
    assert written.state == "bound"
    assert not api.get(POD, ns, "cut")["spec"].get("nodeName"), "not bound yet"
    assert loop.time() - asked_at < delay_s, "killed while the API still holds the Binding"

    await restart_binder_and_wait_for_its_look(system, placed=0)
    (running,) = await settle(system, ns, 1, timeout=120)
    assert phase(running) == "Running"
    await assert_exact(system, [running])
    assert bindings(system, ns) == {"cut": 1}
    revision, after = await record_at(system, running)
    assert after.bound_at == written.bound_at, "the restarted binder did not write it again"

    await restart_binder_and_wait_for_its_look(system, placed=1)
    assert bindings(system, ns) == {"cut": 1}, "seen again, bound once"
    assert (await record_at(system, running))[0] == revision, "and its record left as it was"
    await clear(system, ns)
