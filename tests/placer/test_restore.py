"""A placer over a NATS store that lost what was bound (docs/design.md §12): it decides nothing
before the binder says the store holds every bound placement, books what the binder restores
whatever the ledger says, and then places around it."""

from __future__ import annotations

import asyncio
import functools
import shutil

from shared import codec, subjects, validation
from shared.messages.base import ContainerSlices, GpuSlice
from shared.messages.pods import PodRestore
from shared.runtime.nats import NatsBus
from tests.harness.held_watches import HeldWatches
from tests.harness.nats import NatsServer
from tests.harness.store import mark_restored
from tests.harness.wait import eventually
from tests.placer import wire
from tests.placer.conftest import PlacerFactory, rejections

until = functools.partial(eventually, timeout=20.0, interval=0.02)
WHOLE = {"shares": 1, "memory_mib": None, "cores": None}


def restore_of(uid: str, epoch: str) -> PodRestore:
    """What the binder publishes for a pod bound to n1's only GPU, whole, already allocated."""
    gpu = GpuSlice(uuid=wire.gpu_uuid("n1", 0), index=0, memory_mib=wire.GPU_MIB, cores=100)
    return PodRestore(
        pod=wire.pending(uid, **WHOLE),  # type: ignore[arg-type]
        node="n1",
        containers=(
            ContainerSlices(container="main", gpus=(gpu,), resources={"tessera.dev/gpu": 1}),
        ),
        decided_at=wire.NOW,
        placer_id="placer-gone",
        commit="placer-gone.c1",
        state="allocated",
        bound_at=wire.NOW + 1,
        epoch=epoch,
    )


async def test_nothing_is_decided_before_what_is_bound_is_restored_then_it_is_honoured(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    await wire.put_node(bus, "n1", 1)
    async with start_placer(wait_ready=False, restored=False) as placer:
        await until(
            lambda: placer.readiness.report().get("store", (True, ""))[0] is False,
            what="not ready while the store is not restored",
        )
        await wire.publish_pod(bus, wire.pending("new", **WHOLE))  # type: ignore[arg-type]
        await until(
            lambda: placer.metric("tessera_messages_received_total", family="pods") >= 1,
            what="the new pod taken in",
        )
        assert placer.metric("tessera_placer_tries_total") == 0, "decided before the restore"
        assert not placer.readiness.ready

        epoch = bus.store_epoch
        await bus.js_publish(subjects.PODS_RESTORE, codec.encode(restore_of("old", epoch)))
        state = await until(
            lambda: _restored(bus), what="the restored placement booked, claimed and recorded"
        )
        (record,) = state.placements()
        assert (record.pod_uid, record.state, record.commit) == (
            "old",
            "allocated",
            "placer-gone.c1",
        )
        assert state.claims["old"].state == "placed"
        assert [b.pod_uid for b in state.bookings()] == ["old"]
        # Valid as every reader checks it: allocated, with its containers answered.
        key = subjects.assignment_key("n1", "old")
        assert validation.record_problem(record, key=key) is None

        await mark_restored(bus)  # the binder's word: every bound placement is in the store
        await until(lambda: placer.readiness.ready, what="ready once restored")
        await until(lambda: _rejected(bus, "new"), what="the new pod refused")
        (refused,) = [r for r in await rejections(bus) if r.pod_uid == "new"]
        assert refused.reasons[0].reason == "not enough idle GPUs", "the restored pod holds it"
    state = await wire.cluster_state(bus)
    wire.check_invariants(state, {"n1": wire.inventory("n1", 1)})


async def test_a_restore_meant_for_a_lost_store_is_dropped(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    await wire.put_node(bus, "n1", 1)
    async with start_placer() as placer:
        stale = restore_of("old", "an-epoch-that-is-gone")
        await bus.js_publish(subjects.PODS_RESTORE, codec.encode(stale))
        await until(
            lambda: placer.metric("tessera_placer_restores_total", outcome="other-store") == 1,
            what="the restore dropped",
        )
    assert (await wire.cluster_state(bus)).placements() == []


async def test_a_store_lost_never_releases_the_record_of_a_running_pod_whatever_the_watches_do(
    nats_server: NatsServer, bus: NatsBus, start_placer: PlacerFactory
) -> None:
    """NATS lost its store. The placer took the new epoch at once, but its ledger and claims
    watches came back late (a watch backs off while JetStream is slow to start on the restarted
    server), and the binder's restore came first: the replica must not take the lost store's
    bookings and claims for the new store's. Its restore once skipped the booking and the claim
    ("already there", read from the lost store), and reconciliation, once the watches were back,
    released the record of the running pod: its GPUs looked free and the next pods were placed
    on them."""
    await wire.put_node(bus, "n1", 1)
    held = HeldWatches(
        watches={
            (subjects.KV_LEDGER, subjects.BOOKING_KEYS),
            (subjects.KV_CLAIMS, subjects.CLAIM_KEYS),
        }
    )
    tuning = {"reconcile_interval_s": 0.4}
    async with start_placer(wrap_bus=held.wrap, tuning=tuning) as placer:
        assert placer.service is not None
        old = bus.store_epoch
        await bus.js_publish(subjects.PODS_RESTORE, codec.encode(restore_of("old", old)))
        await until(lambda: _restored(bus), what="the pod placed in the first store")
        await until(lambda: "old" in placer.service.view.claims, what="its claim in the view")

        held.hold()
        nats_server.kill()
        shutil.rmtree(nats_server.directory / "js")  # an emptyDir NATS pod restarting
        nats_server.start()
        await until(lambda: bus.connected and bus.store_epoch != old, what="the new store")
        new = bus.store_epoch
        await until(lambda: placer.service.shell.bus.store_epoch == new, what="its new epoch")
        await until(lambda: held.waiting == 2, what="the ledger and claims watches held")
        await wire.put_node(bus, "n1", 1)
        await bus.js_publish(subjects.PODS_RESTORE, codec.encode(restore_of("old", new)))
        await asyncio.sleep(0.5)  # the restore is taken in meanwhile (or waits: see below)
        held.release()

        async def recorded() -> bool:
            return bool((await wire.cluster_state(bus)).live_records())

        await until(recorded, what="the running pod's placement restored")
        await mark_restored(bus)  # the binder's word, once every record is there
        await until(lambda: placer.readiness.ready, what="ready on the new store")
        await asyncio.sleep(4 * tuning["reconcile_interval_s"])  # reconciliation passes
        state = await wire.cluster_state(bus)
        (record,) = state.records.values()
        assert (record.state, record.commit) == ("allocated", "placer-gone.c1"), record
        assert "old" in state.claims, "the restore left the pod unclaimed"
        assert state.claims["old"].state == "placed"
        assert [b.pod_uid for b in state.bookings()] == ["old"]
        assert placer.metric("tessera_placer_repairs_total", kind="release-record") == 0


async def _restored(bus: NatsBus) -> wire.ClusterState | None:
    state = await wire.cluster_state(bus)
    return state if state.placements() and state.claims and state.bookings() else None


async def _rejected(bus: NatsBus, uid: str) -> bool:
    return any(r.pod_uid == uid for r in await rejections(bus))
