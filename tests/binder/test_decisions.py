"""The binder takes the record a decision binds from its mirror, and stays exact when the mirror
is behind the bucket: the compare-and-set that moves the record on is what decides.

The binder's parts are built as the service builds them (real NATS, the real kubernetes-asyncio
client over the API test double) but not run, so no watch refreshes the mirror behind the test's
back: the mirror holds exactly what the test seeds.
"""

from __future__ import annotations

import asyncio
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

from services.binder.binding import RecordPendingError
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
from tests.binder.builders import decision, node, pod, record, slices
from tests.binder.conftest import FAST_RETRY
from tests.binder.conftest import test_settings as binder_settings
from tests.harness.commits import commit
from tests.harness.kv import create_committed, put_committed, put_record
from tests.harness.lossy import LostAnswerBus
from tests.harness.nats import NatsServer


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
        yield IdleBinder(parts=parts, registry=registry)
    finally:
        with contextlib.suppress(Exception):
            await gateway.close()


async def committed_in_mirror(api: ApiServer, bus: NatsBus, binder: Binder) -> AssignmentRecord:
    """A pod, its committed reserved record in the bucket, and that revision in the mirror."""
    api.create(NODE, node())
    uid = api.create(POD, pod("train"))["metadata"]["uid"]
    reserved = record(uid, "train", slices("main", (3, 8192, 30)))
    await create_committed(bus, reserved)
    entry = await bus.kv_get(subjects.KV_ASSIGNMENTS, subjects.assignment_key("gpu-1", uid))
    assert entry is not None
    await binder.records.take(entry)
    assert binder.records.get(entry.key) is not None
    return reserved


async def test_a_decision_binds_from_a_current_mirror(
    api: ApiServer, bus: NatsBus, idle_binder: IdleBinder
) -> None:
    reserved = await committed_in_mirror(api, bus, idle_binder.parts)
    await idle_binder.parts.decisions.handle(decision(reserved))
    assert [w.code for w in api.writes_to("pods/binding")] == [201]
    stored = await bus.kv_get(
        subjects.KV_ASSIGNMENTS, subjects.assignment_key("gpu-1", reserved.pod_uid)
    )
    assert stored is not None
    assert codec.decode(stored.value, AssignmentRecord).state == "bound"


async def test_a_mirror_behind_the_bucket_never_binds_a_released_record(
    api: ApiServer, bus: NatsBus, idle_binder: IdleBinder
) -> None:
    """The placer released the record (its reserve timeout) after the mirror took it: the
    mirror still says reserved, the compare-and-set at its revision fails, the bucket is read,
    and the decision is dropped: no Binding, and the record stays released."""
    binder = idle_binder.parts
    reserved = await committed_in_mirror(api, bus, binder)
    key = subjects.assignment_key("gpu-1", reserved.pod_uid)
    held = binder.records.get(key)
    assert held is not None and held.record.state == "reserved"
    gone = released(reserved, now=5.0)
    assert await bus.kv_update(
        subjects.KV_ASSIGNMENTS, key, codec.encode(gone), revision=held.revision
    )
    assert binder.records.get(key) == held, "the mirror is behind the bucket"

    await binder.decisions.handle(decision(reserved))

    assert api.writes_to("pods/binding") == []
    assert "nodeName" not in api.get(POD, "default", "train")["spec"]
    stored = await bus.kv_get(subjects.KV_ASSIGNMENTS, key)
    assert stored is not None
    assert codec.decode(stored.value, AssignmentRecord) == gone
    assert idle_binder.metric("tessera_binder_binds_total", outcome="dropped") == 1


async def test_a_record_bound_with_a_lost_answer_holds_the_gate(
    api: ApiServer, bus: NatsBus, nats_server: NatsServer, kubeconfig: Path
) -> None:
    """A chaos run: the binder's compare-and-set of ``first`` to ``bound`` landed but its answer
    was lost, and the read-back failed (NATS electing its leaders). Its mirror still said
    reserved, so the gate let ``second`` (same device count, other slices) onto the node, and
    the device plugin served each pod from the other's record. A record whose outcome is unknown
    now counts as bound at the gate until it is read back."""
    api.create(NODE, node())
    first, second = (
        record(api.create(POD, pod(name))["metadata"]["uid"], name, slices("main", gpu))
        for name, gpu in (("first", (0, 8192, 10)), ("second", (1, 4096, 5)))
    )
    lossy = LostAnswerBus(bus, lands=True, unreadable=1_000_000)  # until NATS is back
    async with built_binder(nats_server, kubeconfig, lossy, gate_timeout_s=0.5) as idle:
        binder = idle.parts
        for reserved in (first, second):
            await create_committed(bus, reserved)
            key = subjects.assignment_key("gpu-1", reserved.pod_uid)
            entry = await bus.kv_get(subjects.KV_ASSIGNMENTS, key)
            assert entry is not None
            await binder.records.take(entry)
        with pytest.raises(BusUnavailableError):  # redelivered later
            await binder.decisions.handle(decision(first))
        stored = await bus.kv_get(
            subjects.KV_ASSIGNMENTS, subjects.assignment_key("gpu-1", first.pod_uid)
        )
        assert stored is not None and codec.decode(stored.value, AssignmentRecord).state == "bound"

        await binder.decisions.handle(decision(second))  # held, then failed back
        assert api.writes_to("pods/binding") == []
        assert idle.metric("tessera_binder_gate_waits_total", outcome="timed_out") == 1

        lossy.unreadable = 0  # the redelivery reads the record back and binds the pod
        await binder.decisions.handle(decision(first))
    assert [w.code for w in api.writes_to("pods/binding")] == [201]
    assert api.get(POD, "default", "first")["spec"]["nodeName"] == "gpu-1"


async def test_the_mirror_knows_the_newest_revision_of_a_key_it_no_longer_serves(
    api: ApiServer, bus: NatsBus, idle_binder: IdleBinder
) -> None:
    """What the gate drops a record in doubt on: a newer revision seen, released ones too."""
    mirror = idle_binder.parts.records
    reserved = await committed_in_mirror(api, bus, idle_binder.parts)
    key = subjects.assignment_key("gpu-1", reserved.pod_uid)
    held = mirror.get(key)
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


async def _into_mirror(bus: NatsBus, binder: Binder, reserved: AssignmentRecord) -> None:
    """What the binder's watch does with the record's newest version in the bucket."""
    entry = await bus.kv_get(
        subjects.KV_ASSIGNMENTS, subjects.assignment_key(reserved.node, reserved.pod_uid)
    )
    assert entry is not None
    await binder.records.take(entry)


async def test_a_decision_ahead_of_its_record_binds_once_the_record_arrives(
    api: ApiServer, bus: NatsBus, idle_binder: IdleBinder
) -> None:
    """The placer publishes the decision beside the record's write: the binder finds no record
    in its mirror or the bucket, waits, and binds when the watch brings the record."""
    binder = idle_binder.parts
    api.create(NODE, node())
    uid = api.create(POD, pod("train"))["metadata"]["uid"]
    reserved = record(uid, "train", slices("main", (3, 8192, 30)))
    handling = asyncio.create_task(binder.decisions.handle(decision(reserved)))
    await asyncio.sleep(0.3)
    assert not handling.done(), "the decision was settled before its record existed"
    assert api.writes_to("pods/binding") == []

    await create_committed(bus, reserved)
    await _into_mirror(bus, binder, reserved)
    await asyncio.wait_for(handling, 5.0)

    assert [w.code for w in api.writes_to("pods/binding")] == [201]
    assert idle_binder.metric("tessera_binder_binds_total", outcome="dropped") == 0
    assert idle_binder.metric("tessera_binder_record_waits_total", outcome="arrived") == 1


async def test_a_decision_whose_commit_no_claim_names_is_dropped_after_the_wait(
    api: ApiServer, bus: NatsBus, nats_server: NatsServer, kubeconfig: Path
) -> None:
    """No record came within ``record_wait_s``, and the pod's claim names no such commit (the
    commit was released before its record was written): no record will come."""
    api.create(NODE, node())
    uid = api.create(POD, pod("train"))["metadata"]["uid"]
    async with built_binder(nats_server, kubeconfig, bus, record_wait_s=0.5) as idle:
        started = time.monotonic()
        await asyncio.wait_for(idle.parts.decisions.handle(decision(record(uid, "train"))), 10.0)
        assert time.monotonic() - started >= 0.5
        assert idle.metric("tessera_binder_binds_total", outcome="dropped") == 1
        assert idle.metric("tessera_binder_record_waits_total", outcome="dropped") == 1
    assert api.writes_to("pods/binding") == []


async def test_a_decision_whose_claim_still_names_its_commit_comes_back_for_its_record(
    api: ApiServer, bus: NatsBus, nats_server: NatsServer, kubeconfig: Path
) -> None:
    """The placer stopped between publishing the decision and writing the record (or the write
    is slow): the claim names the commit, so the decision is handed back to be delivered again
    rather than dropped, and the delivery after the record is written binds the pod."""
    api.create(NODE, node())
    uid = api.create(POD, pod("train"))["metadata"]["uid"]
    reserved = record(uid, "train", slices("main", (3, 8192, 30)))
    await commit(bus, reserved)  # claim and booking, no record
    async with built_binder(nats_server, kubeconfig, bus, record_wait_s=0.3) as idle:
        with pytest.raises(RecordPendingError, match="its claim still names it"):
            await asyncio.wait_for(idle.parts.decisions.handle(decision(reserved)), 10.0)
        assert idle.metric("tessera_binder_binds_total", outcome="dropped") == 0
        assert idle.metric("tessera_binder_record_waits_total", outcome="pending") == 1
        assert api.writes_to("pods/binding") == []

        await put_record(bus, reserved)  # a repair writes the record
        await _into_mirror(bus, idle.parts, reserved)
        await asyncio.wait_for(idle.parts.decisions.handle(decision(reserved)), 10.0)
    assert [w.code for w in api.writes_to("pods/binding")] == [201]


async def test_a_decision_never_binds_an_earlier_commits_record_at_its_key(
    api: ApiServer, bus: NatsBus, idle_binder: IdleBinder
) -> None:
    """The pod was placed on the node before (that commit was requeued: its record released),
    and again now, on the same GPU: the key holds the older record until the new one replaces
    it. The decision waits for its own commit's record and binds that one."""
    binder = idle_binder.parts
    api.create(NODE, node())
    uid = api.create(POD, pod("train"))["metadata"]["uid"]
    older = record(uid, "train", slices("main", (3, 8192, 30)), commit="commit-older")
    await create_committed(bus, released(older, now=5.0))
    await _into_mirror(bus, binder, older)
    newer = msgspec.structs.replace(older, commit="commit-newer")
    handling = asyncio.create_task(binder.decisions.handle(decision(newer)))
    await asyncio.sleep(0.3)
    assert not handling.done(), "the decision was settled on the older commit's record"

    key = subjects.assignment_key("gpu-1", uid)
    await put_committed(bus, newer)
    await _into_mirror(bus, binder, newer)
    await asyncio.wait_for(handling, 5.0)

    assert [w.code for w in api.writes_to("pods/binding")] == [201]
    stored = await bus.kv_get(subjects.KV_ASSIGNMENTS, key)
    assert stored is not None
    bound = codec.decode(stored.value, AssignmentRecord)
    assert (bound.commit, bound.state) == ("commit-newer", "bound")


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
        await create_committed(bus, second)
        entry = await bus.kv_get(
            subjects.KV_ASSIGNMENTS, subjects.assignment_key("gpu-1", second.pod_uid)
        )
        assert entry is not None
        await binder.records.take(entry)

        await binder.decisions.handle(decision(second))

        assert idle.metric("tessera_binder_gate_waits_total", outcome="timed_out") == 0
        assert [w.code for w in api.writes_to("pods/binding")] == [201]
        assert api.get(POD, "default", "second")["spec"]["nodeName"] == "gpu-1"
        rejected = idle.metric(
            "tessera_messages_rejected_total", family="assignments", kind="validate"
        )
        assert rejected == 1, "the backwards version dead-lettered, with its reason"
