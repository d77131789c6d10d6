"""Tessera as a DRA driver, end to end: real nats-server, real ``tessera`` processes (binder in
DRA mode, placers, an inventory and a DRA node plugin per node) and the simulated cluster's claim
controller and kubelets, which prepare each claim through the plugin's gRPC and resolve its CDI
spec into the containers' environment.

One system serves the whole module (each test in its own namespace, cleared at its end); every
test checks each container's environment against its claim's ``status.allocation`` and that no
GPU is over-committed (``LocalSystem.summary``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from shared.dra.devices import DRIVER
from tessera.devcluster.resources import (
    POD,
    RESOURCE_CLAIM,
    RESOURCE_SLICE,
)
from tessera.up import command, dramix, drareport
from tessera.up import workload as w
from tessera.up.spec import plan_nodes
from tessera.up.system import LocalSystem, SystemOptions
from tests.e2e.helpers import (
    by_name,
    clear,
    envs_of,
    gpus_of,
    pending_message,
    phase,
    pods_of,
    settle,
    started,
    until,
)

pytestmark = [pytest.mark.asyncio(loop_scope="package"), pytest.mark.timeout(240)]

Obj = dict[str, Any]
NODES = (
    "dra-a100=4xA100-80GB:api=dra,"
    "dra-h100=2xH100-80GB:api=dra,"
    "dra-l4=4xL4-24GB:api=dra,"
    "dra-sick=2xA10-24GB:api=dra"
)
SICK_GPU = 0
"""dra-sick's GPU that fails (an XID 79 on the inventory's first read)."""
QUOTA = {"quotas": [{"tenant": "dra-quota", "gpus": 1}]}


def model(name: str) -> str:
    return f'device.attributes["{DRIVER}"].model.startsWith("{name}-")'


@pytest_asyncio.fixture(scope="module", loop_scope="package")
async def dra(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalSystem]:
    run_dir: Path = tmp_path_factory.mktemp("e2e-dra")
    tenancy = run_dir / "tenancy.json"
    tenancy.write_text(json.dumps(QUOTA))
    sick = run_dir / "dra-sick.json"
    sick.write_text(
        json.dumps(
            {
                "gpus": [{"model": "A10-24GB", "memory_mib": 24576, "count": 2}],
                "events": [{"gpu": SICK_GPU, "at_read": 1, "xid": 79}],
            }
        )
    )
    async with started(
        SystemOptions(
            nodes=plan_nodes(NODES),
            run_dir=run_dir,
            placers=2,
            dashboard=False,
            webhook=False,
            tenancy_file=str(tenancy),
            fake_specs={"dra-sick": sick},
            # The sick GPU stays unhealthy for the module, however slow the machine.
            inventory_args=("--health-probe-period-s", "3600"),
            ready_timeout_s=150.0,
        )
    ) as local:
        yield local


def submit(system: LocalSystem, namespace: str, objects: Sequence[Obj]) -> None:
    """Into ``namespace``, as ``tessera up`` submits a workload (templates, claims, pods)."""
    said: list[str] = []
    placed = [{**obj, "metadata": {**obj["metadata"], "namespace": namespace}} for obj in objects]
    assert command.submit(system, placed, say=said.append) == 0, said


def claim_of(system: LocalSystem, pod: Obj, name: str = "gpu") -> Obj:
    namespace = pod["metadata"]["namespace"]
    current = system.cluster.api.get(POD, namespace, pod["metadata"]["name"])
    claim = drareport.pod_claim_name(current, name)
    assert claim, f"{pod['metadata']['name']} has no claim {name} yet"
    return system.cluster.api.get(RESOURCE_CLAIM, namespace, claim)


def devices(claim: Obj) -> list[tuple[str, str]]:
    """(pool, device) of each result of the claim's allocation."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [(r["pool"], r["device"]) for r in allocation["devices"]["results"]]


def check(system: LocalSystem, pods: Sequence[Obj]) -> None:
    """Every container holds what its claim's allocation says; no GPU over-committed."""
    current = [
        system.cluster.api.get(POD, p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods
    ]
    summary = system.summary(current)
    assert summary.mismatches == [], summary.mismatches
    assert summary.overcommits == [], summary.overcommits


async def test_slices_whole_gpus_and_a_two_gpu_claim_on_one_node(dra: LocalSystem) -> None:
    ns = "dra-shapes"
    a100 = model("A100")
    submit(
        dra,
        ns,
        [
            dramix.template("whole", selector=a100),
            dramix.template("pair", count=2, distinct=True, selector=a100),
            dramix.template("slice", memory="8Gi", compute="25", selector=a100),
            dramix.claim_pod("whole", [dramix.claimed("main")], {"gpu": "whole"}),
            dramix.claim_pod("pair", [dramix.claimed("main")], {"gpu": "pair"}),
            *(
                dramix.claim_pod(f"slice-{i}", [dramix.claimed("main")], {"gpu": "slice"})
                for i in range(4)
            ),
        ],
    )
    pods = by_name(await settle(dra, ns, 6))
    assert {n: phase(p) for n, p in pods.items()} == dict.fromkeys(pods, "Running"), [
        pending_message(p) for p in pods.values()
    ]
    # The node's slice: one device per GPU, shareable, memory and compute as capacities.
    (published,) = [
        s for s in dra.cluster.api.objects(RESOURCE_SLICE) if s["spec"]["nodeName"] == "dra-a100"
    ]
    assert published["spec"]["driver"] == DRIVER
    assert [d["name"] for d in published["spec"]["devices"]] == [f"gpu-{i}" for i in range(4)]
    assert all(d["allowMultipleAllocations"] for d in published["spec"]["devices"])
    assert published["spec"]["devices"][0]["capacity"]["memory"]["value"] == "80Gi"
    whole = envs_of(dra, pods["whole"])["main"]
    assert (whole["TESSERA_GPU_MEMORY_LIMIT_MIB"], whole["TESSERA_GPU_CORES"]) == ("81920", "100")
    (whole_gpu,) = gpus_of(dra, pods["whole"])
    pair = gpus_of(dra, pods["pair"])
    assert len(set(pair)) == 2 and whole_gpu not in pair
    assert len(set(devices(claim_of(dra, pods["pair"])))) == 2
    sliced = [gpus_of(dra, pods[f"slice-{i}"])[0] for i in range(4)]
    assert whole_gpu not in sliced  # a whole GPU is held exclusively
    result = claim_of(dra, pods["slice-0"])["status"]["allocation"]["devices"]["results"][0]
    assert result["consumedCapacity"] == {"memory": "8Gi", "compute": "25"}
    assert result["shareID"]
    check(dra, list(pods.values()))
    await clear(dra, ns)


async def test_a_claim_shared_by_two_pods_gives_both_the_same_devices(dra: LocalSystem) -> None:
    ns = "dra-shared"
    claim: Obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "shared"},
        "spec": dramix.template("x", memory="12Gi", compute="40")["spec"]["spec"],
    }
    both = []
    for name in ("reader", "writer"):
        made = w.pod(name, [dramix.claimed("main")])
        made["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "shared"}]
        both.append(made)
    submit(dra, ns, [claim, *both])
    pods = by_name(await settle(dra, ns, 2))
    assert phase(pods["reader"]) == phase(pods["writer"]) == "Running"
    assert pods["reader"]["spec"]["nodeName"] == pods["writer"]["spec"]["nodeName"]
    assert envs_of(dra, pods["reader"]) == envs_of(dra, pods["writer"])
    held = dra.cluster.api.get(RESOURCE_CLAIM, ns, "shared")
    assert len(devices(held)) == 1
    assert sorted(r["name"] for r in held["status"]["reservedFor"]) == ["reader", "writer"]
    check(dra, list(pods.values()))  # held once: 12 GiB, not 24
    await clear(dra, ns)


async def test_a_cel_model_selector_and_a_claim_over_quota(dra: LocalSystem) -> None:
    submit(
        dra,
        "dra-models",
        [
            dramix.template("h100", memory="10Gi", compute="10", selector=model("H100")),
            dramix.template("b200", memory="10Gi", compute="10", selector=model("B200")),
            dramix.claim_pod("on-h100", [dramix.claimed("main")], {"gpu": "h100"}),
            dramix.claim_pod("nowhere", [dramix.claimed("main")], {"gpu": "b200"}),
        ],
    )
    submit(
        dra,
        "dra-quota",  # quota: 1 GPU
        [
            dramix.template("one", memory="4Gi", compute="10"),
            *(
                dramix.claim_pod(f"q-{i}", [dramix.claimed("main")], {"gpu": "one"})
                for i in range(2)
            ),
        ],
    )
    models = by_name(await settle(dra, "dra-models", 2))
    assert phase(models["on-h100"]) == "Running"
    assert models["on-h100"]["spec"]["nodeName"] == "dra-h100"
    assert phase(models["nowhere"]) == "Pending"
    said = pending_message(models["nowhere"])
    assert f"no GPU model here meets selector {model('B200')!r}" in said, said
    assert claim_of(dra, models["nowhere"]).get("status", {}).get("allocation") is None
    quota = await settle(dra, "dra-quota", 2)
    assert sorted(phase(p) for p in quota) == ["Pending", "Running"]
    waiting = next(p for p in quota if phase(p) == "Pending")
    assert "quota" in pending_message(waiting).lower(), pending_message(waiting)
    assert "allocation" not in claim_of(dra, waiting).get("status", {})
    claims = [
        c for ns in ("dra-models", "dra-quota") for c in dra.cluster.api.objects(RESOURCE_CLAIM, ns)
    ]
    counted = drareport.claim_counts(claims)
    assert counted == {"total": 4, "allocated": 2, "reserved": 2, "pending": 2}
    check(dra, [models["on-h100"], *quota])
    for ns in ("dra-models", "dra-quota"):
        await clear(dra, ns)


async def test_selectors_on_a_gpu_s_index_and_memory(dra: LocalSystem) -> None:
    ns = "dra-attributes"
    on = f'device.attributes["{DRIVER}"]'
    submit(
        dra,
        ns,
        [
            # GPU 3 with 40 GB or more: only dra-a100's (dra-l4's GPU 3 has 24 GB).
            dramix.template(
                "third",
                memory="8Gi",
                compute="10",
                selector=f"{on}.index == 3 && {on}.memoryMiB >= 40000",
            ),
            dramix.template("ninth", memory="8Gi", compute="10", selector=f"{on}.index == 9"),
            dramix.claim_pod("on-third", [dramix.claimed("main")], {"gpu": "third"}),
            dramix.claim_pod("nowhere", [dramix.claimed("main")], {"gpu": "ninth"}),
        ],
    )
    pods = by_name(await settle(dra, ns, 2))
    assert phase(pods["on-third"]) == "Running"
    assert devices(claim_of(dra, pods["on-third"])) == [("dra-a100", "gpu-3")]
    assert phase(pods["nowhere"]) == "Pending"
    message = pending_message(pods["nowhere"])
    assert f"no GPU meets selector '{on}.index == 9'" in message, message
    check(dra, [pods["on-third"]])
    await clear(dra, ns)


async def test_an_unhealthy_gpu_is_tainted_and_not_used(dra: LocalSystem) -> None:
    ns = "dra-sick"

    def tainted() -> list[str]:
        (published,) = [
            s
            for s in dra.cluster.api.objects(RESOURCE_SLICE)
            if s["spec"]["nodeName"] == "dra-sick"
        ]
        return [d["name"] for d in published["spec"]["devices"] if d.get("taints")]

    assert await until(tainted, what="the sick GPU tainted") == [f"gpu-{SICK_GPU}"]
    (taint,) = next(
        d
        for d in next(
            s
            for s in dra.cluster.api.objects(RESOURCE_SLICE)
            if s["spec"]["nodeName"] == "dra-sick"
        )["spec"]["devices"]
        if d.get("taints")
    )["taints"]
    assert taint["effect"] == "NoSchedule"
    submit(
        dra,
        ns,
        [
            dramix.template("a10", selector=model("A10")),
            *(
                dramix.claim_pod(f"w-{i}", [dramix.claimed("main")], {"gpu": "a10"})
                for i in range(2)
            ),
        ],
    )
    pods = await settle(dra, ns, 2)
    assert sorted(phase(p) for p in pods) == ["Pending", "Running"], [
        devices(claim_of(dra, p)) for p in pods
    ]
    running = next(p for p in pods if phase(p) == "Running")
    assert devices(claim_of(dra, running)) == [("dra-sick", f"gpu-{1 - SICK_GPU}")]
    check(dra, pods)
    await clear(dra, ns)


async def test_a_deleted_pod_s_claim_is_deallocated_and_its_gpu_free_again(
    dra: LocalSystem,
) -> None:
    ns = "dra-delete"
    h100 = dramix.template("h100", selector=model("H100"))
    submit(
        dra,
        ns,
        [
            h100,
            *(
                dramix.claim_pod(f"d-{i}", [dramix.claimed("main")], {"gpu": "h100"})
                for i in range(3)
            ),
        ],
    )
    pods = by_name(await settle(dra, ns, 3))
    assert sorted(phase(p) for p in pods.values()) == ["Pending", "Running", "Running"]
    gone = next(p for p in pods.values() if phase(p) == "Running")
    claim = claim_of(dra, gone)["metadata"]["name"]
    dra.cluster.api.delete(POD, ns, gone["metadata"]["name"])
    await until(
        lambda: dra.cluster.api.find(RESOURCE_CLAIM, ns, claim) is None,
        what="the deleted pod's claim deallocated and deleted",
    )
    await until(
        lambda: [phase(p) for p in pods_of(dra, ns)] == ["Running", "Running"],
        what="the waiting pod Running on the freed GPU",
    )
    pods = by_name(pods_of(dra, ns))
    check(dra, list(pods.values()))
    await clear(dra, ns)


async def test_a_node_plugin_killed_mid_burst_prepares_nothing_twice(dra: LocalSystem) -> None:
    ns = "dra-burst"
    burst = 16  # 4 L4s, 4 slices of 25 % each: the node full
    submit(
        dra,
        ns,
        [
            dramix.template("l4", memory="4Gi", compute="25", selector=model("L4")),
            *(
                dramix.claim_pod(f"b-{i:02d}", [dramix.claimed("main")], {"gpu": "l4"})
                for i in range(burst)
            ),
        ],
    )
    plugin = "deviceplugin/dra-l4"
    await until(
        lambda: any(phase(p) == "Running" for p in pods_of(dra, ns)), what="the burst started"
    )
    dra.kill(plugin)  # the new process takes a second to start: prepares meanwhile fail
    running_at_kill = sum(phase(p) == "Running" for p in pods_of(dra, ns))
    print(f"{running_at_kill} of {burst} Running when the plugin was killed")
    dra.restart(plugin)
    pods = await settle(dra, ns, burst, timeout=120.0)
    assert [phase(p) for p in pods] == ["Running"] * burst
    # One CDI spec per claim, each claim on its own share: nothing prepared twice.
    kubelet = dra.cluster.kubelets["dra-l4"]
    specs = sorted(kubelet.cdi_dir.glob("*.json"))
    assert len(specs) == burst, specs
    claims = [claim_of(dra, p) for p in pods]
    shares = {r["shareID"] for c in claims for r in c["status"]["allocation"]["devices"]["results"]}
    assert len(shares) == burst
    check(dra, pods)
    await clear(dra, ns)
    assert await until(lambda: not list(kubelet.cdi_dir.glob("*.json")), what="CDI specs removed")
