"""The binder service over real NATS and the real kubernetes-asyncio client against the API test
double; the test plays the placer (placements committed, rejections) and the device plugin."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgspec
import nats
import pytest
from nats.js import api as js_api

from services.placer.rules.commit import deleted_claim
from shared import annotations as names
from shared import codec, subjects
from shared.messages.assignments import AssignmentRecord, ContainerAllocation
from shared.messages.base import ContainerSlices
from shared.messages.bindings import BindingResult
from shared.messages.nodes import NodeFacts
from shared.messages.placement import PodInvalid
from shared.messages.pods import PodDeleted, PodPending
from shared.runtime.bus import Delivery
from shared.runtime.nats import NatsBus
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.resources import EVENT, LEASE, NODE, POD
from tests.binder.builders import container, node, pod, record, rejection, slices
from tests.binder.conftest import (
    BinderFactory,
    Collector,
    collect,
    eventually,
    get_record,
    validate_writes,
)
from tests.harness.commits import claim_of
from tests.harness.kv import create_committed, place, put_record
from tests.harness.nats import NatsServer

MERGE = "application/merge-patch+json"


def condition(api: ApiServer, name: str, kind: str = "PodScheduled") -> dict[str, Any] | None:
    found = api.find(POD, "default", name)
    conditions = (found or {}).get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), None)


def events_about(api: ApiServer, name: str, reason: str) -> list[dict[str, Any]]:
    return [
        e for e in api.objects(EVENT) if e["regarding"]["name"] == name and e["reason"] == reason
    ]


def bound_to(api: ApiServer, name: str) -> str:
    """The node ``name`` is bound to ("" while it is not)."""
    found = api.find(POD, "default", name)
    return str(((found or {}).get("spec") or {}).get("nodeName") or "")


def outcomes(api: ApiServer, results: Collector, *names: str) -> dict[str, str]:
    """What became of each named pod: the result the binder published (``failed``, ``gone``),
    or ``bound`` once it is on its node (a bound pod's result goes only to an extender)."""
    found: dict[str, str] = {
        r.name: r.outcome for r in results.decoded(BindingResult) if r.name in names
    }
    return found | {name: "bound" for name in names if bound_to(api, name)}


def uid_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["uid"])


async def test_pending_pods_are_published_once_per_change_and_finished_ones_released(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    api.create(NODE, node())
    pending = await collect(bus, subjects.PODS_PENDING)
    deleted = await collect(bus, subjects.PODS_DELETED)
    async with start_binder():
        a = api.create(POD, pod("a", container(gpu=1, memory=4096)))
        b = api.create(POD, pod("b"))
        # Another scheduler's pod asking for no Tessera resource is not Tessera's.
        api.create(POD, pod("other", container(cpu="1"), scheduler="default-scheduler"))
        await eventually(
            lambda: {m.name for m in pending.decoded(PodPending)} == {"a", "b"},
            what="both Tessera pods published",
        )
        first = next(m for m in pending.decoded(PodPending) if m.name == "a")
        assert first.uid == uid_of(a) and first.containers[0].gpu_memory_mib == 4096
        # A change the placer does not read is not published; one it reads is.
        api.patch(POD, "default", "a", {"metadata": {"labels": {"team": "x"}}}, MERGE)
        api.patch(
            POD, "default", "a", {"metadata": {"annotations": {names.GPU_POLICY: "spread"}}}, MERGE
        )
        await eventually(lambda: len(pending.deliveries) == 3, what="the hint change")
        assert pending.decoded(PodPending)[-1].hints.gpu_policy == "spread"
        # Deleted, or finished after running: the placer releases them.
        api.delete(POD, "default", "b")
        api.bind("default", "a", {"metadata": {"name": "a"}, "target": {"name": "gpu-1"}})
        api.patch(POD, "default", "a", {"status": {"phase": "Succeeded"}}, MERGE, "status")
        api.delete(POD, "default", "other")
        await eventually(lambda: len(deleted.deliveries) == 2, what="two PodDeleted")
        gone = {m.name: m for m in deleted.decoded(PodDeleted)}
        assert gone["b"].uid == uid_of(b) and gone["b"].node is None
        assert gone["a"].node == "gpu-1"
    assert len(pending.deliveries) == 3


async def test_an_invalid_request_is_explained_and_never_published(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    pending = await collect(bus, subjects.PODS_PENDING)
    invalid = await collect(bus, subjects.PLACEMENTS_INVALID)
    async with start_binder() as binder:
        api.create(
            POD,
            pod("bad", container(gpu=1, memory=4096), annotations={names.GPU_POLICY: "fastest"}),
        )
        api.create(POD, pod("good"))
        await eventually(lambda: condition(api, "bad"), what="the condition")
        explained = condition(api, "bad")
        assert explained is not None
        assert (explained["status"], explained["reason"]) == ("False", "Unschedulable")
        assert explained["message"] == (
            "Tessera cannot place this pod as written: "
            "metadata.annotations[tessera.dev/gpu-policy]: 'fastest' is not one of binpack, "
            "spread, colocate"
        )
        await eventually(lambda: events_about(api, "bad", "FailedScheduling"), what="event")
        assert events_about(api, "bad", "FailedScheduling")[0]["type"] == "Warning"
        await eventually(lambda: pending.deliveries, what="the good pod")
        assert [m.name for m in pending.decoded(PodPending)] == ["good"]
        assert binder.metric("tessera_binder_invalid_pods_total") == 1
        # Said on tessera.placements.invalid (the dashboard counts it Pending), once.
        await eventually(lambda: invalid.deliveries, what="the invalid pod said")
        (said,) = invalid.decoded(PodInvalid)
        assert (said.name, said.message) == ("bad", explained["message"])
        assert said.fields == ("metadata.annotations[tessera.dev/gpu-policy]",)
        # Fixed by its owner, it is published.
        api.patch(
            POD,
            "default",
            "bad",
            {"metadata": {"annotations": {names.GPU_POLICY: "spread"}}},
            MERGE,
        )
        await eventually(lambda: len(pending.deliveries) == 2, what="the fixed pod")


async def test_a_pod_nats_does_not_store_says_why_and_is_published_once_it_does(
    api: ApiServer, bus: NatsBus, nats_server: NatsServer, start_binder: BinderFactory
) -> None:
    """JetStream could not store pod work (here the pods' stream is full) and pods stayed
    Pending for 20 s with no event and no reason: the binder says so on the pod, with the bus's
    error, counts it, and publishes the pod once JetStream takes it again."""
    admin = await nats.connect(nats_server.url)
    js = admin.jetstream()
    try:
        config = (await js.stream_info(subjects.STREAM_PODS)).config
        config.max_msgs, config.discard = 1, js_api.DiscardPolicy.NEW
        await js.update_stream(config)
        await js.publish(subjects.PODS_PENDING, b"a pod nobody places yet")  # full now
        api.create(NODE, node())
        async with start_binder() as binder:
            api.create(POD, pod("a", container(gpu=1, memory=4096)))
            await eventually(lambda: condition(api, "a"), what="the condition")
            said = condition(api, "a")
            assert said is not None
            assert (said["status"], said["reason"]) == ("False", "SchedulerError")
            assert said["message"] == (
                "Tessera cannot queue this pod for placement: NATS did not store its request "
                "(StoreRefusedError: JetStream refused to store it (maximum messages exceeded); "
                "nothing was stored). The binder tries again; check NATS."
            )
            await eventually(lambda: events_about(api, "a", "FailedScheduling"), what="event")
            failures = binder.metric("tessera_binder_publish_failures_total", kind="pending")
            assert failures >= 1
            assert binder.metric("tessera_binder_pending_explained_total", cause="not-queued") == 1

            config.max_msgs = -1
            await js.update_stream(config)
            await eventually(
                lambda: binder.metric("tessera_binder_pods_published_total", kind="pending") == 1,
                what="the pod published once JetStream stores it",
            )
            assert (await js.stream_info(subjects.STREAM_PODS)).state.messages == 2
            # Said once: the retries do not write the condition again.
            assert binder.metric("tessera_binder_pending_explained_total", cause="not-queued") == 1
    finally:
        await admin.close()


async def test_a_placement_binds_the_pod_and_a_new_leader_changes_nothing(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    """The binder binds a placed claim's booking: the record written ``bound``, the Binding with
    the assignment annotations, the Scheduled Event; no result is published (only an extender
    waits for one). A binder started again looks at every placed claim and binds nothing twice."""
    api.create(NODE, node())
    results = await collect(bus, subjects.BINDING_RESULTS_ALL)
    async with start_binder() as binder:
        uid = uid_of(api.create(POD, pod("train")))
        rec = record(uid, "train", slices("main", (3, 8192, 30)))
        await place(bus, rec)
        await eventually(lambda: bound_to(api, "train"), what="the pod bound")
        bound = api.get(POD, "default", "train")
        assert bound["spec"]["nodeName"] == "gpu-1"
        assignment = codec.decode(
            bound["metadata"]["annotations"][names.ASSIGNMENT], names.AssignmentAnnotation
        )
        assert assignment.containers[0].gpus[0].uuid == "GPU-0003"
        assert bound["metadata"]["annotations"][names.BIND_TIME].endswith("Z")
        await eventually(lambda: condition(api, "train"), what="PodScheduled")
        assert condition(api, "train")["status"] == "True"  # type: ignore[index]
        stored = await get_record(bus, uid)
        assert stored is not None and stored.state == "bound" and stored.bound_at
        await eventually(lambda: events_about(api, "train", "Scheduled"), what="Scheduled")
        assert (
            "with GPU 3 GPU-0003 (8192 MiB, 30% SMs)"
            in (events_about(api, "train", "Scheduled")[0]["note"])
        )
        assert binder.metric("tessera_binder_bind_latency_seconds_count") == 1
    async with start_binder() as again:
        await eventually(
            lambda: again.metric("tessera_binder_binds_total", outcome="bound") == 1,
            what="the placement looked at again",
        )
        assert again.metric("tessera_binder_bind_latency_seconds_count") == 0
    accepted = [w for w in api.writes_to("pods/binding") if w.code == 201]
    assert len(accepted) == 1, "bound once"
    assert results.deliveries == []
    assert (await bus._js.stream_info(subjects.STREAM_BINDINGS)).state.messages == 0
    assert (await get_record(bus, uid)) == stored


async def test_garbage_assignment_records_are_refused_and_binding_goes_on(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    """Anything can be written to the records bucket: what does not decode, or sits under
    another pod's key, is counted and dead-lettered, never taken in, and never stops the
    binder (whose mirror reads every record, before and after it turned ready)."""
    api.create(NODE, node())
    dead = await collect(bus, subjects.deadletter("assignments"))
    garbage = {
        subjects.assignment_key("gpu-1", "junk-before"): b"\xc1 not msgpack",
        subjects.assignment_key("gpu-1", "wrong-key"): codec.encode(record("other", "other")),
    }
    for key, value in garbage.items():
        await bus.kv_put(subjects.KV_ASSIGNMENTS, key, value)
    async with start_binder() as binder:
        await bus.kv_put(
            subjects.KV_ASSIGNMENTS,
            subjects.assignment_key("gpu-1", "junk-after"),
            codec.encode({"pod_uid": 7, "state": "bound"}),
        )
        uid = uid_of(api.create(POD, pod("train")))
        rec = record(uid, "train", slices("main", (3, 8192, 30)))
        await place(bus, rec)
        await eventually(lambda: bound_to(api, "train"), what="the pod bound")

        def refused(kind: str) -> float:
            return binder.metric("tessera_messages_rejected_total", family="assignments", kind=kind)

        await eventually(lambda: refused("decode") == 2, what="both undecodable records counted")
        assert refused("validate") == 1, "the record under another pod's key"
        await eventually(lambda: len(dead.deliveries) == 3, what="three dead letters")
        assert binder.readiness.ready


async def test_gone_pods_and_given_back_placements(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    results = await collect(bus, subjects.BINDING_RESULTS_ALL)
    async with start_binder() as binder:
        uid = uid_of(api.create(POD, pod("brief")))
        api.delete(POD, "default", "brief")
        await place(bus, record(uid, "brief"))
        await eventually(lambda: results.deliveries, what="a result for the gone pod")
        assert results.decoded(BindingResult)[0].outcome == "gone"
        # Given back before the binder got to it: its record is the release's fence.
        given_back = record(uid_of(api.create(POD, pod("late"))), "late", state="released")
        await put_record(bus, given_back)
        await place(bus, given_back)
        await eventually(
            lambda: binder.metric("tessera_binder_binds_total", outcome="dropped"),
            what="the given-back placement dropped",
        )
        assert len(results.deliveries) == 1, "nothing told to the placer for it"
        assert not bound_to(api, "late")


async def test_rejections_are_explained_once_and_their_events_aggregated(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    async with start_binder() as binder:
        uid = uid_of(api.create(POD, pod("big", container(gpu=8))))
        rejected = rejection(
            uid, "big", (9, "GPU model not allowed"), (3, "insufficient GPU memory")
        )
        for _ in range(5):
            await bus.js_publish(subjects.PLACEMENTS_REJECTED, codec.encode(rejected))
        await eventually(
            lambda: binder.metric("tessera_messages_received_total", family="placements") == 5,
            what="5 rejections",
        )
        await eventually(lambda: events_about(api, "big", "FailedScheduling"), what="the event")
        # The condition and the Event are two writes, in no promised order.
        explained = await eventually(lambda: condition(api, "big"), what="PodScheduled=False")
        assert explained["message"] == (
            "0/12 nodes are available: 3 insufficient GPU memory, 9 GPU model not allowed."
        )
        assert len(api.writes_to("pods/status")) == 1, "the same condition is written once"
    events = events_about(api, "big", "FailedScheduling")
    assert len(events) == 1
    assert events[0]["series"]["count"] == 5, "repeats are a series, written on the way out"


async def test_a_stop_writes_the_queued_events_and_releases_the_lease_on_a_slow_api(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    """The stop's last writes take longer than the lifecycle's 0.1 s re-cancel: the binder's
    HTTP client must stay open until they are done (it was closed under them: the Event series
    was lost and a standby waited out the whole lease)."""
    async with start_binder() as binder:
        uid = uid_of(api.create(POD, pod("big", container(gpu=8))))
        rejected = rejection(uid, "big", (3, "insufficient GPU memory"))
        for _ in range(3):
            await bus.js_publish(subjects.PLACEMENTS_REJECTED, codec.encode(rejected))
        await eventually(lambda: events_about(api, "big", "FailedScheduling"), what="the event")
        await eventually(
            lambda: binder.metric("tessera_messages_received_total", family="placements") == 3,
            what="3 rejections",
        )
        for resource in ("events", "leases"):
            api.faults.add(verb="update", resource=resource, status=0, delay_s=0.4, times=None)
            api.faults.add(verb="patch", resource=resource, status=0, delay_s=0.4, times=None)
    (event,) = events_about(api, "big", "FailedScheduling")
    assert event["series"]["count"] == 3, "the queued series was written on the way out"
    lease = api.get(LEASE, "default", "tessera-binder")["spec"]
    assert lease["holderIdentity"] == "", "the lease was given up for a standby"


async def test_allocation_marks_the_pod_and_a_slow_one_gets_a_warning(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    api.create(NODE, node())
    async with start_binder(allocation_warning_s=0.5):
        uids = {}
        for name in ("fast", "slow"):
            uids[name] = uid_of(api.create(POD, pod(name)))
            gpu = 0 if name == "fast" else 1
            rec = record(uids[name], name, slices("main", (gpu, 4096, 25), devices=2 - gpu))
            await place(bus, rec)
        await eventually(
            lambda: all(api.get(POD, "default", n)["spec"].get("nodeName") for n in uids),
            what="both bound",
        )
        # The device plugin's Allocate moves fast's record to allocated: the binder sees it.
        written = await get_record(bus, uids["fast"])
        assert written is not None
        await bus.kv_put(
            subjects.KV_ASSIGNMENTS,
            subjects.assignment_key(written.node, written.pod_uid),
            codec.encode(settled_by_plugin(written)),
        )
        await eventually(
            lambda: (
                api.get(POD, "default", "fast")["metadata"]["annotations"].get(names.ASSIGNED)
                == "true"
            ),
            what="the assigned annotation",
        )
        # The test's records stay "bound" (no device plugin moves them): both get the warning,
        # naming the node.
        await eventually(lambda: events_about(api, "slow", "AllocationDelayed"), what="warning")
        warning = events_about(api, "slow", "AllocationDelayed")[0]
        assert warning["type"] == "Warning" and "node gpu-1" in warning["note"]
        assert names.ASSIGNED not in api.get(POD, "default", "slow")["metadata"]["annotations"]


async def test_a_pod_without_gpus_gets_no_allocation_warning(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    """A CPU-only Tessera pod is bound and stays ``bound``: no device plugin will ever allocate
    it, so it never gets AllocationDelayed (the GPU pod beside it does)."""
    api.create(NODE, node())
    async with start_binder(allocation_warning_s=0.3):
        uids = {}
        for name, containers in (
            ("cpu-only", (ContainerSlices(container="main", gpus=()),)),
            ("gpu", (slices("main", (0, 4096, 25)),)),
        ):
            uids[name] = uid_of(api.create(POD, pod(name)))
            rec = record(uids[name], name, *containers)
            await place(bus, rec)
        await eventually(
            lambda: all(api.get(POD, "default", n)["spec"].get("nodeName") for n in uids),
            what="both bound",
        )
        await eventually(lambda: events_about(api, "gpu", "AllocationDelayed"), what="warning")
        await asyncio.sleep(0.6)  # two more rounds of the watch
        assert events_about(api, "cpu-only", "Scheduled"), "bound and told"
        assert not events_about(api, "cpu-only", "AllocationDelayed")


async def test_api_faults_are_retried(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    api.create(NODE, node())
    async with start_binder() as binder:
        uid = uid_of(api.create(POD, pod("p")))
        rec = record(uid, "p")
        api.faults.add(verb="create", resource="pods/binding", status=503, times=2)
        await place(bus, rec)
        await eventually(lambda: bound_to(api, "p"), what="bound despite two 503s")
        assert (
            binder.metric("tessera_binder_api_errors_total", verb="create pods/binding", code="503")
            == 2
        )
        # Down for longer than the client retries: the bind is tried again until it works.
        uid2 = uid_of(api.create(POD, pod("q")))
        rec2 = record(uid2, "q", slices("main", (1, 4096, 25), devices=2))
        outage = api.faults.add(verb="create", resource="pods/binding", status=500, times=None)
        await place(bus, rec2)
        await eventually(lambda: outage.hits >= 8, what="the outage to be retried a few times")
        api.faults.clear()
        await eventually(lambda: bound_to(api, "q"), what="bound after the outage")


async def test_the_ambiguity_gate_holds_under_parallel_same_size_placements(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    api.create(NODE, node())
    count = 16
    states: dict[str, AssignmentRecord] = {}
    most_bound = 0
    violations: list[list[str]] = []

    async def device_plugin() -> None:
        """Allocate each bound record a moment after it is bound; watch every KV change."""
        nonlocal most_bound
        watch = bus.kv_watch(subjects.KV_ASSIGNMENTS)
        async for entry in watch:
            if entry is None or entry.deleted:
                continue
            current = codec.decode(entry.value, AssignmentRecord)
            states[current.pod_uid] = current
            bound = [r for r in states.values() if r.state == "bound"]
            most_bound = max(most_bound, len(bound))
            if len({r.containers[0].gpus for r in bound}) > 1:
                violations.append([r.name for r in bound])
            if current.state == "bound":
                await asyncio.sleep(0.02)
                allocated = msgspec.structs.replace(
                    current,
                    state="allocated",
                    allocated=(
                        ContainerAllocation(container="main", device_ids=("d",), allocated_at=1.0),
                    ),
                )
                assert await bus.kv_update(
                    subjects.KV_ASSIGNMENTS,
                    entry.key,
                    codec.encode(allocated),
                    revision=entry.revision,
                )

    plugin = asyncio.create_task(device_plugin())
    try:
        async with start_binder(max_in_flight=64) as binder:
            recs = []
            for i in range(count):
                uid = uid_of(api.create(POD, pod(f"p{i}")))
                recs.append(record(uid, f"p{i}", slices("main", (i % 8, 1024 * (1 + i % 3), 10))))
            await asyncio.gather(*(place(bus, rec) for rec in recs))
            await eventually(
                lambda: all(bound_to(api, rec.name) for rec in recs),
                timeout=60,
                what=f"all {count} bound",
            )
            await eventually(
                lambda: (
                    len(states) == count and all(r.state == "allocated" for r in states.values())
                ),
                what="every record allocated",
            )
            waited = binder.metric("tessera_binder_gate_waits_total", outcome="passed")
    finally:
        plugin.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await plugin
    assert not violations, f"ambiguous bound records at once: {violations[:3]}"
    assert most_bound == 1
    assert waited > 0, "placements did meet at the gate"


async def test_a_pod_held_at_the_gate_too_long_fails_back_to_the_placer(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    results = await collect(bus, subjects.BINDING_RESULTS_ALL)
    async with start_binder(gate_timeout_s=0.5):
        first = record(uid_of(api.create(POD, pod("first"))), "first", slices("main", (0, 1, 1)))
        second = record(uid_of(api.create(POD, pod("second"))), "second", slices("main", (1, 1, 1)))
        for rec in (first, second):
            await place(bus, rec)
        await eventually(
            lambda: len(outcomes(api, results, "first", "second")) == 2, what="two outcomes"
        )
    assert outcomes(api, results, "first", "second") == {"first": "bound", "second": "failed"}
    (failed,) = results.decoded(BindingResult)
    assert "waits for default/first on node gpu-1 to be allocated first" in failed.reason
    assert await get_record(bus, second.pod_uid) is None, "never bound: no record written"
    # Only the failure is stored, for the placer to release its booking.
    stored = await bus._js.get_msg(subjects.STREAM_BINDINGS, seq=1)
    assert codec.decode(stored.data or b"", BindingResult).name == "second"
    assert (await bus._js.stream_info(subjects.STREAM_BINDINGS)).state.messages == 1


async def test_a_queue_that_moves_never_times_out_at_the_gate(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    """Issue 22: a burst queued on one node passes the gate one pod per Allocate. A deadline
    counted from the first wait failed the tail of the queue (and its requeue landed on the same
    node again); a waiting pod now times out only when the record it waits on stays put."""
    results = await collect(bus, subjects.BINDING_RESULTS_ALL)
    timeout_s = 2.0
    async with start_binder(gate_timeout_s=timeout_s):
        queued = []
        for name, gpu_index in (("first", 0), ("second", 1), ("third", 2)):
            uid = uid_of(api.create(POD, pod(name)))
            queued.append(record(uid, name, slices("main", (gpu_index, 1, 1))))
        for rec in queued:
            await place(bus, rec)
        started = asyncio.get_running_loop().time()
        done: list[str] = []
        for count in (1, 2, 3):
            await eventually(
                lambda count=count: sum(bool(bound_to(api, r.name)) for r in queued) == count,
                timeout=timeout_s,
                what=f"{count} pods bound",
            )
            (latest,) = [r for r in queued if bound_to(api, r.name) and r.name not in done]
            done.append(latest.name)
            # Each Allocate comes 0.6 of the gate's time after the last: the last pod waits 1.2
            # times the gate's time in all, behind two records that each moved in time.
            await asyncio.sleep(0.6 * timeout_s)
            bound = await get_record(bus, latest.pod_uid)
            assert bound is not None and bound.state == "bound"
            await bus.kv_put(
                subjects.KV_ASSIGNMENTS,
                subjects.assignment_key(bound.node, bound.pod_uid),
                codec.encode(msgspec.structs.replace(bound, state="allocated")),
            )
        waited = asyncio.get_running_loop().time() - started
    assert results.deliveries == [], "nothing failed back"
    assert waited > timeout_s, "the last pod waited longer than one gate time"


async def test_a_forged_bound_record_holds_no_real_pod_at_the_gate(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    """Issue 19: a made-up bound record (no booking behind it) on the pod's node with the same
    device count and other slices held a real pod at the gate until it timed out."""
    results = await collect(bus, subjects.BINDING_RESULTS_ALL)
    api.create(NODE, node())
    # On a pod that runs there, so the binder does not withdraw it as a gone pod's record.
    ghost_uid = uid_of(api.create(POD, pod("ghost", node="gpu-1")))
    ghost = record(ghost_uid, "ghost", slices("main", (0, 1, 1)), state="bound", bound_at=1.0)
    await bus.kv_put(
        subjects.KV_ASSIGNMENTS,
        subjects.assignment_key(ghost.node, ghost.pod_uid),
        codec.encode(ghost),
    )
    async with start_binder(gate_timeout_s=5.0) as binder:
        real = record(uid_of(api.create(POD, pod("real"))), "real", slices("main", (1, 1, 1)))
        await place(bus, real)
        await eventually(lambda: bound_to(api, "real"), timeout=4.0, what="the real pod bound")
        ignored = binder.metric("tessera_binder_gate_ignored_total")
    assert results.deliveries == []
    assert ignored == 1


async def test_a_withdrawn_commits_bound_record_holds_the_gate_until_it_is_fenced(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    """A chaos run: a pod was rejected at admission and deleted; its placer turned the claim
    ``deleted`` but had not fenced the record yet. The gate let the next pod of the same device
    count through, and the device plugin granted the deleted pod's slices to it (its booking
    still held them). Until the record is fenced, the gate waits for it. (Here the binder still
    sees the pod, so it does not withdraw the record itself: the next test.)"""
    results = await collect(bus, subjects.BINDING_RESULTS_ALL)
    api.create(NODE, node())
    gone_uid = uid_of(api.create(POD, pod("gone", node="gpu-1")))
    gone = record(gone_uid, "gone", slices("main", (0, 8192, 10)), state="bound", bound_at=1.0)
    await create_committed(bus, gone)
    await bus.kv_put(
        subjects.KV_CLAIMS,
        subjects.claim_key(gone.pod_uid),
        codec.encode(deleted_claim(gone.pod_uid, claim_of(gone), reason="deleted", now=2.0)),
    )
    async with start_binder(gate_timeout_s=1.0) as binder:
        held = record(uid_of(api.create(POD, pod("held"))), "held", slices("main", (0, 4096, 5)))
        await place(bus, held)
        await eventually(lambda: len(results.deliveries) == 1, what="the held pod's result")
        fenced = msgspec.structs.replace(gone, state="released", released_at=3.0)
        await bus.kv_put(
            subjects.KV_ASSIGNMENTS,
            subjects.assignment_key(gone.node, gone.pod_uid),
            codec.encode(fenced),
        )
        later = record(uid_of(api.create(POD, pod("later"))), "later", slices("main", (0, 4096, 5)))
        await place(bus, later)
        await eventually(lambda: bound_to(api, "later"), what="the later pod bound")
        ignored = binder.metric("tessera_binder_gate_ignored_total")
    (first,) = results.decoded(BindingResult)
    assert (first.name, first.outcome) == ("held", "failed"), first
    assert "waits for default/gone on node gpu-1 to be allocated first" in first.reason
    assert ignored == 0


async def test_a_pod_that_ends_before_its_gpus_are_allocated_has_its_record_withdrawn(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    """A chaos run: a pod rejected at admission kept its ``bound`` record until its placer
    handled ``PodDeleted`` (8 s while the placer's consumer came back), and the device plugin
    served the next same-size pod's Allocate from it; that pod's own record then stayed
    ``bound`` and held its node's gate shut. The binder now releases such a record itself, before
    ``PodDeleted`` goes out; a record whose GPUs were allocated is left to the placer."""
    api.create(NODE, node())

    def bound_pod(name: str, gpu: int, state: str) -> AssignmentRecord:
        uid = uid_of(api.create(POD, pod(name, node="gpu-1")))
        return record(uid, name, slices("main", (gpu, 8192, 10)), state=state, bound_at=1.0)

    rejected = bound_pod("rejected", 0, "bound")
    ran = msgspec.structs.replace(
        bound_pod("ran", 1, "allocated"),
        allocated=(ContainerAllocation(container="main", device_ids=("d",), allocated_at=2.0),),
    )
    for rec in (rejected, ran):
        await create_committed(bus, rec)
    seen_when_deleted: dict[str, str | None] = {}

    async def on_deleted(delivery: Delivery) -> None:
        message = codec.decode(delivery.data, PodDeleted)
        current = await get_record(bus, message.uid)
        seen_when_deleted[message.name] = current.state if current else None

    await bus.subscribe(subjects.PODS_DELETED, on_deleted)
    async with start_binder() as binder:
        await eventually(binder.leading, what="leading")
        endings = {
            "rejected": {"phase": "Failed", "reason": "UnexpectedAdmissionError"},
            "ran": {"phase": "Succeeded"},
        }
        for name, status in endings.items():
            api.patch(POD, "default", name, {"status": status}, MERGE, "status")
        await eventually(lambda: len(seen_when_deleted) == 2, what="both PodDeleted")
        withdrawn = binder.metric("tessera_binder_records_withdrawn_total")
    # Withdrawn before PodDeleted went out; the record that ran is the placer's to release.
    assert seen_when_deleted == {"rejected": "released", "ran": "allocated"}
    assert withdrawn == 1
    after = await get_record(bus, rejected.pod_uid)
    assert after is not None
    assert after == msgspec.structs.replace(
        rejected, state="released", released_at=after.released_at
    )


def bound_on_node(
    api: ApiServer, name: str, gpu: int = 0, mib: int = 8192, state: str = "bound"
) -> AssignmentRecord:
    """A pod bound to gpu-1 and its record in ``state`` (``allocated``: device ID ``d-<name>``)."""
    uid = uid_of(api.create(POD, pod(name, node="gpu-1")))
    rec = record(uid, name, slices("main", (gpu, mib, 10)), state=state, bound_at=1.0)
    if state != "allocated":
        return rec
    answered = ContainerAllocation(container="main", device_ids=(f"d-{name}",), allocated_at=2.0)
    return msgspec.structs.replace(rec, allocated=(answered,), allocated_at=2.0)


async def test_an_admitted_pod_served_from_a_dead_pods_record_has_its_own_record_settled(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    """A chaos run: while a device plugin was down, the kubelet rejected c-76 .. c-86 itself; back
    up, the plugin served c-88's Allocate from c-76's record, still ``bound`` (identical slices:
    the gate binds only those together). c-88 ran, but its own record stayed ``bound`` and held
    the node's gate shut for the pods of its device count with other slices (63 s, then the
    test gave up). Such a surplus record of an admitted pod is settled as allocated."""
    results = await collect(bus, subjects.BINDING_RESULTS_ALL)
    api.create(NODE, node())
    dead = bound_on_node(api, "dead", state="allocated")  # what c-88's Allocate moved
    live = bound_on_node(api, "live")
    for rec in (dead, live):
        await create_committed(bus, rec)
    api.patch(POD, "default", "dead", {"status": {"phase": "Failed"}}, MERGE, "status")
    async with start_binder(gate_timeout_s=3.0) as binder:
        await eventually(binder.leading, what="leading")
        after = record(uid_of(api.create(POD, pod("after"))), "after", slices("main", (1, 4096, 5)))
        await place(bus, after)
        api.patch(POD, "default", "live", {"status": {"phase": "Running"}}, MERGE, "status")
        await eventually(lambda: bound_to(api, "after"), what="the next pod bound")
        settled_count = binder.metric("tessera_binder_records_settled_total")
    assert results.deliveries == []
    assert settled_count == 1
    now = await get_record(bus, live.pod_uid)
    assert now is not None and now.state == "allocated"
    assert [(a.container, a.device_ids) for a in now.allocated] == [("main", ())]


async def test_two_live_pods_served_from_each_others_records_are_not_settled(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    """Allocate serves the oldest matching record, so of two pods with identical slices the one
    admitted first may be served from the other's record; the other is then served from its
    record. Settling the first pod's record then would leave the second pod's Allocate nothing
    to take (or a record of other slices): it is settled only once the second is admitted, or
    ends, as the kubelet may still reject it."""
    results = await collect(bus, subjects.BINDING_RESULTS_ALL)
    api.create(NODE, node())
    first = bound_on_node(api, "first", state="allocated")  # moved by the second's Allocate
    second = bound_on_node(api, "second")
    for rec in (first, second):
        await create_committed(bus, rec)
    async with start_binder(gate_timeout_s=1.0) as binder:
        await eventually(binder.leading, what="leading")
        api.patch(POD, "default", "second", {"status": {"phase": "Running"}}, MERGE, "status")
        other = record(uid_of(api.create(POD, pod("other"))), "other", slices("main", (1, 4096, 5)))
        await place(bus, other)
        await eventually(lambda: len(results.deliveries) == 1, what="the gate's time-out")
        held = binder.metric("tessera_binder_records_settled_total")
        api.patch(POD, "default", "first", {"status": {"phase": "Failed"}}, MERGE, "status")
        await eventually(
            lambda: binder.metric("tessera_binder_records_settled_total") == 1,
            what="settled once the first pod ended",
        )
    (result,) = results.decoded(BindingResult)
    assert (result.name, result.outcome) == ("other", "failed"), result
    assert "waits for default/second" in result.reason
    assert held == 0
    now = await get_record(bus, second.pod_uid)
    assert now is not None and now.state == "allocated"


@pytest.mark.parametrize("admission_seen", [True, False], ids=["admitted", "recounted"])
async def test_a_pod_that_ran_from_a_waiting_pods_record_keeps_its_own_for_that_pod(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory, admission_seen: bool
) -> None:
    """``ran`` was admitted first, from ``waits``'s record (the oldest), and finished before
    ``waits`` was admitted. Its own record is ``bound``, and ``waits`` needs it: the binder keeps
    it and holds ``ran``'s ``PodDeleted`` back until ``waits``'s Allocate took it. The binder
    counts it again when it sees ``waits`` admitted; when it never does (its informer missed the
    moment, or the admission came while the count ran), every ``RECOUNT_S`` all the same."""
    deleted = await collect(bus, subjects.PODS_DELETED)
    api.create(NODE, node())
    waits = bound_on_node(api, "waits", state="allocated")  # what ran's Allocate moved
    ran = bound_on_node(api, "ran")
    for rec in (waits, ran):
        await create_committed(bus, rec)
    async with start_binder() as binder:
        await eventually(binder.leading, what="leading")
        api.patch(POD, "default", "ran", {"status": {"phase": "Succeeded"}}, MERGE, "status")
        await eventually(
            lambda: binder.metric("tessera_binder_records_kept") == 1, what="ran's record kept"
        )
        assert deleted.deliveries == [], "held back while waits may still need the record"
        kept = await get_record(bus, ran.pod_uid)
        assert kept is not None and kept.state == "bound"
        # The device plugin serves waits from ran's record; the kubelet admits it.
        await bus.kv_put(
            subjects.KV_ASSIGNMENTS,
            subjects.assignment_key(kept.node, kept.pod_uid),
            codec.encode(settled_by_plugin(kept)),
        )
        if admission_seen:
            api.patch(POD, "default", "waits", {"status": {"phase": "Running"}}, MERGE, "status")
        # Without it nothing happens to the node's pods from here on: only a recount can tell.
        await eventually(lambda: deleted.deliveries, what="ran's PodDeleted")
        withdrawn = binder.metric("tessera_binder_records_withdrawn_total")
        kept_after = binder.metric("tessera_binder_records_kept")
    assert [m.name for m in deleted.decoded(PodDeleted)] == ["ran"]
    assert (withdrawn, kept_after) == (0, 0)
    after = await get_record(bus, ran.pod_uid)
    assert after is not None and after.state == "allocated"


def settled_by_plugin(rec: AssignmentRecord) -> AssignmentRecord:
    """``rec`` as a device plugin's Allocate leaves it."""
    answered = ContainerAllocation(container="main", device_ids=("d-served",), allocated_at=3.0)
    return msgspec.structs.replace(rec, state="allocated", allocated=(answered,), allocated_at=3.0)


async def test_node_facts_follow_nodes_and_the_pods_on_them(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    api.create(NODE, node("gpu-1", cpu="32", memory="128Gi", gpus=4))
    api.create(
        POD, pod("web", container(cpu="2", ram="4Gi"), scheduler="default-scheduler", node="gpu-1")
    )

    async def facts(name: str = "gpu-1") -> NodeFacts | None:
        entry = await bus.kv_get(subjects.KV_NODES, subjects.node_token(name))
        return None if entry is None else codec.decode(entry.value, NodeFacts)

    published = await collect(bus, subjects.NODES_ALL)
    async with start_binder(node_facts_refresh_s=0.2):
        await eventually(facts, what="facts in KV")
        first = await facts()
        assert first is not None
        assert (first.cpu_allocatable_milli, first.memory_allocatable_mib) == (32000, 131072)
        assert (first.cpu_requested_milli, first.tessera_cpu_requested_milli) == (2000, 0)
        assert first.extended_allocatable == {"tessera.dev/gpu": 4}
        api.create(POD, pod("train", container(gpu=1, cpu="1", ram="1Gi"), node="gpu-1"))

        async def counted() -> bool:
            now = await facts()
            return now is not None and now.cpu_requested_milli == 3000

        await eventually(counted, what="the Tessera pod counted")
        assert (await facts()).tessera_cpu_requested_milli == 1000  # type: ignore[union-attr]
        api.patch(NODE, "", "gpu-1", {"spec": {"unschedulable": True}}, MERGE)

        async def cordoned() -> bool:
            now = await facts()
            return now is not None and not now.schedulable

        await eventually(cordoned, what="cordoned")
        api.delete(NODE, "", "gpu-1")

        async def deleted() -> bool:
            now = await facts()
            return now is not None and now.deleted

        await eventually(deleted, what="deleted facts")
        assert published.decoded(NodeFacts)[-1].deleted


async def test_a_node_s_facts_wait_for_the_refresh_while_only_tessera_s_pods_move(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    """A Tessera pod bound does not change what the placer makes of a node (it subtracts the
    ``tessera_*`` part and counts its own bookings), so it publishes nothing by itself; the
    next other change publishes everything at once."""
    api.create(NODE, node("gpu-1", cpu="32", memory="128Gi", gpus=4))
    published = await collect(bus, subjects.NODES_ALL)
    async with start_binder(node_facts_refresh_s=600.0) as binder:
        await eventually(lambda: published.deliveries, what="the node's first facts")
        api.create(POD, pod("train", container(gpu=1, cpu="1", ram="1Gi"), node="gpu-1"))
        await eventually(
            lambda: binder.metric("tessera_binder_node_facts_deferred_total") == 1,
            what="the Tessera pod's change held back",
        )
        api.create(
            POD,
            pod("web", container(cpu="2", ram="4Gi"), scheduler="default-scheduler", node="gpu-1"),
        )
        await eventually(lambda: len(published.deliveries) == 2, what="the other pod's change")
        await asyncio.sleep(0.3)  # nothing else follows
    first, second = published.decoded(NodeFacts)
    assert (first.cpu_requested_milli, first.tessera_cpu_requested_milli) == (0, 0)
    assert (second.cpu_requested_milli, second.tessera_cpu_requested_milli) == (3000, 1000)
    assert (second.memory_requested_mib, second.tessera_memory_requested_mib) == (5120, 1024)
    assert len(published.deliveries) == 2


async def test_a_new_leader_finishes_what_the_last_one_left_half_done(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    """Restart safety: binds cut short are completed, placements no binder looked at yet are
    bound, records of pods that are gone are released (through the placer), and nothing is
    bound twice."""
    api.create(NODE, node())
    # Stopped after writing the record, before the Binding: record bound, pod not.
    half = record(uid_of(api.create(POD, pod("half"))), "half", state="bound", bound_at=1.0)
    # Bound in the cluster, record never written (an earlier placer's, still reserved).
    already = record(
        uid_of(api.create(POD, pod("already", node="gpu-1"))),
        "already",
        slices("main", (1, 4096, 25), devices=2),
    )
    # Its pod was deleted while no binder ran.
    orphan = record("no-such-pod", "orphan", slices("main", (2, 4096, 25), devices=3))
    for rec in (half, already, orphan):
        await create_committed(bus, rec)
    # Placed while no binder ran: never looked at.
    waiting = record(
        uid_of(api.create(POD, pod("waiting"))), "waiting", slices("main", (3, 4096, 25), devices=4)
    )
    await place(bus, waiting)
    deleted = await collect(bus, subjects.PODS_DELETED)
    async with start_binder():
        await eventually(lambda: deleted.deliveries, what="the orphan's PodDeleted")
        await eventually(
            lambda: bound_to(api, "half") and bound_to(api, "waiting"), what="both bound"
        )
        advanced = await get_record(bus, already.pod_uid)
        assert advanced is not None and advanced.state == "bound"
    assert [(m.uid, m.node) for m in deleted.decoded(PodDeleted)] == [("no-such-pod", "gpu-1")]
    assert [w.code for w in api.writes_to("pods/binding")] == [201, 201]


async def test_a_reconcile_step_the_api_refuses_is_tried_again(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    half = record(uid_of(api.create(POD, pod("half"))), "half", state="bound", bound_at=1.0)
    await create_committed(bus, half)
    outage = api.faults.add(verb="create", resource="pods/binding", status=500, times=None)
    async with start_binder():
        await eventually(lambda: outage.hits >= 4, what="the first attempt to fail")
        api.faults.clear()
        await eventually(
            lambda: api.get(POD, "default", "half")["spec"].get("nodeName"),
            what="bound on a later attempt",
        )


async def test_dropped_watches_and_410_lose_no_pod(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    pending = await collect(bus, subjects.PODS_PENDING)
    deleted = await collect(bus, subjects.PODS_DELETED)
    async with start_binder():
        kept = [uid_of(api.create(POD, pod(f"before-{i}"))) for i in range(3)]
        await eventually(lambda: len(pending.deliveries) == 3, what="the first pods")
        for abrupt in (False, True):
            api.faults.add(verb="watch", resource="pods", status=503, times=None)
            api.drop_watches(POD, abrupt=abrupt)
            kept += [uid_of(api.create(POD, pod(f"during-{int(abrupt)}-{i}"))) for i in range(3)]
            api.delete(POD, "default", f"before-{int(abrupt)}")
            brief = uid_of(api.create(POD, pod(f"brief-{int(abrupt)}")))
            api.delete(POD, "default", f"brief-{int(abrupt)}")
            api.compact()
            api.faults.clear()
            expected = 1 + int(abrupt)
            await eventually(
                lambda expected=expected: len(deleted.deliveries) == expected, what="deletions"
            )
        await eventually(lambda: len(pending.deliveries) == 9, what="every pod published")
    published = [m.uid for m in pending.decoded(PodPending)]
    assert sorted(published) == sorted(kept), "each pod once, none lost"
    assert brief not in published
    assert sorted(m.uid for m in deleted.decoded(PodDeleted)) == sorted(kept[:2])


async def test_every_kind_of_object_the_binder_writes_is_valid_kubernetes(
    api: ApiServer, bus: NatsBus, start_binder: BinderFactory
) -> None:
    """One flow through every write (the ``api`` fixture validates writes after every test;
    this one makes sure each kind occurs and was checked)."""
    api.create(NODE, node())
    async with start_binder(allocation_warning_s=0.3):
        uid = uid_of(api.create(POD, pod("p")))
        await place(bus, record(uid, "p"))
        slow = uid_of(api.create(POD, pod("s")))
        await place(bus, record(slow, "s", slices("main", (1, 4096, 25), devices=2)))
        await eventually(lambda: bound_to(api, "p") and bound_to(api, "s"), what="bound")
        written = await get_record(bus, uid)
        assert written is not None
        await bus.kv_put(
            subjects.KV_ASSIGNMENTS,
            subjects.assignment_key(written.node, written.pod_uid),
            codec.encode(settled_by_plugin(written)),
        )
        waiting = uid_of(api.create(POD, pod("w", container(gpu=64))))
        for _ in range(2):
            await bus.js_publish(
                subjects.PLACEMENTS_REJECTED,
                codec.encode(rejection(waiting, "w", (1, "not enough idle GPUs"))),
            )
        api.create(POD, pod("bad", annotations={names.NODE_POLICY: "best"}))
        await eventually(
            lambda: (
                condition(api, "w")
                and condition(api, "bad")
                and events_about(api, "s", "AllocationDelayed")
                and api.get(POD, "default", "p")["metadata"]["annotations"].get(names.ASSIGNED)
            ),
            what="every write",
        )
    kinds = {(w.verb, w.resource) for w in api.writes if w.code < 300}
    assert kinds >= {
        ("create", "pods/binding"),
        ("patch", "pods"),
        ("patch", "pods/status"),
        ("create", "events"),
        ("patch", "events"),
        ("create", "leases"),
        ("update", "leases"),
    }
    assert validate_writes(api) >= 10
