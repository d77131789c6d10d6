"""Issue 19 against the device plugin over a real nats-server: it grants only what a placer
committed (the pod's claim names the record's commit, the node's ledger books its slices).

Whoever may write ``tessera-assignments`` (a device plugin for its node, the binder, a bug) can
write a well-formed record; only placers write claims and the ledger. The forgeries here are the
ones the issue found granted.
"""

from __future__ import annotations

import asyncio

import grpc
import msgspec
import pytest

from services.deviceplugin._proto import api_pb2
from services.deviceplugin.allocate import ContainerGrant, Refusal
from shared import codec, subjects
from shared.runtime.bus import NatsBus
from tests.deviceplugin.builders import container, gpu, inventory, record, share, uuid
from tests.deviceplugin.conftest import PluginFactory, get_record, put_inventory, put_record
from tests.deviceplugin.fake_kubelet import FakeKubelet
from tests.deviceplugin.test_service import service_on
from tests.harness.commits import claim_of, commit

WHOLE = record("whole", container("main", share(0, memory_mib=16_384, cores=100)))
"""A real pod holding GPU 0 (16 GiB) whole."""
GHOST = record(
    "ghost", container("main", share(0, memory_mib=1024, cores=10)), bound_at=1_700_000_050.0
)
"""A well-formed bound record of a pod that does not exist, on the GPU ``WHOLE`` holds, older
than it (so the oldest-first rule would pick it first)."""


def device(ordinal: int) -> list[str]:
    return [f"{uuid(0)}::{ordinal}"]


async def forge(bus: NatsBus, forged: object) -> None:
    """Write a record as any writer of the bucket can, with no commit behind it."""
    assert hasattr(forged, "pod_uid") and hasattr(forged, "node")
    await bus.kv_put(
        subjects.KV_ASSIGNMENTS,
        subjects.assignment_key(forged.node, forged.pod_uid),
        codec.encode(forged),
    )


async def test_a_forged_record_on_a_gpu_held_whole_is_refused_over_grpc(
    bus: NatsBus, kubelet: FakeKubelet, start_plugin: PluginFactory
) -> None:
    """The issue's finding: granted TESSERA_GPU_MEMORY_LIMIT_MIB=1024 beside a whole-GPU pod."""
    await put_inventory(bus, inventory(gpu(0)))
    await put_record(bus, WHOLE)
    await forge(bus, GHOST)
    async with start_plugin() as plugin, kubelet.plugin(plugin.endpoint) as stub:
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=device(0))]
        )
        # The older forged record does not block the real one: the real pod gets its GPU.
        response = await stub.Allocate(request, timeout=10)
        envs = response.container_responses[0].envs
        assert envs["TESSERA_GPU_MEMORY_LIMIT_MIB"] == "16384"
        assert response.container_responses[0].annotations["tessera.dev/pod-uid"] == "whole"
        # The next Allocate finds only the forged record, and refuses it with the reason.
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=device(1))]
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Allocate(request, timeout=10)
    details = refused.value.details() or ""
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "assignment record" in details and "is not granted" in details, details
    assert "no placer claimed pod ml/pod-ghost (uid ghost): it has no claim" in details
    assert (await get_record(bus, "ghost")).state == "bound", "nothing was claimed"


async def test_a_real_commit_copied_onto_other_slices_or_another_pod_is_refused_and_counted(
    bus: NatsBus,
) -> None:
    await put_inventory(bus, inventory(gpu(0)))
    await commit(bus, WHOLE)  # the real commit (claim and booking); its record is not written yet
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
        await put_record(bus, WHOLE)
        granted = await service.allocate([tuple(device(0))])
        assert isinstance(granted, list) and isinstance(granted[0], ContainerGrant), granted


async def test_a_record_whose_claim_arrives_late_is_granted_once_it_does(bus: NatsBus) -> None:
    """A claim read before it existed (a NATS store rebuilt, a placer slower than its record)
    is read again at Allocate, which waits for it like for a late record."""
    await put_inventory(bus, inventory(gpu(0)))
    await put_record(bus, WHOLE)
    await bus.kv_delete(subjects.KV_CLAIMS, subjects.claim_key(WHOLE.pod_uid))
    async with service_on(bus, record_wait_s=5.0) as (service, _):
        call = asyncio.create_task(service.allocate([tuple(device(0))]))
        await asyncio.sleep(0.3)
        assert not call.done()
        await bus.kv_put(
            subjects.KV_CLAIMS, subjects.claim_key(WHOLE.pod_uid), codec.encode(claim_of(WHOLE))
        )
        granted = await asyncio.wait_for(call, 5)
    assert isinstance(granted, list) and isinstance(granted[0], ContainerGrant), granted
