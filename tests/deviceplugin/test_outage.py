"""Issue 9, item 2: an Allocate answered with an error leaves no write behind, and a write whose
outcome the plugin could not observe is resolved by reading the record back; one it cannot read
back is refused, and its record is served after every other one for a while (the kubelet never
retries a refused Allocate: its pod fails admission). Over a real nats-server that really goes
away."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator

import pytest

from services.deviceplugin.rules.allocate import ContainerGrant, Refusal
from services.deviceplugin.service import DevicePluginService
from shared import codec, subjects
from shared.runtime.nats import NatsBus
from tests.deviceplugin.builders import NODE, container, gpu, inventory, record, share, uuid
from tests.deviceplugin.conftest import get_record, until
from tests.deviceplugin.test_service import service_on
from tests.harness.commits import booking_of
from tests.harness.kv import announce_inventory, put_committed
from tests.harness.lossy import LostAnswerBus
from tests.harness.nats import NatsServer
from tests.harness.store import mark_restored

DEVICES = (f"{uuid(0)}::0",)


async def test_a_write_refused_during_an_outage_never_lands_and_the_retry_is_granted(
    nats_server: NatsServer, bus: NatsBus
) -> None:
    await announce_inventory(bus, inventory(gpu(0)))
    await put_committed(bus, record("outage", container("main", share(0))))
    async with service_on(bus) as (service, _):
        # Killing NATS before the booking is seen makes the record unconfirmed (refused as
        # such, never written), not the write this test sends.
        await until(lambda: service.servable_records, what="the record's booking seen")
        nats_server.kill()
        await until(lambda: not bus.connected, what="the outage")
        refused = await service.allocate([DEVICES])
        assert isinstance(refused, Refusal) and refused.kind == "unavailable"
        assert refused.message == (
            f"cannot write the assignment record {subjects.assignment_key(NODE, 'outage')}: not "
            "connected to NATS for 0 s; nothing was allocated"
        )
        nats_server.start()
        await until(lambda: bus.connected, timeout=30, what="the reconnect")
        stored = await get_record(bus, "outage")
        assert (stored.state, stored.allocated) == ("bound", ()), "the refused write never landed"
        granted = await service.allocate([DEVICES])
        assert isinstance(granted, list) and isinstance(granted[0], ContainerGrant), granted
    stored = await get_record(bus, "outage")
    assert stored.state == "allocated" and len(stored.allocated) == 1


async def test_an_allocate_during_a_nats_restart_waits_and_is_granted_once(
    nats_server: NatsServer, bus: NatsBus
) -> None:
    """A NATS restart must not fail the pod at admission: Allocate waits for the connection."""
    await announce_inventory(bus, inventory(gpu(0)))
    await put_committed(bus, record("restart", container("main", share(0))))
    async with service_on(bus, nats_wait_s=60) as (service, _):
        nats_server.kill()
        await until(lambda: not bus.connected, what="the outage")
        waiting = asyncio.ensure_future(service.allocate([DEVICES]))
        await asyncio.sleep(0.5)
        assert not waiting.done(), "it waits for NATS instead of refusing"
        nats_server.start()
        granted = await asyncio.wait_for(waiting, timeout=40)
        assert isinstance(granted, list) and isinstance(granted[0], ContainerGrant), granted
        assert granted[0].envs["NVIDIA_VISIBLE_DEVICES"] == uuid(0)
    stored = await get_record(bus, "restart")
    assert stored.state == "allocated"
    assert [a.device_ids for a in stored.allocated] == [DEVICES], "allocated exactly once"


@contextlib.asynccontextmanager
async def outage_with_a_booking_unseen(
    nats_server: NatsServer,
    bus: NatsBus,
    uid: str,
    *,
    nats_wait_s: float,
    record_wait_s: float = 0.2,
) -> AsyncIterator[DevicePluginService]:
    """A record whose booking the plugin has not seen (a store being rebuilt: the record restored
    before its booking), and NATS away."""
    await announce_inventory(bus, inventory(gpu(0)))
    late = record(uid, container("main", share(0)))
    await put_committed(bus, late)
    await bus.kv_delete(subjects.KV_LEDGER, subjects.booking_key(NODE, uid))
    async with service_on(bus, nats_wait_s=nats_wait_s, record_wait_s=record_wait_s) as (
        service,
        _,
    ):
        await until(lambda: bool(service.held_records), what="the record held")
        assert not service.servable_records
        nats_server.kill()
        await until(lambda: not bus.connected, what="the outage")
        yield service


async def test_a_booking_not_seen_when_nats_restarts_is_read_once_it_is_back(
    nats_server: NatsServer, bus: NatsBus
) -> None:
    """When the booking is not seen (yet) and NATS then restarts, Allocate waits for NATS and
    reads it again rather than refusing the pod as uncommitted."""
    # The booking is written after the reconnect, inside the time Allocate gives the watches
    # once NATS is back (``record_wait_s``): the product's default, since on a loaded machine
    # the test's own write can trail the reconnect by more than the 0.2 s of the other tests.
    async with outage_with_a_booking_unseen(
        nats_server, bus, "late", nats_wait_s=60, record_wait_s=2.0
    ) as service:
        waiting = asyncio.ensure_future(service.allocate([DEVICES]))
        await asyncio.sleep(0.5)
        assert not waiting.done(), "it waits for NATS instead of refusing"
        nats_server.start()
        await until(lambda: bus.connected, timeout=30, what="the reconnect")
        booking = booking_of(record("late", container("main", share(0))))
        await bus.kv_put(
            subjects.KV_LEDGER, subjects.booking_key(NODE, "late"), codec.encode(booking)
        )
        granted = await asyncio.wait_for(waiting, timeout=40)
    assert isinstance(granted, list) and isinstance(granted[0], ContainerGrant), granted


async def test_a_booking_not_seen_while_nats_stays_away_is_refused_as_unavailable(
    nats_server: NatsServer, bus: NatsBus
) -> None:
    """Past ``nats_wait_s`` the record is refused for what stopped it, the outage (it was once
    refused as "uncommitted", as if no placer had committed it), and nothing is allocated."""
    async with outage_with_a_booking_unseen(nats_server, bus, "never", nats_wait_s=0.5) as service:
        refused = await service.allocate([DEVICES])
        assert isinstance(refused, Refusal) and refused.kind == "unavailable", refused
        assert refused.message == (
            f"cannot confirm the assignment record {subjects.assignment_key(NODE, 'never')}: "
            "not connected to NATS for 0.5 s, and its booking in this node's ledger is not "
            "read yet; nothing was allocated"
        )
        nats_server.start()
        await until(lambda: bus.connected, timeout=30, what="the reconnect")
    stored = await get_record(bus, "never")
    assert (stored.state, stored.allocated) == ("bound", ()), "nothing was allocated"


@pytest.mark.parametrize("lands", [True, False], ids=["write-landed", "write-lost"])
async def test_a_record_whose_write_was_refused_is_served_after_the_others(
    bus: NatsBus, lands: bool
) -> None:
    """A three-server chaos run: the write of the older of two identical records failed, the
    kubelet rejected that pod, and the next pod's Allocate (the same device IDs) was served
    from the older record: the next pod got its slices, but its own record stayed ``bound``
    for good. A refused record now comes after the others; a write that landed unseen stays
    with the rejected pod (released with it) and answers no later Allocate."""
    await announce_inventory(bus, inventory(gpu(0)))
    await put_committed(bus, record("rejected", container("main", share(0)), bound_at=100.0))
    await put_committed(bus, record("next", container("main", share(0)), bound_at=200.0))
    lossy = LostAnswerBus(bus, lands=lands, unreadable=1)
    async with service_on(lossy) as (service, _):
        first = await service.allocate([DEVICES])
        assert isinstance(first, Refusal) and first.kind == "unavailable"
        assert "did not confirm it and it cannot be read back yet" in first.message
        assert subjects.assignment_key(NODE, "rejected") in first.message
        granted = await service.allocate([DEVICES])  # another pod: the kubelet never retries
        assert isinstance(granted, list) and isinstance(granted[0], ContainerGrant), granted
    served = await get_record(bus, "next")
    assert (served.state, [a.device_ids for a in served.allocated]) == ("allocated", [DEVICES])
    rejected = await get_record(bus, "rejected")
    assert rejected.state == ("allocated" if lands else "bound")  # a placer or binder ends it


async def test_a_refused_record_is_still_served_when_no_other_one_matches(bus: NatsBus) -> None:
    """Which pod the kubelet rejected is not known here: when the refused record is the only
    one of its size, the next Allocate is its own pod's and gets it."""
    await announce_inventory(bus, inventory(gpu(0)))
    await put_committed(bus, record("only", container("main", share(0))))
    async with service_on(LostAnswerBus(bus, lands=False, unreadable=1)) as (service, _):
        first = await service.allocate([DEVICES])
        assert isinstance(first, Refusal) and first.kind == "unavailable"
        granted = await service.allocate([DEVICES])
    assert isinstance(granted, list) and isinstance(granted[0], ContainerGrant), granted
    stored = await get_record(bus, "only")
    assert stored.state == "allocated"
    assert [a.device_ids for a in stored.allocated] == [DEVICES], "allocated exactly once"


async def test_a_write_whose_answer_was_lost_is_read_back_at_once_when_it_can_be(
    bus: NatsBus,
) -> None:
    await announce_inventory(bus, inventory(gpu(0)))
    await put_committed(bus, record("readable", container("main", share(0))))
    async with service_on(LostAnswerBus(bus, lands=True, unreadable=0)) as (service, _):
        granted = await service.allocate([DEVICES])
    assert isinstance(granted, list) and isinstance(granted[0], ContainerGrant), granted
    assert len((await get_record(bus, "readable")).allocated) == 1


async def test_an_allocate_whose_record_the_store_lost_waits_for_the_restore(
    nats_server: NatsServer, bus: NatsBus
) -> None:
    """NATS lost its store just after the pod was bound: its record comes back only with the
    binder's restore, a second or more after the reconnect. The Allocate waits for it (up to
    ``--nats-wait-s``) instead of refusing once the usual record wait is over, which failed the
    pod at admission."""
    await announce_inventory(bus, inventory(gpu(0)))
    lost = record("lost", container("main", share(0)))
    await put_committed(bus, lost)
    async with service_on(bus, nats_wait_s=60) as (service, _):
        await until(lambda: service.servable_records, what="the record's commit read")
        old = bus.store_epoch
        nats_server.kill()
        shutil.rmtree(nats_server.directory / "js")  # an emptyDir NATS pod restarting
        nats_server.start()
        await until(lambda: bus.connected and bus.store_epoch != old, timeout=30, what="new store")
        waiting = asyncio.ensure_future(service.allocate([DEVICES]))
        await asyncio.sleep(1.0)  # well past the record wait (0.2 s)
        assert not waiting.done(), "it waits for the restore instead of refusing"
        # The binder's restore: the placement committed and recorded again, then its word.
        await announce_inventory(bus, inventory(gpu(0)))
        await put_committed(bus, lost)
        await mark_restored(bus)
        granted = await asyncio.wait_for(waiting, timeout=30)
        assert isinstance(granted, list) and isinstance(granted[0], ContainerGrant), granted
    stored = await get_record(bus, "lost")
    assert stored.state == "allocated"
