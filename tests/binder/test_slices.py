"""The binder publishes a DRA node's ResourceSlices from its inventory, with the real
kubernetes-asyncio client, to the API double whose validation is the real registry's rules; what
it writes also passes the 1.37 strict schemas (the ``api`` fixture checks every kind written)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import msgspec
import pytest
from prometheus_client import CollectorRegistry

from services.binder.kube import KubeGateway, RetryPolicy, load_configuration, new_configuration
from services.binder.kubedra import KubeDra
from services.binder.metrics import BinderMetrics
from services.binder.rules.draslices import (
    MAX_DEVICES_WITH_TAINTS,
    UNHEALTHY_TAINT,
    dra_node,
    plan_slices,
    slice_name,
)
from services.binder.slicing import SlicePublisher
from shared.clock import SystemClock
from shared.dra.devices import DRIVER, MemoryPolicy
from shared.messages.inventory import GpuHealthState, NodeInventory
from tessera.devcluster.apiserver import ApiServer
from tests.binder.conftest import K8S_VERSION
from tests.harness import wire

POLICY = MemoryPolicy(step_mib=256, minimum_mib=512)
NODE = "gpu-node-1"


def inventory(
    gpus: int = 2, *, memory_mib: int = 81559, health: dict[int, GpuHealthState] | None = None
) -> NodeInventory:
    telemetry = tuple(
        msgspec.structs.replace(
            wire.gpu(i, memory_mib=memory_mib, numa=i % 2, health=(health or {}).get(i, "healthy")),
            pci_bus_id=f"00000000:{0x3B + i:02X}:00.0",
            pcie_root="pci0000:3a",
        )
        for i in range(gpus)
    )
    return wire.inventory(*telemetry, node=NODE)


@contextlib.asynccontextmanager
async def publisher(kubeconfig: Path) -> AsyncIterator[tuple[SlicePublisher, KubeDra]]:
    configuration = new_configuration()
    await load_configuration(configuration, kubeconfig=str(kubeconfig), environ={})
    gateway = KubeGateway.create(
        configuration,
        BinderMetrics.create(CollectorRegistry()),
        clock=SystemClock(),
        timeout_s=5.0,
        retry=RetryPolicy(attempts=2, initial_s=0.02, max_s=0.1),
    )
    try:
        dra = KubeDra(gateway)
        yield SlicePublisher(api=dra, policy=POLICY), dra
    finally:
        await gateway.close()


async def stored(gateway: KubeDra) -> list[dict[str, Any]]:
    slices = await gateway.list_slices(node=NODE, driver=DRIVER)
    return sorted(slices, key=lambda s: str(s["metadata"]["name"]))


async def test_one_pool_one_device_per_gpu_with_consumable_capacity(
    api: ApiServer, kubeconfig: Path
) -> None:
    async with publisher(kubeconfig) as (slices, gateway):
        assert (await slices.publish(NODE, inventory(health={1: "unhealthy"}))).ok
        (published,) = await stored(gateway)
    spec = published["spec"]
    assert published["metadata"]["name"] == slice_name(NODE, 0)
    assert (spec["driver"], spec["nodeName"]) == (DRIVER, NODE)
    assert spec["pool"] == {"name": NODE, "generation": 0, "resourceSliceCount": 1}
    healthy, sick = spec["devices"]
    assert healthy["name"] == "gpu-0" and healthy["allowMultipleAllocations"] is True
    assert healthy["attributes"] == {
        "uuid": {"string": wire.uuid_of(0)},
        "model": {"string": "A100"},
        "index": {"int": 0},
        "memoryMiB": {"int": 81559},
        "resource.kubernetes.io/numaNode": {"int": 0},
        "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:3a"},
    }
    # 81,559 MiB is no multiple of the 256 MiB step: the range ends at the last one, 81,408.
    assert healthy["capacity"]["memory"] == {
        "value": "81559Mi",
        "requestPolicy": {
            "default": "81408Mi",
            "validRange": {"min": "512Mi", "max": "81408Mi", "step": "256Mi"},
        },
    }
    assert healthy["capacity"]["compute"]["requestPolicy"]["validRange"] == {
        "min": "1",
        "max": "100",
        "step": "1",
    }
    assert "taints" not in healthy
    assert sick["taints"] == [
        {"key": UNHEALTHY_TAINT, "value": "unhealthy", "effect": "NoSchedule"}
    ]
    (planned,) = plan_slices(NODE, inventory(health={1: "unhealthy"}), [], policy=POLICY).create
    kubernetes_validate.validate(planned, K8S_VERSION, strict=True)


async def test_the_pool_generation_rises_only_when_the_devices_change(
    api: ApiServer, kubeconfig: Path
) -> None:
    async with publisher(kubeconfig) as (slices, gateway):
        await slices.publish(NODE, inventory(health={1: "unhealthy"}))
        writes = len(api.writes_to("resourceslices"))
        assert (await slices.publish(NODE, inventory(health={1: "unhealthy"}))).ok
        assert len(api.writes_to("resourceslices")) == writes  # nothing changed, nothing sent
        await slices.publish(NODE, inventory())  # healthy again: the taint goes
        (published,) = await stored(gateway)
        assert published["spec"]["pool"]["generation"] == 1
        assert all("taints" not in d for d in published["spec"]["devices"])


async def test_a_large_tainted_pool_is_split_within_the_api_limits(
    api: ApiServer, kubeconfig: Path
) -> None:
    async with publisher(kubeconfig) as (slices, gateway):
        assert (await slices.publish(NODE, inventory(70, memory_mib=16384, health={0: "gone"}))).ok
        first, second = await stored(gateway)
        assert len(first["spec"]["devices"]) == MAX_DEVICES_WITH_TAINTS
        assert len(second["spec"]["devices"]) == 70 - MAX_DEVICES_WITH_TAINTS
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in (first, second)} == {2}
        assert (await slices.publish(NODE, inventory(3, memory_mib=16384))).ok
        (only,) = await stored(gateway)
        assert only["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
        assert (await slices.publish(NODE, None)).ok
        assert await stored(gateway) == []


async def test_a_slice_the_api_refuses_is_an_answer_not_an_exception(
    api: ApiServer, kubeconfig: Path
) -> None:
    async with publisher(kubeconfig) as (slices, _):
        bad = msgspec.structs.replace(inventory(1), node="Not_A_Node")
        answer = await slices.publish("Not_A_Node", bad)
        assert answer.code == 422, answer
        assert "is invalid" in answer.message


def test_slice_names_fit_the_api_for_any_node_name() -> None:
    long = "n" * 250
    assert len(slice_name(long, 0)) <= 253
    assert slice_name(long, 0) != slice_name(long[:-1] + "m", 0)


def test_plans_are_quiet_about_an_unchanged_pool() -> None:
    first = plan_slices(NODE, inventory(), [], policy=POLICY)
    (created,) = first.create
    created["metadata"]["resourceVersion"] = "7"
    again = plan_slices(NODE, inventory(), [created], policy=POLICY)
    assert again.empty
    other_policy = plan_slices(NODE, inventory(), [created], policy=MemoryPolicy(step_mib=1))
    (replaced,) = other_policy.replace
    assert replaced["metadata"]["resourceVersion"] == "7"
    assert replaced["spec"]["pool"]["generation"] == 1


@pytest.mark.parametrize(
    ("labels", "dra"),
    [({}, False), ({"tessera.dev/gpu-api": "dra"}, True), ({"tessera.dev/gpu-api": "x"}, False)],
)
def test_which_nodes_offer_their_gpus_through_dra(labels: dict[str, str], dra: bool) -> None:
    assert dra_node(labels) is dra
