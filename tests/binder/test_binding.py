"""The binder binds a placed claim's booking by writing its record ``bound``, planning from its
mirror, and stays exact when the mirror is behind the bucket: the record's write (create-only, or
compare-and-set at the revision read) is what decides, so a placement is bound once.

The binder's parts are built as the service builds them (real NATS, the real kubernetes-asyncio
client over the API test double) but not run, so no watch refreshes the mirror behind the test's
back: the mirror holds exactly what the test seeds.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from services.binder.command import build_config
from services.binder.kube import KubeGateway, load_configuration, new_configuration
from services.binder.metrics import BinderMetrics
from services.binder.service import Binder
from shared import codec, subjects
from shared.clock import SystemClock
from shared.messages.assignments import AssignmentRecord, ContainerAllocation, released
from shared.runtime.bus import BusUnavailableError
from shared.runtime.edge import Edge
from shared.runtime.health import Readiness
from shared.runtime.metrics import EdgeMetrics
from shared.runtime.nats import NatsBus
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.resources import NODE, POD
from tests.binder.builders import booking, node, pod, record, slices
from tests.binder.conftest import FAST_RETRY
from tests.binder.conftest import test_settings as binder_settings
from tests.harness.commits import commit
from tests.harness.kv import create_committed, put_record
from tests.harness.lossy import LostAnswerBus
from tests.harness.nats import NatsServer, replace_store


@dataclass
class IdleBinder:
    parts: Binder
    registry: CollectorRegistry

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
async def idle_binder(
    nats_server: NatsServer, kubeconfig: Path, bus: NatsBus
) -> AsyncIterator[IdleBinder]:
    """A binder's parts, not started: no watch feeds its record mirror."""
    async with built_binder(nats_server, kubeconfig, bus) as binder:
        yield binder


@contextlib.asynccontextmanager
async def built_binder(
    nats_server: NatsServer, kubeconfig: Path, bus: Any, **overrides: Any
) -> AsyncIterator[IdleBinder]:
    settings = binder_settings(nats_server, kubeconfig, leader_elect=False, **overrides)
    configuration = new_configuration()
    await load_configuration(configuration, kubeconfig=settings.kubeconfig, environ={})
    clock = SystemClock()
    registry = CollectorRegistry()
    metrics = BinderMetrics.create(registry)
    gateway = KubeGateway.create(
        configuration, metrics, clock=clock, timeout_s=settings.api_timeout_s, retry=FAST_RETRY
    )
    try:
        parts = Binder(
            config=build_config(settings, environ=os.environ),
            gateway=gateway,
            bus=bus,
            edge=Edge(bus=bus, metrics=EdgeMetrics.create(registry), clock=clock, service="binder"),
            clock=clock,
            metrics=metrics,
            readiness=Readiness(),
        )
        await parts.restorer.check()  # the store in use is restored (nothing bound to restore)
        yield IdleBinder(parts=parts, registry=registry)
    finally:
        with contextlib.suppress(Exception):
            await gateway.close()


async def placed(api: ApiServer, bus: NatsBus, name: str = "train") -> AssignmentRecord:
    """A pod and its placement committed (booking and claim), as the record the binder writes."""
    api.create(NODE, node())
    uid = api.create(POD, pod(name))["metadata"]["uid"]
    placement = record(uid, name, slices("main", (3, 8192, 30)), state="bound")
    await commit(bus, placement)
    return placement


async def stored(bus: NatsBus, of: AssignmentRecord) -> AssignmentRecord | None:
    entry = await bus.kv_get(subjects.KV_ASSIGNMENTS, subjects.assignment_key(of.node, of.pod_uid))
    return None if entry is None else codec.decode(entry.value, AssignmentRecord)


async def test_a_placement_is_bound_by_writing_its_record(
    api: ApiServer, bus: NatsBus, idle_binder: IdleBinder
) -> None:
    placement = await placed(api, bus)
    await idle_binder.parts.placements.bind(booking(placement))
    assert [w.code for w in api.writes_to("pods/binding")] == [201]
    bound = await stored(bus, placement)
    assert bound is not None
    assert bound == msgspec.structs.replace(placement, bound_at=bound.bound_at)


async def test_nothing_is_bound_into_a_store_not_restored_yet(
    nats_server: NatsServer, api: ApiServer, bus: NatsBus, idle_binder: IdleBinder
) -> None:
    """NATS lost its store: until the binder has restored into the new one what is bound, it
    binds nothing. A pod held at the ambiguity gate behind a bound pod whose record the loss
    took passed the gate, and the device plugin served the bound pod's Allocate from the other
    pod's record (a store-loss chaos run: a container with another pod's slice)."""
    binder = idle_binder.parts
    placement = await placed(api, bus)
    other = await replace_store(nats_server)
    try:
        await bus.restore_topology(reason="the store was replaced (test)")
        assert bus.store_epoch == other.store_epoch
        await commit(bus, placement)  # placed again in the new store
        with pytest.raises(BusUnavailableError, match="waits for its restore"):
            await binder.placements.bind(booking(placement))
        assert api.writes_to("pods/binding") == []
        assert await stored(bus, placement) is None
        await binder.restorer.check()
        await binder.placements.bind(booking(placement))
        assert [w.code for w in api.writes_to("pods/binding")] == [201]
    finally:
        await other.drain()


async def test_a_placement_seen_twice_is_bound_once(
    api: ApiServer, bus: NatsBus, idle_binder: IdleBinder
) -> None:
    """The binder looks at a pod again (a watch delivering its claim again, a new leader): its
    record says bound and the pod is bound, so nothing is written and no Binding created."""
    binder = idle_binder.parts
    placement = await placed(api, bus)
    await binder.placements.bind(booking(placement))
    first = await bus.kv_get(
        subjects.KV_ASSIGNMENTS, subjects.assignment_key("gpu-1", placement.pod_uid)
    )
    await binder.placements.bind(booking(placement))
    await binder.placements.bind(booking(placement))
    assert [w.code for w in api.writes_to("pods/binding")] == [201]
    again = await bus.kv_get(
        subjects.KV_ASSIGNMENTS, subjects.assignment_key("gpu-1", placement.pod_uid)
    )
    assert first is not None and again is not None and again.revision == first.revision


async def test_a_mirror_behind_the_bucket_never_binds_a_released_placement(
    api: ApiServer, bus: NatsBus, idle_binder: IdleBinder
) -> None:
    """The placer released the placement (its reserve timeout: a fence, the record written
    ``released``) before the binder's mirror saw it: the create-only write fails, the bucket is
    read, and the placement is dropped: no Binding, and the record stays released."""
    binder = idle_binder.parts
    placement = await placed(api, bus)
    key = subjects.assignment_key("gpu-1", placement.pod_uid)
    fence = released(placement, now=5.0)
    assert await bus.kv_create(subjects.KV_ASSIGNMENTS, key, codec.encode(fence))
    assert binder.records.latest(key) is None, "the mirror is behind the bucket"

    await binder.placements.bind(booking(placement))

    assert api.writes_to("pods/binding") == []
    assert "nodeName" not in api.get(POD, "default", "train")["spec"]
    assert await stored(bus, placement) == fence
    assert idle_binder.metric("tessera_binder_binds_total", outcome="dropped") == 1


async def test_a_record_bound_with_a_lost_answer_holds_the_gate(
    api: ApiServer, bus: NatsBus, nats_server: NatsServer, kubeconfig: Path
) -> None:
    """A chaos run: the binder's write of ``first``'s record landed but its answer was lost, and
    the read-back failed (NATS electing its leaders). Its mirror did not hold it bound, so the
    gate let ``second`` (same device count, other slices) onto the node, and the device plugin
    served each pod from the other's record. A record whose outcome is unknown now counts as
    bound at the gate until it is read back."""
    api.create(NODE, node())
    first, second = (
        record(
            api.create(POD, pod(name))["metadata"]["uid"], name, slices("main", gpu), state="bound"
        )
        for name, gpu in (("first", (0, 8192, 10)), ("second", (1, 4096, 5)))
    )
    lossy = LostAnswerBus(bus, lands=True, unreadable=1_000_000)  # until NATS is back
    async with built_binder(nats_server, kubeconfig, lossy, gate_timeout_s=0.5) as idle:
        binder = idle.parts
        for placement in (first, second):
            await commit(bus, placement)
        with pytest.raises(BusUnavailableError):  # looked at again later
            await binder.placements.bind(booking(first))
        written = await stored(bus, first)
        assert written is not None and written.state == "bound"

        await binder.placements.bind(booking(second))  # held, then failed back
        assert api.writes_to("pods/binding") == []
        assert idle.metric("tessera_binder_gate_waits_total", outcome="timed_out") == 1

        lossy.unreadable = 0  # the next look reads the record back and binds the pod
        await binder.placements.bind(booking(first))
    assert [w.code for w in api.writes_to("pods/binding")] == [201]
    assert api.get(POD, "default", "first")["spec"]["nodeName"] == "gpu-1"


async def test_the_mirror_knows_the_newest_revision_of_a_key_it_no_longer_serves(
    api: ApiServer, bus: NatsBus, idle_binder: IdleBinder
) -> None:
    """What the gate drops a record in doubt on: a newer revision seen, released ones too."""
    mirror = idle_binder.parts.records
    api.create(NODE, node())
    uid = api.create(POD, pod("train"))["metadata"]["uid"]
    reserved = record(uid, "train", slices("main", (3, 8192, 30)))
    await create_committed(bus, reserved)
    key = subjects.assignment_key("gpu-1", uid)
    held = await mirror.read(key)
    assert held is not None and mirror.revision(key) == held.revision
    assert mirror.revision("gpu-1.no-such-pod") == 0
    revision = await bus.kv_update(
        subjects.KV_ASSIGNMENTS,
        key,
        codec.encode(released(reserved, now=5.0)),
        revision=held.revision,
    )
    assert revision is not None
    await mirror.read(key)
    assert mirror.get(key) is None and mirror.revision(key) == revision
    assert mirror.latest(key) is not None and mirror.latest(key).revision == revision  # type: ignore[union-attr]


async def test_a_reserved_record_an_earlier_placer_wrote_is_bound_by_compare_and_set(
    api: ApiServer, bus: NatsBus, idle_binder: IdleBinder
) -> None:
    """Placers before this protocol wrote the record ``reserved`` themselves: the binder moves it
    on to ``bound`` at the revision it read, as it always did."""
    api.create(NODE, node())
    uid = api.create(POD, pod("train"))["metadata"]["uid"]
    reserved = record(uid, "train", slices("main", (3, 8192, 30)))
    await create_committed(bus, reserved)
    await idle_binder.parts.placements.bind(booking(reserved))
    assert [w.code for w in api.writes_to("pods/binding")] == [201]
    bound = await stored(bus, reserved)
    assert bound is not None and (bound.state, bound.commit) == ("bound", reserved.commit)


async def test_a_placement_over_an_earlier_commit_s_released_record_keeps_its_fence(
    api: ApiServer, bus: NatsBus, idle_binder: IdleBinder
) -> None:
    """The pod was placed on the node before (that commit was requeued: its record released),
    and again now: the binder writes the new commit's record over the released one, carrying the
    older commit on as a fence (it may never take the key again)."""
    api.create(NODE, node())
    uid = api.create(POD, pod("train"))["metadata"]["uid"]
    older = record(uid, "train", slices("main", (3, 8192, 30)), commit="commit-older")
    await create_committed(bus, released(older, now=5.0))
    newer = msgspec.structs.replace(older, commit="commit-newer", state="bound")
    await commit(bus, newer)

    await idle_binder.parts.placements.bind(booking(newer))

    assert [w.code for w in api.writes_to("pods/binding")] == [201]
    bound = await stored(bus, newer)
    assert bound is not None
    assert (bound.commit, bound.state, bound.fenced) == ("commit-newer", "bound", ("commit-older",))


async def test_a_live_record_of_another_commit_holds_the_placement_back(
    api: ApiServer, bus: NatsBus, idle_binder: IdleBinder
) -> None:
    """A live record of another commit holds the pod's key (a placer's reconciliation releases
    it, and the binder looks again when it changes): nothing is written, no Binding."""
    api.create(NODE, node())
    uid = api.create(POD, pod("train"))["metadata"]["uid"]
    other = record(uid, "train", slices("main", (3, 8192, 30)), commit="commit-other")
    await create_committed(bus, other)
    mine = msgspec.structs.replace(other, commit="commit-mine", state="bound")
    await commit(bus, mine)
    await idle_binder.parts.placements.bind(booking(mine))
    assert api.writes_to("pods/binding") == []
    assert await stored(bus, mine) == other
    assert idle_binder.metric("tessera_binder_binds_total", outcome="dropped") == 1


async def test_a_record_moved_backwards_does_not_hold_the_gate(
    api: ApiServer, bus: NatsBus, nats_server: NatsServer, kubeconfig: Path
) -> None:
    """A node's own credentials replayed an older version of ``first``'s record (``allocated
    -> bound``): the device plugin refuses it, and the binder's gate once waited for it, holding
    every pod headed to the node 30 s at a time while other nodes had room. One rule for both
    now (``shared.validation.transition_problem``): the mirror dead-letters the version and
    ``second`` binds at once."""
    api.create(NODE, node())
    first, second = (
        record(api.create(POD, pod(name))["metadata"]["uid"], name, slices("main", gpu))
        for name, gpu in (("first", (0, 8192, 10)), ("second", (1, 4096, 5)))
    )
    bound = msgspec.structs.replace(first, state="bound", bound_at=time.time())
    allocated = msgspec.structs.replace(
        bound,
        state="allocated",
        allocated=(ContainerAllocation(container="main", device_ids=("d0",), allocated_at=1.0),),
        allocated_at=time.time(),
    )
    async with built_binder(nats_server, kubeconfig, bus, gate_timeout_s=0.5) as idle:
        binder = idle.parts
        key = subjects.assignment_key("gpu-1", first.pod_uid)
        await commit(bus, allocated)
        for version in (allocated, bound):  # the replay comes last
            await put_record(bus, version)
            entry = await bus.kv_get(subjects.KV_ASSIGNMENTS, key)
            assert entry is not None
            await binder.records.take(entry)
        await commit(bus, second)

        await binder.placements.bind(booking(second))

        assert idle.metric("tessera_binder_gate_waits_total", outcome="timed_out") == 0
        assert [w.code for w in api.writes_to("pods/binding")] == [201]
        assert api.get(POD, "default", "second")["spec"]["nodeName"] == "gpu-1"
        rejected = idle.metric(
            "tessera_messages_rejected_total", family="assignments", kind="validate"
        )
        assert rejected == 1, "the backwards version dead-lettered, with its reason"
