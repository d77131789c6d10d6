"""Issue 19 against the device plugin over a real nats-server: it grants only what a placer
committed (the node's ledger books the record's commit, with its slices).

Whoever may write ``tessera-assignments`` (a device plugin for its node, the binder, a bug) can
write a well-formed record; only placers write the ledger. The forgeries here are the ones the
issue found granted.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import msgspec
import pytest

from services.deviceplugin.grants import GrantFile, state_file
from services.deviceplugin.rules.allocate import ContainerGrant, Granted, Refusal
from shared import codec, subjects
from shared.messages.assignments import AssignmentRecord
from shared.messages.grants import GrantsRequest, NodeGrants
from shared.runtime.nats import NatsBus
from tests.deviceplugin.builders import NODE, container, gpu, inventory, record, share, uuid
from tests.deviceplugin.conftest import (
    PluginFactory,
    get_record,
    until,
)
from tests.deviceplugin.fake_kubelet import FakeKubelet
from tests.deviceplugin.test_hardening import dead_letters, next_letter, regress_to_bound
from tests.deviceplugin.test_plugin import allocate_request
from tests.deviceplugin.test_service import service_on
from tests.harness.commits import booking_of, commit
from tests.harness.kv import announce_inventory, put_committed

WHOLE = record("whole", container("main", share(0, memory_mib=16_384, cores=100)))
"""A real pod holding GPU 0 (16 GiB) whole."""
GHOST = record(
    "ghost", container("main", share(0, memory_mib=1024, cores=10)), bound_at=1_700_000_050.0
)
"""A well-formed bound record of a pod that does not exist, on the GPU ``WHOLE`` holds, older
than it (so the oldest-first rule would pick it first)."""


def device(ordinal: int) -> list[str]:
    return [f"{uuid(0)}::{ordinal}"]


async def forge(bus: NatsBus, forged: AssignmentRecord) -> None:
    """Write a record as any writer of the bucket can, with no commit behind it."""
    await bus.kv_put(
        subjects.KV_ASSIGNMENTS,
        subjects.assignment_key(forged.node, forged.pod_uid),
        codec.encode(forged),
    )


async def test_a_forged_record_on_a_gpu_held_whole_is_refused_over_grpc(
    bus: NatsBus, kubelet: FakeKubelet, start_plugin: PluginFactory
) -> None:
    """The issue's finding: granted TESSERA_GPU_MEMORY_LIMIT_MIB=1024 beside a whole-GPU pod."""
    await announce_inventory(bus, inventory(gpu(0)))
    await put_committed(bus, WHOLE)
    await forge(bus, GHOST)
    async with start_plugin() as plugin, kubelet.plugin(plugin.endpoint) as stub:
        # The older forged record does not block the real one: the real pod gets its GPU.
        response = await stub.Allocate(allocate_request(device(0)), timeout=10)
        envs = response.container_responses[0].envs
        assert envs["TESSERA_GPU_MEMORY_LIMIT_MIB"] == "16384"
        assert response.container_responses[0].annotations["tessera.dev/pod-uid"] == "whole"
        # The next Allocate finds only the forged record, and refuses it with the reason.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Allocate(allocate_request(device(1)), timeout=10)
    details = refused.value.details() or ""
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "assignment record" in details and "is not granted" in details, details
    assert "ledger holds nothing for pod ml/pod-ghost" in details
    assert (await get_record(bus, "ghost")).state == "bound", "nothing was allocated"


async def test_a_real_commit_copied_onto_other_slices_or_another_pod_is_refused_and_counted(
    bus: NatsBus,
) -> None:
    await announce_inventory(bus, inventory(gpu(0)))
    await commit(bus, WHOLE)  # the real commit (booking and claim); its record is not written yet
    copies = [
        # The real pod's commit, on a slice that was never booked.
        msgspec.structs.replace(WHOLE, containers=GHOST.containers),
        # The real pod's commit id on a pod that does not exist.
        msgspec.structs.replace(GHOST, commit=WHOLE.commit),
    ]
    async with service_on(bus) as (service, registry):
        for forged in copies:
            await forge(bus, forged)
            result = await service.allocate([tuple(device(0))])
            assert isinstance(result, Refusal) and result.kind == "uncommitted", result
            await bus.kv_delete(
                subjects.KV_ASSIGNMENTS, subjects.assignment_key(forged.node, forged.pod_uid)
            )
        refused = registry.get_sample_value(
            "tessera_deviceplugin_allocations_total", {"outcome": "uncommitted"}
        )
        assert refused == len(copies)
        await put_committed(bus, WHOLE)
        granted = await service.allocate([tuple(device(0))])
        assert isinstance(granted, list) and isinstance(granted[0], ContainerGrant), granted


async def test_a_record_whose_booking_arrives_late_is_granted_once_it_does(bus: NatsBus) -> None:
    """A booking not there yet (a NATS store being rebuilt: the restored record before its
    booking) is read again at Allocate, which waits for it like for a late record."""
    await announce_inventory(bus, inventory(gpu(0)))
    await put_committed(bus, WHOLE)
    booking_key = subjects.booking_key(WHOLE.node, WHOLE.pod_uid)
    await bus.kv_delete(subjects.KV_LEDGER, booking_key)
    async with service_on(bus, record_wait_s=5.0) as (service, _):
        call = asyncio.create_task(service.allocate([tuple(device(0))]))
        await asyncio.sleep(0.3)
        assert not call.done()
        await bus.kv_put(subjects.KV_LEDGER, booking_key, codec.encode(booking_of(WHOLE)))
        granted = await asyncio.wait_for(call, 5)
    assert isinstance(granted, list) and isinstance(granted[0], ContainerGrant), granted


# --- after a restart of the plugin, what it granted stays granted ------------------------------


async def test_a_record_moved_backwards_while_the_plugin_was_down_is_not_granted_twice(
    bus: NatsBus, kubelet: FakeKubelet, start_plugin: PluginFactory, plugin_dir: Path
) -> None:
    """Issue 19: after a plugin restart, a record moved backwards (allocated -> bound) was
    granted again: two containers on one slice. The plugin keeps what it granted in a state file
    (in a subdirectory of the plugin directory, which a kubelet restart leaves alone)."""
    letters = await dead_letters(bus, "assignments")
    await announce_inventory(bus, inventory(gpu(0)))
    once = record("once", container("main", share(0)))
    await put_committed(bus, once)
    async with start_plugin() as plugin, kubelet.plugin(plugin.endpoint) as stub:
        granted = await stub.Allocate(allocate_request(device(0)), timeout=10)
        assert granted.container_responses[0].annotations["tessera.dev/pod-uid"] == "once"
    await kubelet.restart()  # the kubelet deletes every file of its plugin directory too
    assert state_file(plugin_dir, plugin.endpoint).exists()
    await regress_to_bound(bus, "once")  # a writer moves the record back while the plugin is down
    async with start_plugin() as plugin, kubelet.plugin(plugin.endpoint) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Allocate(allocate_request(device(1)), timeout=10)
        letter = await next_letter(letters)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "moved backwards" in letter.reason and "before a restart" in letter.reason
    assert (await get_record(bus, "once")).state == "bound", "granted once only"


async def test_a_grant_is_forgotten_once_its_record_is_released(
    bus: NatsBus, kubelet: FakeKubelet, start_plugin: PluginFactory, plugin_dir: Path
) -> None:
    """The state file holds only live grants: the key may serve a new placement later."""
    await announce_inventory(bus, inventory(gpu(0)))
    await put_committed(bus, record("first", container("main", share(0))))
    async with start_plugin() as plugin, kubelet.plugin(plugin.endpoint) as stub:
        await stub.Allocate(allocate_request(device(0)), timeout=10)
        grants = GrantFile(state_file(plugin_dir, plugin.endpoint))
        granted_key = {subjects.assignment_key(NODE, "first")}
        await until(lambda: set(grants.load()) == granted_key, what="the grant written")
        stored = await get_record(bus, "first")
        released = msgspec.structs.replace(stored, state="released", released_at=1_700_000_900.0)
        await bus.kv_put(
            subjects.KV_ASSIGNMENTS, subjects.assignment_key(NODE, "first"), codec.encode(released)
        )
        await until(lambda: grants.load() == {}, what="the grant forgotten")
    # Placed again on this node by a new commit: granted again, after a restart too.
    again = record("first", container("main", share(0)), commit="commit-first-again")
    await put_committed(bus, again)
    async with start_plugin() as plugin, kubelet.plugin(plugin.endpoint) as stub:
        granted = await stub.Allocate(allocate_request(device(1)), timeout=10)
    assert granted.container_responses[0].annotations["tessera.dev/pod-uid"] == "first"


async def test_a_grant_whose_record_the_store_lost_is_kept_and_answered_until_released(
    bus: NatsBus, kubelet: FakeKubelet, start_plugin: PluginFactory, plugin_dir: Path
) -> None:
    """NATS losing its store deletes the record of a pod that still runs with what it was
    handed: the plugin keeps the grant (unrecorded) and tells the binder, which restores the
    placement from it; a release forgets it."""
    await announce_inventory(bus, inventory(gpu(0), gpu(1)))
    held = share(0, memory_mib=6000, cores=40)
    await put_committed(bus, record("kept", container("main", held)))
    key = subjects.assignment_key(NODE, "kept")
    question = codec.encode(GrantsRequest(node=NODE))
    async with start_plugin() as plugin, kubelet.plugin(plugin.endpoint) as stub:
        await stub.Allocate(allocate_request(device(0)), timeout=10)
        grants = GrantFile(state_file(plugin_dir, plugin.endpoint))
        await until(lambda: key in grants.load(), what="the grant written")
        await bus.kv_delete(subjects.KV_ASSIGNMENTS, key)  # the store lost it
        await until(
            lambda: (grants.load().get(key) or Granted(commit="", containers=())).unrecorded_at,
            what="the grant kept unrecorded",
        )
        answer = codec.decode(
            await bus.request(subjects.grants(NODE), question, timeout=5), NodeGrants
        )
        (granted,) = answer.granted
        assert (granted.pod_uid, granted.commit) == ("kept", "commit-kept")
        assert granted.containers == (container("main", held),)
        assert [(g.uuid, g.memory_mib) for g in answer.gpus] == [
            (uuid(0), gpu(0).memory_total_mib),
            (uuid(1), gpu(1).memory_total_mib),
        ]
        released = msgspec.structs.replace(
            record("kept", container("main", held)), state="released", released_at=1.0
        )
        await bus.kv_put(subjects.KV_ASSIGNMENTS, key, codec.encode(released))
        await until(lambda: grants.load() == {}, what="the released grant forgotten")
        again = codec.decode(
            await bus.request(subjects.grants(NODE), question, timeout=5), NodeGrants
        )
        assert again.granted == ()
