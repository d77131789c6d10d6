"""The placer service over a real nats-server: the binder's and the inventory's side played here."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from services.placer.rules import charges
from shared import codec, subjects
from shared.commits import record_of
from shared.messages.assignments import AssignmentRecord
from shared.messages.bindings import BindingResult
from shared.messages.deadletter import DeadLetter
from shared.messages.ledger import (
    BookedContainer,
    BookedSlice,
    Booking,
    NodeLedger,
    PodClaim,
    TenantLedger,
)
from shared.messages.placement import PlacementRejected
from shared.messages.pods import PlacementHints, PodPending
from shared.messages.stats import ClusterStats
from shared.runtime.bus import Delivery
from shared.runtime.nats import NatsBus
from tests.harness import commits, kv
from tests.harness import wire as harness_wire
from tests.harness.nats import NatsServer
from tests.harness.wait import eventually
from tests.placer import wire
from tests.placer.conftest import (
    PlacerFactory,
    RunningPlacer,
    http_get,
    rejections,
    until,
)
from tests.placer.processes import start as start_process


async def settled(
    bus: NatsBus,
    condition: Callable[[wire.ClusterState], bool],
    *,
    timeout: float = 20.0,
    what: str = "",
) -> wire.ClusterState:
    """Read the KV state until ``condition`` holds; the state it held in."""
    deadline = time.monotonic() + timeout
    while True:
        state = await wire.cluster_state(bus)
        if condition(state):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {state}")
        await asyncio.sleep(0.05)


def live_of(state: wire.ClusterState, uid: str) -> list[AssignmentRecord]:
    """The pod's live placement (``ClusterState.placements``: no binder runs here)."""
    return state.placements_of(uid)


def placed(*uids: str) -> Callable[[wire.ClusterState], bool]:
    return lambda state: all(len(live_of(state, uid)) == 1 for uid in uids)


async def bind(bus: NatsBus, uid: str) -> AssignmentRecord:
    """Bind the pod's placement as the binder does: its record written ``bound``, create-only."""
    claim = (await wire.cluster_state(bus)).claims[uid]
    assert claim.booking is not None
    bound = record_of(claim.booking, bound_at=time.time())
    key = subjects.assignment_key(bound.node, uid)
    assert await bus.kv_create(subjects.KV_ASSIGNMENTS, key, codec.encode(bound))
    return bound


async def test_a_pending_pod_is_booked_and_claimed(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    await wire.put_node(bus, "gpu-1.example.com", 2)
    async with start_placer() as placer:
        await wire.publish_pod(bus, wire.pending("u1", memory_mib=4096, cores=25))
        state = await settled(bus, placed("u1"), what="a placement of u1")
        (record,) = live_of(state, "u1")
        assert record.state == "reserved" and not state.records, "the binder writes the record"
        assert record.node == "gpu-1.example.com"
        assert record.placer_id == "placer-test"
        (container,) = record.containers
        (piece,) = container.gpus
        assert (piece.memory_mib, piece.cores) == (4096, 25)
        assert container.resources == {"tessera.dev/gpu": 1}
        (booking,) = state.bookings()
        assert booking.commit == record.commit
        assert state.claims["u1"].state == "placed"
        assert state.claims["u1"].request == wire.pending("u1", memory_mib=4096, cores=25)
        wire.check_invariants(state, {"gpu-1.example.com": wire.inventory("gpu-1.example.com", 2)})

        port = placer.readiness.http_port
        assert port is not None
        status, explained = await http_get(port, "/v1/pods/u1")
        assert status == 200
        assert explained["claim"]["state"] == "placed"
        assert explained["claim"]["node"] == "gpu-1.example.com"
        assert explained["last_outcome"]["outcome"] == "placed"
        assert explained["nodes_total"] == 1
        status, _ = await http_get(port, "/v1/nothing")
        assert status == 404
        assert placer.metric("tessera_placer_decisions_total", outcome="placed") == 1
        assert placer.metric("tessera_placer_decision_seconds_count") == 1


async def test_a_deleted_pod_gives_its_gpus_back_once(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    await wire.put_node(bus, "n1", 1)
    async with start_placer() as placer:
        await wire.publish_pod(bus, wire.pending("u1", shares=1, memory_mib=None, cores=None))
        await settled(bus, placed("u1"), what="u1 placed")
        await wire.delete_pod(bus, "u1")
        state = await settled(
            bus,
            lambda s: not s.placements() and not s.bookings() and bool(s.records),
            what="u1 released",
        )
        (record,) = state.records.values()
        assert record.state == "released"
        assert state.claims["u1"].state == "deleted"
        # The same deletion again (a redelivery) changes nothing.
        await wire.delete_pod(bus, "u1", namespace="ml")
        late = msgspec.structs.replace(wire.pending("u1"), resource_version="9")
        await wire.publish_pod(bus, late)
        await until(
            lambda: placer.metric("tessera_placer_decisions_total", outcome="duplicate") >= 1,
            what="the late pending message seen as a duplicate",
        )
        assert (await wire.cluster_state(bus)).placements() == []
        assert placer.metric("tessera_placer_releases_total", cause="deleted") >= 1
        # The GPU is free again: a whole-GPU pod fits.
        await wire.publish_pod(bus, wire.pending("u2", shares=1, memory_mib=None, cores=None))
        await settled(bus, placed("u2"), what="u2 placed on the freed GPU")


async def test_a_placed_pod_that_cannot_be_booked_again_comes_back_until_it_can(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    """A pod placed already, its booking gone and its GPU taken meanwhile (after NATS lost its
    store, a node's inventory may not be back yet): its message was acked although the pod was
    neither booked nor placed again, and it stayed Pending for good (a three-server store-loss
    chaos run). It comes back until it can be booked again."""
    await wire.put_node(bus, "n1", 1)

    def whole(uid: str, version: str = "1") -> PodPending:
        pod = wire.pending(uid, shares=1, memory_mib=None, cores=None)
        return msgspec.structs.replace(pod, resource_version=version)

    async with start_placer(reconcile_interval_s=3600.0) as placer:
        await wire.publish_pod(bus, whole("u1"))
        await settled(bus, placed("u1"), what="u1 placed")
        await bus.kv_delete(subjects.KV_LEDGER, subjects.booking_key("n1", "u1"))
        await wire.publish_pod(bus, whole("u2"))
        await settled(bus, placed("u2"), what="u2 placed on the GPU u1's booking left")

        await wire.publish_pod(bus, whole("u1", "2"))
        await asyncio.sleep(3.0)  # redelivered every second meanwhile
        pods = await bus._js.stream_info(subjects.STREAM_PODS)
        assert pods.state.messages >= 1, "u1's message was acked without u1 booked"
        assert placer.metric("tessera_placer_decisions_total", outcome="duplicate") == 0

        await wire.delete_pod(bus, "u2")
        await settled(bus, placed("u1"), what="u1 booked again once its GPU was free")

        async def every_message_handled() -> bool:
            return (await bus._js.stream_info(subjects.STREAM_PODS)).state.messages == 0

        await until(every_message_handled, what="u1's message acked once it was booked")
        assert placer.metric("tessera_placer_decisions_total", outcome="duplicate") == 1


async def test_a_redelivered_pod_changes_nothing(bus: NatsBus, start_placer: PlacerFactory) -> None:
    await wire.put_node(bus, "n1", 2)
    async with start_placer() as placer:
        pod = wire.pending("u1")
        await wire.publish_pod(bus, pod)
        before = await settled(bus, placed("u1"), what="u1 placed")
        ledger_before = await bus.kv_get(subjects.KV_LEDGER, "n1")
        for version in ("2", "3"):  # the binder publishing the pod again (new resourceVersion)
            await wire.publish_pod(bus, msgspec.structs.replace(pod, resource_version=version))

        async def every_copy_handled() -> bool:
            # A copy that comes while the first commit is still acking joins it, one that comes
            # later is answered as a duplicate: either way it is acked (gone from the work queue).
            pods = await bus._js.stream_info(subjects.STREAM_PODS)
            return pods.state.messages == 0

        await until(every_copy_handled, what="both copies handled and acked")
        assert placer.metric("tessera_placer_decisions_total", outcome="placed") == 1
        after = await wire.cluster_state(bus)
        assert after.records == before.records
        assert after.claims == before.claims
        assert await bus.kv_get(subjects.KV_LEDGER, "n1") == ledger_before


async def _place_in_order(bus: NatsBus, pods: list[str]) -> None:
    for i, uid in enumerate(pods):
        size = (2048, 4096, 8192, 6144)[i % 4]
        await wire.publish_pod(bus, wire.pending(uid, memory_mib=size, cores=10 + 10 * (i % 3)))
        await settled(bus, placed(uid), what=f"{uid} placed")


async def _run_decides(restart: bool, start_placer: PlacerFactory, bus: NatsBus) -> list[object]:
    for name in ("a", "b", "c"):
        await wire.put_node(bus, name, 4)
    tuning = {"mix_check_s": 0.05}
    first = [f"p{i}" for i in range(8)]
    async with start_placer(tuning=tuning) as placer:
        await _place_in_order(bus, first)
        service = placer.service
        assert service is not None
        # Every pod's claim in the mix (the view sees each claim by its watch, maybe after the
        # pod's result), and that mix compiled: else the pod decided next may meet a profile a
        # pod short of the one a restarted placer compiles, and a near-tie goes another way.
        await until(
            lambda: len(service.view.mix) == len(first) and service.upkeep.mix_compiled,
            what="the learned mix of every pod compiled into the profile",
        )
        if not restart:
            await _place_in_order(bus, ["x"])
    if restart:
        async with start_placer(tuning=tuning, placer_id="placer-new"):
            await _place_in_order(bus, ["x"])
    (record,) = live_of(await wire.cluster_state(bus), "x")
    gpus = [(g.index, g.memory_mib, g.cores) for c in record.containers for g in c.gpus]
    return [record.node, gpus]


async def test_a_mix_moved_by_another_replica_is_compiled_with_no_decision_here(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    await wire.put_node(bus, "a", 4)
    async with start_placer(tuning={"mix_check_s": 0.02}) as placer:
        service = placer.service
        assert service is not None
        await _place_in_order(bus, ["p0"])
        await until(
            lambda: len(service.view.mix) == 1 and service.upkeep.mix_compiled,
            what="p0's mix compiled",
        )
        # Another replica places q (a booking and claim this one only sees): the mix moves with
        # no decision here, and no judgement was made since the last compile.
        other = harness_wire.record(
            "q",
            harness_wire.container(
                "main",
                harness_wire.share(2, uuid=wire.gpu_uuid("a", 2), memory_mib=16_384, cores=50),
            ),
            node="a",
            placer_id="placer-other",
        )
        await commits.commit(bus, other)
        await until(
            lambda: len(service.view.mix) == 2 and service.upkeep.mix_compiled,
            timeout=10,
            what="the mix another replica moved compiled (not after MIX_STALE_S)",
        )


async def test_a_mix_moved_by_every_pod_is_compiled_only_once_it_is_paid_for(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    # 60 node shapes (each node's GPUs a different size) and 5 pod shapes: a compile costs about
    # 300 judgements, paid after 15 decisions; the mix moves with every pod placed (the learned
    # share of a mix of few pods), and was compiled at every check before.
    for i in range(60):
        await wire.put_node(bus, f"n{i:02}", 2, memory_mib=16_384 + 512 * i)
    pods = [f"p{i:02}" for i in range(30)]
    async with start_placer(tuning={"mix_check_s": 0.01}) as placer:
        service = placer.service
        assert service is not None
        for i, uid in enumerate(pods):
            pod = wire.pending(
                uid, memory_mib=(2048, 3072, 4096, 6144, 8192)[i % 5], cores=10 + i % 5
            )
            await wire.publish_pod(bus, pod)
            await settled(bus, placed(uid), what=f"{uid} placed")
            await asyncio.sleep(0.03)  # several checks of the mix between two pods
        builds = placer.metric("tessera_placer_profile_builds_total")
        judged = service.view.index.memo_size
    # At start, then once each compile is paid for: a handful, not one per pod.
    assert 2 <= builds <= 5, (builds, judged)


async def test_a_restarted_placer_decides_as_if_it_had_run_all_along(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    continuous = await _run_decides(False, start_placer, bus)
    with NatsServer() as other:
        other_bus = await NatsBus.connect(other.url, name="tessera-test-2")
        try:
            # The same fixture, pointed at the second server.
            def against_other(**overrides: Any) -> contextlib.AbstractAsyncContextManager[Any]:
                return start_placer(nats_url=other.url, **overrides)

            restarted = await _run_decides(True, against_other, other_bus)
        finally:
            await other_bus.drain()
    assert restarted == continuous


async def test_an_unschedulable_pod_waits_and_is_placed_when_capacity_is_freed(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    await wire.put_node(bus, "n1", 1)
    whole = {"shares": 1, "memory_mib": None, "cores": None}
    async with start_placer() as placer:
        await wire.publish_pod(bus, wire.pending("first", **whole))  # type: ignore[arg-type]
        await settled(bus, placed("first"), what="first placed")
        await wire.publish_pod(bus, wire.pending("second", **whole))  # type: ignore[arg-type]
        await until(
            lambda: placer.metric("tessera_placer_decisions_total", outcome="rejected") == 1,
            what="second rejected",
        )
        (rejected,) = await rejections(bus)
        assert rejected.pod_uid == "second"
        assert not rejected.unresolvable
        assert [(r.reason, r.nodes) for r in rejected.reasons] == [("not enough idle GPUs", 1)]
        assert rejected.message == "0/1 nodes are available: 1 not enough idle GPUs."
        tries = placer.metric("tessera_placer_tries_total")
        scans = placer.metric("tessera_placer_waiting_scans_total")
        await until(
            lambda: placer.metric("tessera_placer_waiting_scans_total") >= scans + 2,
            what="two passes over the waiting pods",
        )
        # Nothing changed: it is not tried again and again.
        assert placer.metric("tessera_placer_tries_total") == tries
        assert placer.metric("tessera_placer_decisions_total", outcome="rejected") == 1
        assert placer.metric("tessera_placer_pending_pods", reason="not enough idle GPUs") == 1

        await wire.delete_pod(bus, "first")
        state = await settled(bus, placed("second"), what="second placed once first left")
        wire.check_invariants(state, {"n1": wire.inventory("n1", 1)})

        # An invalid request is rejected as unresolvable and not kept.
        invalid = wire.pending("bad", cores=0)
        await wire.publish_pod(bus, invalid)
        await until(
            lambda: placer.metric("tessera_placer_decisions_total", outcome="unresolvable") == 1,
            what="the invalid pod rejected",
        )
        last = (await rejections(bus))[-1]
        assert last.pod_uid == "bad"
        assert last.unresolvable
        assert "GPU cores must be 1..100 percent" in last.reasons[0].reason
        assert placer.service is not None
        await until(lambda: "bad" not in placer.service.held.items, what="the invalid pod let go")


async def test_binding_failures_gone_pods_and_reserve_timeouts_release(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    await wire.put_node(bus, "n1", 4)
    async with start_placer(reserve_timeout_s=1.0) as placer:
        for uid in ("failed", "gone", "bound"):
            await wire.publish_pod(bus, wire.pending(uid))
        state = await settled(bus, placed("failed", "gone", "bound"), what="three placed")
        first_commit = live_of(state, "failed")[0].commit
        # The binder binds one (its record written bound): the timeout leaves it.
        await bind(bus, "bound")
        for uid, outcome in (("failed", "failed"), ("gone", "gone")):
            result = BindingResult(
                pod_uid=uid,
                namespace="ml",
                name=f"pod-{uid}",
                node="n1",
                outcome=outcome,  # type: ignore[arg-type]
                reason="test",
                at=time.time(),
            )
            await bus.js_publish(subjects.bindings("n1"), codec.encode(result))
        # failed: released, requeued, placed again under a new commit (and timed out again,
        # since nobody binds it here, and placed again: any commit but the first).
        state = await settled(
            bus,
            lambda s: (
                bool(live_of(s, "failed"))
                and live_of(s, "failed")[0].commit != first_commit
                and s.claims["gone"].state == "deleted"
            ),
            what="failed placed again, gone released",
        )
        assert live_of(state, "gone") == []
        assert live_of(state, "bound")[0].state == "bound"
        await until(
            lambda: placer.metric("tessera_placer_releases_total", cause="timeout") >= 1,
            what="a reserve timeout",
        )
        assert placer.metric("tessera_placer_releases_total", cause="failed") == 1
        assert placer.metric("tessera_placer_releases_total", cause="gone") == 1

        # "failed" is placed and timed out again every second, so a snapshot read key by key
        # may catch a commit between its booking and its record: read until one holds still.
        def consistent(state: wire.ClusterState) -> bool:
            try:
                wire.check_invariants(state, {"n1": wire.inventory("n1", 4)})
            except AssertionError:
                return False
            return True

        state = await settled(bus, consistent, what="a snapshot between two commits")
        assert live_of(state, "bound")[0].state == "bound"  # never released by the timeout


async def test_stale_inventory_and_missing_node_facts_keep_pods_off_a_node(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    await wire.put_node(bus, "old", 2, at=time.time() - 100)
    await kv.put_inventory(bus, wire.inventory("nofacts", 2, at=time.time()))
    async with start_placer() as placer:
        await wire.publish_pod(bus, wire.pending("u1"))
        await until(
            lambda: placer.metric("tessera_placer_decisions_total", outcome="rejected") == 1,
            what="u1 rejected",
        )
        (rejected,) = await rejections(bus)
        assert {(r.reason, r.nodes) for r in rejected.reasons} == {
            ("GPU inventory stale (heartbeat missed)", 1),
            ("no node facts yet", 1),
        }
        await kv.put_inventory(bus, wire.inventory("old", 2, at=time.time()))  # heartbeat
        state = await settled(bus, placed("u1"), what="u1 placed once old is fresh")
        assert live_of(state, "u1")[0].node == "old"


async def place_q1_then_refuse_q2(bus: NatsBus, placer: RunningPlacer, *, why: str) -> None:
    """Publish q1 and see it placed within tenant ml's quota, then q2 refused over it (``why``)."""
    await wire.publish_pod(bus, wire.pending("q1"))
    await settled(bus, placed("q1"), what="q1 within the quota")
    await wire.publish_pod(bus, wire.pending("q2"))
    await until(
        lambda: placer.metric("tessera_placer_decisions_total", outcome="rejected") == 1,
        what=f"q2 over the quota ({why})",
    )
    (rejected,) = await rejections(bus)
    assert "tenant ml: GPU quota exceeded" in rejected.reasons[0].reason


async def test_a_bad_tenancy_file_is_refused_and_the_last_good_one_kept(
    bus: NatsBus, start_placer: PlacerFactory, tmp_path: Path
) -> None:
    tenancy = tmp_path / "tenancy.json"
    tenancy.write_text(json.dumps({"quotas": [{"tenant": "ml", "gpus": 1}]}))
    await wire.put_node(bus, "n1", 4)
    async with start_placer(tenancy_file=str(tenancy), tuning={"tenancy_check_s": 0.1}) as placer:
        await place_q1_then_refuse_q2(bus, placer, why="a quota of 1")

        tenancy.write_text('{"quotas": [{"tenant": "ml", "gpus": "many"}]}')
        await until(
            lambda: placer.metric("tessera_placer_tenancy_reloads_total", outcome="refused") == 1,
            what="the bad version refused",
        )
        await wire.publish_pod(bus, wire.pending("q3"))
        await until(
            lambda: placer.metric("tessera_placer_decisions_total", outcome="rejected") == 2,
            what="q3 still over the kept quota",
        )
        assert len(live_of(await wire.cluster_state(bus), "q3")) == 0

        tenancy.write_text(json.dumps({"quotas": [{"tenant": "ml", "gpus": 3}]}))
        state = await settled(bus, placed("q1", "q2", "q3"), what="q2 and q3 placed live")
        assert placer.metric("tessera_placer_tenancy_reloads_total", outcome="applied") == 1
        wire.check_invariants(state, {"n1": wire.inventory("n1", 4)})


async def test_a_tenant_label_chooses_only_among_the_tenants_its_namespace_is_allowed(
    bus: NatsBus, start_placer: PlacerFactory, tmp_path: Path
) -> None:
    """Issue 19 finding 3: a pod of namespace ml labelled ``tessera.dev/tenant: free-rider``
    ran while its sibling waited on ml's quota. Now the label is refused with the reason, and
    grants only what the tenancy file lets the namespace choose, charged to that tenant."""
    tenancy = tmp_path / "tenancy.json"
    quotas = [{"tenant": "ml", "gpus": 1}, {"tenant": "pool", "gpus": 1}]
    tenancy.write_text(json.dumps({"quotas": quotas}))
    await wire.put_node(bus, "n1", 4)
    async with start_placer(tenancy_file=str(tenancy), tuning={"tenancy_check_s": 0.1}) as placer:
        await place_q1_then_refuse_q2(bus, placer, why="a quota of 1")
        await wire.publish_pod(bus, wire.pending("rider", tenant="free-rider"))
        await until(
            lambda: placer.metric("tessera_placer_decisions_total", outcome="unresolvable") == 1,
            what="the free rider refused",
        )
        (refused,) = [r for r in await rejections(bus) if r.pod_uid == "rider"]
        assert refused.unresolvable
        assert refused.message == (
            "0/1 nodes are available: 1 label tessera.dev/tenant: namespace ml may not choose "
            "tenant 'free-rider' (it may choose: ml)."
        )

        namespaces = [{"namespace": "ml", "choices": ["pool"]}]
        tenancy.write_text(json.dumps({"quotas": quotas, "namespaces": namespaces}))
        await until(
            lambda: placer.metric("tessera_placer_tenancy_reloads_total", outcome="applied") == 1,
            what="the namespace's choices applied",
        )
        await wire.publish_pod(bus, wire.pending("pooled", tenant="pool"))
        state = await settled(bus, placed("pooled"), what="pooled placed as tenant pool")
        assert {b.pod_uid: b.tenant for b in state.bookings()} == {"q1": "ml", "pooled": "pool"}
        assert [c.pod_uid for c in state.tenants["pool"].charges] == ["pooled"]
        assert [c.pod_uid for c in state.tenants["ml"].charges] == ["q1"]
        port = placer.readiness.http_port
        assert port is not None
        _, explained = await http_get(port, "/v1/pods/rider")  # judged on the file as it is now
        assert explained["not_fitting"] == {
            "label tessera.dev/tenant: namespace ml may not choose tenant 'free-rider' "
            "(it may choose: ml, pool)": 1
        }
        wire.check_quotas(state, {"ml": (1, None), "pool": (1, None)})


def _booking(uid: str, node: str, commit: str) -> Booking:
    return Booking(
        pod_uid=uid,
        namespace="ml",
        name=f"pod-{uid}",
        node=node,
        commit=commit,
        tenant="ml",
        cpu_milli=1000,
        memory_mib=1024,
        kind="share",
        containers=(
            BookedContainer(
                container="main",
                gpus=(
                    BookedSlice(
                        index=0, uuid=wire.gpu_uuid(node, 0), memory_mib=2048, core_milli=200
                    ),
                ),
                resources={"tessera.dev/gpu": 1},
            ),
        ),
        decided_at=time.time() - 60,
        placer_id="placer-gone",
    )


async def test_half_done_commits_are_repaired_before_ready(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    await wire.put_node(bus, "n1", 2)
    unclaimed = _booking("unclaimed", "n1", "c1")  # stopped after booking
    claimed = _booking("claimed", "n1", "c2")  # committed: the binder's to bind
    await wire.put_bookings(bus, unclaimed, claimed)
    claim = PodClaim(
        pod_uid="claimed", state="placed", booking=claimed, updated_at=time.time() - 60
    )
    await bus.kv_put(subjects.KV_CLAIMS, subjects.claim_key("claimed"), codec.encode(claim))
    async with start_placer() as placer:
        state = await wire.cluster_state(bus)  # ready means repaired
        wire.check_invariants(state, {"n1": wire.inventory("n1", 2)})
        assert {r.pod_uid for r in state.placements()} == {"unclaimed", "claimed"}
        assert state.claims["unclaimed"].booking == unclaimed
        assert not state.records, "the binder writes the records"
        assert placer.metric("tessera_placer_repairs_total", kind="roll-forward") == 1


async def test_an_earlier_version_s_whole_node_entries_become_bookings_before_ready(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    """Upgrading: earlier placers wrote one entry per node listing every booking. A placer of
    this version turns each into booking keys (and deletes it) before it decides anything, so
    the capacity those bookings hold is never offered again."""
    await wire.put_node(bus, "n1.example.com", 1)
    held = [_booking(f"held-{n}", "n1.example.com", f"c{n}") for n in range(2)]
    for booking in held:
        claim = PodClaim(pod_uid=booking.pod_uid, state="placed", booking=booking, updated_at=1.0)
        key = subjects.claim_key(booking.pod_uid)
        await bus.kv_put(subjects.KV_CLAIMS, key, codec.encode(claim))
        record = msgspec.structs.replace(record_of(booking, state="reserved"), state="allocated")
        key = subjects.assignment_key(booking.node, booking.pod_uid)
        await bus.kv_put(subjects.KV_ASSIGNMENTS, key, codec.encode(record))
    legacy = subjects.node_token("n1.example.com")  # the earlier versions' key
    entry = NodeLedger(node="n1.example.com", bookings=tuple(held), updated_at=1.0)
    await bus.kv_put(subjects.KV_LEDGER, legacy, codec.encode(entry))

    whole = {"shares": 1, "memory_mib": None, "cores": None}
    async with start_placer() as placer:
        state = await wire.cluster_state(bus)
        assert state.ledgers["n1.example.com"].bookings == tuple(held)
        assert await bus.kv_get(subjects.KV_LEDGER, legacy) is None
        # The node's one GPU holds the two converted shares: a whole GPU waits, a share fits.
        await wire.publish_pod(bus, wire.pending("whole", **whole))  # type: ignore[arg-type]
        await until(
            lambda: placer.metric("tessera_placer_decisions_total", outcome="rejected") == 1,
            what="the whole GPU refused",
        )
        await wire.publish_pod(bus, wire.pending("share", memory_mib=2048))
        state = await settled(bus, placed("share"), what="the share placed")
        assert "whole" not in state.claims
        wire.check_invariants(state, {"n1.example.com": wire.inventory("n1.example.com", 1)})


async def test_a_record_no_placer_committed_is_released_by_reconciliation(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    """Issue 19: a made-up bound record (no claim, no booking) stayed forever."""
    await wire.put_node(bus, "n1", 2)
    ghost = AssignmentRecord(
        pod_uid="ghost",
        namespace="default",
        name="ghost",
        node="n1",
        containers=record_of(_booking("ghost", "n1", "c-ghost")).containers,
        state="bound",
        decided_at=time.time() + 10 * 365 * 86400.0,  # dates itself years ahead
        placer_id="nobody",
        bound_at=time.time(),
        commit="c-ghost",
    )
    key = subjects.assignment_key("n1", "ghost")
    await bus.kv_put(subjects.KV_ASSIGNMENTS, key, codec.encode(ghost))
    async with start_placer(reconcile_interval_s=0.5) as placer:

        async def released() -> bool:
            entry = await bus.kv_get(subjects.KV_ASSIGNMENTS, key)
            return entry is not None and codec.decode(entry.value, AssignmentRecord).state == (
                "released"
            )

        await eventually(released, timeout=15, what="the made-up record released")
        await eventually(
            lambda: placer.metric("tessera_placer_repairs_total", kind="release-record") == 1,
            what="the release counted",
        )


async def test_quota_charges_are_derived_again_from_placements_before_ready(
    bus: NatsBus, start_placer: PlacerFactory, tmp_path: Path
) -> None:
    """A pod placed before its tenant had a quota is charged (adopted), a charge whose commit
    never booked (a placer stopped in between) is fenced and given back; then the quota holds."""
    tenancy = tmp_path / "tenancy.json"
    tenancy.write_text(json.dumps({"quotas": [{"tenant": "ml", "gpus": 2}]}))
    await wire.put_node(bus, "n1", 4)
    old = _booking("old", "n1", "c-old")
    await wire.put_bookings(bus, old)
    claim = PodClaim(pod_uid="old", state="placed", booking=old, updated_at=time.time() - 60)
    await bus.kv_put(subjects.KV_CLAIMS, subjects.claim_key("old"), codec.encode(claim))
    record = msgspec.structs.replace(record_of(old, state="reserved"), state="bound")
    await bus.kv_put(subjects.KV_ASSIGNMENTS, "n1.old", codec.encode(record))
    stray = charges.charge_of(_booking("lost", "n1", "c-lost"), now=time.time() - 60)
    tenant = TenantLedger(tenant="ml", charges=(stray,), updated_at=time.time() - 60)
    await bus.kv_put(subjects.KV_TENANTS, subjects.tenant_key("ml"), codec.encode(tenant))

    async with start_placer(tenancy_file=str(tenancy)) as placer:
        state = await wire.cluster_state(bus)  # ready means repaired
        assert [c.commit for c in state.tenants["ml"].charges] == ["c-old"]
        fence = state.records["n1.lost"]
        assert (fence.state, fence.commit, fence.containers) == ("released", "c-lost", ())
        assert placer.metric("tessera_placer_repairs_total", kind="adopt-charge") == 1
        assert placer.metric("tessera_placer_repairs_total", kind="drop-charge") == 1

        await place_q1_then_refuse_q2(bus, placer, why="the adopted pod counts")
        state = await wire.cluster_state(bus)
        wire.check_invariants(state, {"n1": wire.inventory("n1", 4)})
        wire.check_quotas(state, {"ml": (2, None)})
        wire.check_charges(state, {"ml": (2, None)})
        assert {c.pod_uid for c in state.tenants["ml"].charges} == {"old", "q1"}


async def test_a_stray_charge_given_back_while_running_wakes_the_pod_waiting_over_the_quota(
    bus: NatsBus, start_placer: PlacerFactory, tmp_path: Path
) -> None:
    """A charge whose commit never booked (its placer was killed) holds the quota until
    reconciliation gives it back; the pod refused meanwhile is then placed, not left waiting."""
    tenancy = tmp_path / "tenancy.json"
    tenancy.write_text(json.dumps({"quotas": [{"tenant": "ml", "gpus": 2}]}))
    await wire.put_node(bus, "n1", 4)
    async with start_placer(tenancy_file=str(tenancy), reconcile_interval_s=1.0) as placer:
        # Charged "in 5 s": reconciliation leaves it alone until then (a commit in flight).
        stray = charges.charge_of(_booking("lost", "n1", "c-lost"), now=time.time() + 5)
        tenant = TenantLedger(tenant="ml", charges=(stray,), updated_at=time.time())
        await bus.kv_put(subjects.KV_TENANTS, subjects.tenant_key("ml"), codec.encode(tenant))
        await place_q1_then_refuse_q2(bus, placer, why="the stray charge holds a share")
        assert placer.metric("tessera_placer_repairs_total", kind="drop-charge") == 0

        state = await settled(bus, placed("q1", "q2"), what="q2 placed once the stray is dropped")
        assert placer.metric("tessera_placer_repairs_total", kind="drop-charge") == 1
        wire.check_quotas(state, {"ml": (2, None)})
        wire.check_charges(state, {"ml": (2, None)})
        assert {c.pod_uid for c in state.tenants["ml"].charges} == {"q1", "q2"}


async def test_two_replicas_deciding_the_same_pods_give_each_one_record(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    for name in ("a", "b", "c"):
        await wire.put_node(bus, name, 4)
    async with start_placer(placer_id="one"), start_placer(placer_id="two"):
        pods = [wire.pending(f"u{i}", memory_mib=6000, cores=30) for i in range(24)]
        for pod in pods:  # every pod twice, as two messages: both replicas may take one each
            await wire.publish_pod(bus, pod)
            await wire.publish_pod(bus, msgspec.structs.replace(pod, resource_version="2"))
        await settled(bus, placed(*(p.uid for p in pods)), what="every pod placed")
        # A duplicate commit may still be giving its booking back.
        await wire.settled_state(bus, {n: wire.inventory(n, 4) for n in ("a", "b", "c")})


async def test_spread_pods_decided_by_two_replicas_at_once_get_a_gpu_each(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    """What ``spread`` promises across replicas: no two of its pods share a GPU while the node
    has an idle one. Each replica decides on its own view, and a decision that another replica
    overtook on its GPUs is made again (it used to land beside the other, room permitting)."""
    gpus = 8
    await wire.put_node(bus, "n1", gpus)
    spread = PlacementHints(gpu_policy="spread")
    async with start_placer(placer_id="one"), start_placer(placer_id="two"):
        for round_ in range(4):
            uids = [f"r{round_}-{i}" for i in range(gpus)]
            pods = [
                msgspec.structs.replace(wire.pending(uid, memory_mib=2048, cores=10), hints=spread)
                for uid in uids
            ]
            await asyncio.gather(*(wire.publish_pod(bus, pod) for pod in pods))
            state = await settled(bus, placed(*uids), what=f"round {round_} placed")
            used = sorted(g.index for r in state.placements() for c in r.containers for g in c.gpus)
            assert used == list(range(gpus)), f"round {round_}: GPUs {used}"
            for uid in uids:
                await wire.delete_pod(bus, uid)
            await settled(bus, lambda s: not s.placements(), what=f"round {round_} gone")


async def test_slices_decided_by_two_replicas_at_once_share_a_gpu_as_from_one(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    """Packing across replicas: on a four-GPU node, a whole GPU, a pair and four quarter-GPU
    slices all fit only when the slices share one GPU, whichever replica decides each. A
    decision made before another replica booked on the node is made again on the node as it is
    (it used to keep its GPUs when they were others, and two replicas could pack two slices
    each onto a GPU of their own, leaving the pair no room)."""
    await wire.put_node(bus, "n1", 4)
    async with start_placer(placer_id="one"), start_placer(placer_id="two"):
        for round_ in range(8):
            slices = [wire.pending(f"r{round_}-s{i}", memory_mib=2048) for i in range(4)]
            whole = wire.pending(f"r{round_}-whole", memory_mib=None, cores=None)
            pair = wire.pending(f"r{round_}-pair", shares=2, memory_mib=None, cores=None)
            pods = [*slices, whole, pair]
            await asyncio.gather(*(wire.publish_pod(bus, pod) for pod in pods))
            state = await settled(
                bus, placed(*(p.uid for p in pods)), what=f"round {round_} placed"
            )
            sliced = {
                g.index
                for r in state.placements()
                if "-s" in r.pod_uid
                for c in r.containers
                for g in c.gpus
            }
            assert len(sliced) == 1, f"round {round_}: slices on GPUs {sorted(sliced)}"
            for pod in pods:
                await wire.delete_pod(bus, pod.uid)
            await settled(bus, lambda s: not s.placements(), what=f"round {round_} gone")


async def test_a_pod_deleted_before_its_pending_message_is_never_placed(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    await wire.put_node(bus, "n1", 2)
    async with start_placer() as placer:
        await wire.delete_pod(bus, "late")
        await settled(
            bus, lambda s: "late" in s.claims and s.claims["late"].state == "deleted", what="tomb"
        )
        await wire.publish_pod(bus, wire.pending("late"))
        await until(
            lambda: placer.metric("tessera_placer_decisions_total", outcome="duplicate") == 1,
            what="the pending message answered",
        )
        assert (await wire.cluster_state(bus)).placements() == []


async def test_a_malformed_pod_message_is_dead_lettered_and_the_placer_keeps_placing(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    await wire.put_node(bus, "n1", 1)
    letters: asyncio.Queue[bytes] = asyncio.Queue()

    async def collect(delivery: Delivery) -> None:
        await letters.put(delivery.data)

    await bus.subscribe(subjects.deadletter("pods"), collect)
    async with start_placer():
        await bus.js_publish(subjects.PODS_PENDING, b'{"uid": 7}')
        letter = codec.decode(await asyncio.wait_for(letters.get(), 10), DeadLetter)
        assert letter.service == "placer"
        assert "Expected `str`, got `int` - at `$.uid`" in letter.reason
        await wire.publish_pod(bus, wire.pending("fine"))
        await settled(bus, placed("fine"), what="the next pod placed")


async def test_inventory_that_cannot_be_believed_never_reaches_a_decision(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    """Issue 19: the placer took inventory as it came. A GPU of 10**12 MiB took a pod of
    1,000,000 MiB, and a snapshot dated a year ahead with every GPU unhealthy shadowed the
    honest ones. Now both are dead-lettered and the node keeps its last good snapshot; a
    forgery the bounds let through holds only until the inventory's next heartbeat."""
    letters: asyncio.Queue[DeadLetter] = asyncio.Queue()

    async def collect(delivery: Delivery) -> None:
        await letters.put(codec.decode(delivery.data, DeadLetter))

    async def reason() -> str:
        return (await asyncio.wait_for(letters.get(), 10)).reason

    await bus.subscribe(subjects.deadletter("inventory"), collect)
    await wire.put_node(bus, "n1", 2)
    sick = {0: "unhealthy", 1: "unhealthy"}
    async with start_placer() as placer:
        assert placer.service is not None
        view = placer.service.view
        honest = view.inventory("n1")
        now = time.time()
        await kv.put_inventory(bus, wire.inventory("n1", 2, memory_mib=10**12, at=now))
        assert "1000000000000 MiB of memory (1..1048576 MiB are believed)" in await reason()
        year = wire.inventory("n1", 2, health=sick, at=now + 365 * 86_400)  # type: ignore[arg-type]
        await kv.put_inventory(bus, year)
        assert "s ahead of this clock (at most 300 s is believed)" in await reason()
        assert view.inventory("n1") == honest

        await wire.publish_pod(bus, wire.pending("giant", memory_mib=1_000_000))
        await wire.publish_pod(bus, wire.pending("small"))
        await settled(bus, placed("small"), what="small placed on the honest GPUs")

        async def giant_refused() -> list[PlacementRejected]:
            return [r for r in await rejections(bus) if r.pod_uid == "giant"]

        (refused,) = await until(giant_refused, what="giant refused")
        assert refused.reasons[0].reason.startswith("larger than any node can hold")
        assert live_of(await wire.cluster_state(bus), "giant") == []

        ahead = wire.inventory("n1", 2, health=sick, at=time.time() + 250)  # type: ignore[arg-type]
        await kv.put_inventory(bus, ahead)
        await until(lambda: view.inventory("n1") != honest, what="the forgery believed")
        held = view.inventory("n1")
        assert held is not None and held.observed_at <= time.time()  # not 250 s ahead
        await wire.publish_pod(bus, wire.pending("next"))
        await until(
            lambda: placer.metric("tessera_placer_decisions_total", outcome="rejected") >= 1,
            what="next refused on the forged unhealthy GPUs",
        )
        await kv.put_inventory(bus, wire.inventory("n1", 2, at=time.time()))  # the heartbeat
        state = await settled(bus, placed("next"), what="next placed once the heartbeat is back")
        wire.check_invariants(state, {"n1": wire.inventory("n1", 2)})


async def test_a_waiting_pod_held_by_a_killed_placer_is_placed_by_another(
    nats_server: NatsServer, bus: NatsBus, start_placer: PlacerFactory, tmp_path: Path
) -> None:
    await wire.put_node(bus, "n1", 1)
    whole = {"shares": 1, "memory_mib": None, "cores": None}
    async with start_placer():
        await wire.publish_pod(bus, wire.pending("blocker", **whole))  # type: ignore[arg-type]
        await settled(bus, placed("blocker"), what="blocker placed")
    process, _ = await start_process(nats_server.url, 0, tmp_path, "--ack-wait-s", "2")
    try:
        await wire.publish_pod(bus, wire.pending("waiting", **whole))  # type: ignore[arg-type]
        deadline = time.monotonic() + 30
        while not await rejections(bus):
            assert time.monotonic() < deadline, "the process never rejected the pod"
            await asyncio.sleep(0.1)
        process.send_signal(signal.SIGKILL)  # it held the waiting pod's message
        await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    async with start_placer(placer_id="survivor") as survivor:
        await until(
            lambda: survivor.metric("tessera_placer_decisions_total", outcome="rejected") >= 1,
            what="the waiting pod's message back, at the survivor",
        )
        await wire.delete_pod(bus, "blocker")
        state = await settled(bus, placed("waiting"), what="the waiting pod placed")
        assert state.claims["waiting"].booking is not None
        assert state.claims["waiting"].booking.placer_id == "survivor"


async def test_the_extender_entry_point_places_a_pod_on_the_node_it_is_given(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    for name in ("a", "b"):
        await wire.put_node(bus, name, 1)
    async with start_placer() as placer:
        assert placer.service is not None
        outcome = await placer.service.place(wire.pending("e1"), node="b")
        assert (outcome.outcome, outcome.node) == ("placed", "b")
        assert live_of(await wire.cluster_state(bus), "e1")[0].node == "b"
        whole = wire.pending("e2", memory_mib=None, cores=None)
        refused = await placer.service.place(whole, node="b")
        assert refused.outcome == "waiting"
        assert refused.reasons == (("not enough idle GPUs", 1),)


async def test_released_records_and_deleted_pods_claims_are_purged_after_retention(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    await wire.put_node(bus, "n1", 1)
    async with start_placer(release_retention_s=1.0) as placer:
        await wire.publish_pod(bus, wire.pending("short"))
        await wire.publish_pod(bus, wire.pending("long"))
        await settled(bus, placed("short", "long"), what="both placed")
        await wire.delete_pod(bus, "short")
        state = await settled(
            bus,
            lambda s: (
                "short" not in s.claims and subjects.assignment_key("n1", "short") not in s.records
            ),
            what="the released record and the tombstone purged",
        )
        assert placed("long")(state)  # what is live stays
        assert placer.metric("tessera_placer_purged_total", entry="record") == 1
        assert placer.metric("tessera_placer_purged_total", entry="claim") == 1


async def test_cluster_statistics_are_published_for_the_dashboard(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    await wire.put_node(bus, "gpu-1", 2)
    async with start_placer(tuning={"stats_interval_s": 0.1}):
        await wire.publish_pod(bus, wire.pending("u1", memory_mib=4096, cores=25))
        await settled(bus, placed("u1"), what="a record for u1")

        deadline = time.monotonic() + 20
        while True:
            entry = await bus.kv_get(subjects.KV_STATS, subjects.stats_key("placer-test"))
            figures = codec.decode(entry.value, ClusterStats) if entry else None
            # u1 is placed and stays reserved: no binder here writes its record.
            if figures is not None and figures.gpu_milli_allocated > 0 and figures.pods_reserved:
                break
            assert time.monotonic() < deadline, f"no statistics counting u1: {figures}"
            await asyncio.sleep(0.05)
        assert (figures.placer_id, figures.nodes, figures.gpus) == ("placer-test", 1, 2)
        assert figures.gpu_milli_capacity == 2000
        assert figures.gpu_milli_allocated == 250  # 25 % of the SMs outweighs 4 GiB of 80
        assert figures.pods_reserved == 1
        assert set(figures.node_fragmented_milli) == {"gpu-1"}
        assert figures.profile == "tessera"
